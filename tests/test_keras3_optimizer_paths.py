"""Keras 3 paths around a DP optimizer that used to print an epsilon no run had (64 records, B = 8, sigma 1).

``optimizer.apply(grads, variables)``, which Keras 3's ``apply_gradients`` calls and which a custom loop or
a ``train_step`` override in the Keras 3 idiom calls directly, applied any gradients, past the DP
optimizer's check that they are its mechanism's release and past the write watch: the statement said
``guarantee: true`` with the epsilon of the releases counted (16.51 for 8 custom-loop steps, 7.08 for a
2-pass ``fit``), while the weights carried unclipped, noiseless gradients (no epsilon holds).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, custom_loop_step, gaussians_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn import _keras_version

KERAS_3 = _keras_version.KERAS_MAJOR == 3
needs_keras3 = pytest.mark.skipif(not KERAS_3, reason="Keras 3's optimizer.apply and optimizer.variables")
PER_EXAMPLE = LOSS.__class__(from_logits=True, reduction="none")


def _compiled(model=None, **kwargs):
    model = model if model is not None else small_model()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, **kwargs)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


def _raw_gradients(model, xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(PER_EXAMPLE(yb, model(xb, training=True)))
    return tape.gradient(loss, model.trainable_variables)


@needs_keras3
def test_optimizer_apply_in_a_custom_loop_takes_the_dp_path():
    x, y = small_data()
    model, optimizer = _compiled()
    optimizer.begin_training(model, x, y, batch_size=8, assert_per_example_loss="per-example cross-entropy")
    for i in range(8):  # the Keras 3 idiom with the mechanism's release: trained and counted
        xb, yb = x[8 * i:8 * (i + 1)], y[8 * i:8 * (i + 1)]
        released = optimizer.mechanism.privatize_model(model, xb, yb,
                                                       loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
        optimizer.apply(released.gradients, model.trainable_variables)
    truth = gaussians_epsilon(1.0, 8)  # 8 steps, each one participation of every example
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)
    # Raw gradients through optimizer.apply: refused as apply_gradients refuses them (before: applied, 16.51).
    optimizer.mechanism.privatize_model(model, x[:8], y[:8], loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
    before = [v.numpy().copy() for v in model.trainable_variables]
    with pytest.raises(ValueError, match="grads_and_vars: the gradients for"):
        optimizer.apply(_raw_gradients(model, x[:8], y[:8]), model.trainable_variables)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables, strict=True))


@needs_keras3
def test_optimizer_apply_of_raw_gradients_in_a_train_step_override_is_refused():
    import keras

    class RawApply(keras.Sequential):
        def train_step(self, data):
            xb, yb = data
            released = self.optimizer.mechanism.privatize_model(self, xb, yb,
                                                                loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
            del released  # released (counted), then raw gradients applied: 7.08 with guarantee true before
            self.optimizer.apply(_raw_gradients(self, xb, yb), self.trainable_variables)
            return {"done": tf.constant(0.0)}

    x, y = small_data()
    model, optimizer = _compiled(RawApply([keras.Input((x.shape[1],)), keras.layers.Dense(3)]))
    with pytest.raises(ValueError, match="grads_and_vars: the gradients for"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert optimizer._dp_writes() == 0  # no weight was updated


class _WriteBookkeeping(tf.keras.callbacks.Callback):
    """Before batch 3 of every epoch, sets one of the optimizer's dp_* variables (Keras 3 lists them in
    ``optimizer.variables``) to ``value``; with ``data_mean``, also writes the bias from the data first."""

    def __init__(self, name, value, data_mean=None):
        super().__init__()
        self.name, self.value, self.data_mean = name, value, data_mean

    def on_train_batch_begin(self, batch, logs=None):
        if batch != 3:
            return
        if self.data_mean is not None:
            self.model.layers[-1].bias.assign(tf.constant(self.data_mean[:3]))
        for variable in self.model.optimizer.variables:
            if variable.path.endswith("/" + self.name):
                variable.assign(self.value(variable) if callable(self.value) else
                                tf.cast(tf.fill(variable.shape, self.value), variable.dtype))


@needs_keras3
@pytest.mark.parametrize("name, value, printed_before", [
    ("dp_ledger_open_examples", 0.0, gaussians_epsilon(1.0, 1)),   # 4 passes stated as 1: 4.73
    ("dp_ledger_open_steps", 0.0, None),
])
def test_the_ledger_written_through_optimizer_variables_is_set_back_and_voids_the_guarantee(
        name, value, printed_before):
    x, y = small_data()
    model, optimizer = _compiled()
    truth = gaussians_epsilon(1.0, 4)  # 4 passes ran: 10.73
    message = rf"optimizer.variables: the privacy bookkeeping variable\(s\) \['{name}'\] were written"
    with pytest.raises(ValueError, match=message + r" during fit \(found at the end of epoch 0"):
        model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[_WriteBookkeeping(name, value)])
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])
    # Set back: the ledger counts the epoch that ran (8 steps, one pass), not the written value.
    assert optimizer.ledger.steps == 8
    assert optimizer.ledger.phases[-1].examples == N
    if printed_before is not None:
        assert truth > printed_before + 5


@needs_keras3
def test_a_weight_written_with_the_count_of_dp_writes_set_back_voids_the_guarantee():
    x, y = small_data()
    model, optimizer = _compiled()
    write = _WriteBookkeeping("dp_write_count", lambda v: v - 1.0, data_mean=x.mean(axis=0))
    with pytest.raises(ValueError, match=r"\['dp_write_count'\] were written during fit"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[write])   # 7.08, guarantee true before
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])


@needs_keras3
@pytest.mark.parametrize("how", ["checkpoint", "load_weights"])
def test_an_optimizer_restored_mid_fit_counts_every_step_that_ran(how, tmp_path):
    x, y = small_data()
    model, optimizer = _compiled()

    class RestoreAtEpoch2(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0 and how == "checkpoint":
                self.path = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer).write(
                    str(tmp_path / "ckpt"))
            elif epoch == 0:
                self.model.save_weights(str(tmp_path / "epoch1.weights.h5"))

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2 and how == "checkpoint":
                tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer).read(self.path)
            elif epoch == 2:
                self.model.load_weights(str(tmp_path / "epoch1.weights.h5"))

    truth = gaussians_epsilon(1.0, 4)  # 4 passes ran (the second before the restore too): 10.73
    if how == "load_weights":  # seen by Keras 3's load_own_variables: the rewound pass is counted
        model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[RestoreAtEpoch2()])
        statement = optimizer.privacy_statement()
        assert statement["guarantee"] is True
        assert statement["run_epsilon"] >= truth * (1 - 1e-6)
        return
    # tf.train.Checkpoint sets the ledger back unseen: 9.01 (3 passes) was printed before.
    with pytest.raises(ValueError, match=r"dp_ledger_open_steps.*were written during fit \(found at the end "
                                         r"of epoch 2"):
        model.fit(x, y, batch_size=8, epochs=4, verbose=0, callbacks=[RestoreAtEpoch2()])
    assert optimizer.ledger.steps == 24  # every step that ran: set back to the DP steps' own count
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])


@needs_keras3
@pytest.mark.parametrize("swap_on_epoch", [False, True])
def test_swap_ema_weights_around_validation_trains_and_states_the_passes(swap_on_epoch):
    import keras

    x, y = small_data()
    model = small_model()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=48, batch_size=8, delta=DELTA, use_ema=True)
    model.compile(optimizer=optimizer, loss=LOSS)
    # Keras swaps by additions (a + b - b): the weights came back off by rounding and the next DP step
    # failed with InvalidArgumentError (a false refusal: the averages are post-processing of the DP writes).
    model.fit(x[:48], y[:48], batch_size=8, epochs=3, verbose=0, validation_data=(x[48:], y[48:]),
              callbacks=[keras.callbacks.SwapEMAWeights(swap_on_epoch=swap_on_epoch)])
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=1e-6)


def test_a_compute_loss_override_that_the_dp_step_would_ignore_is_refused():
    x, y = small_data()

    class OwnLoss(tf.keras.Sequential):  # Keras's hook for a loss of one's own; dp_train_step never calls it
        def compute_loss(self, *args, **kwargs):
            raise AssertionError("not reached")

    model, optimizer = _compiled(OwnLoss([tf.keras.Input((x.shape[1],)), tf.keras.layers.Dense(3)]))
    with pytest.raises(ValueError, match="compute_loss: OwnLoss overrides Model.compute_loss, which the DP"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # trained the compiled loss silently before
    with pytest.raises(ValueError, match="compute_loss: OwnLoss overrides Model.compute_loss"):
        model.train_on_batch(x[:8], y[:8])
    assert optimizer.ledger.steps == 0


def test_pandas_data_trains_and_names_the_same_records_as_arrays():
    pd = pytest.importorskip("pandas")
    x, y = small_data()
    model, optimizer = _compiled()
    # A DataFrame and a Series (Keras takes them): the checks read .dtype of the data and crashed before.
    model.fit(pd.DataFrame(x), pd.Series(y), batch_size=8, epochs=2, verbose=0)
    assert optimizer.privacy_statement()["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=1e-6)
    model.train_on_batch(pd.DataFrame(x[:8]), pd.Series(y[:8]))
    # The same rows as numpy arrays are the same records: one more pass composes the 2 passes and the call.
    fresh, fresh_optimizer = _compiled()
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)
    bound = fresh_optimizer.privacy_statement()["ledger_bound"]["epsilon"]
    assert bound == pytest.approx(gaussians_epsilon(1.0, 4), rel=1e-6)   # rows 0..7: 2 + 1 + 1


def _set_optimizer_variable(optimizer, name, value):
    for variable in optimizer.variables:
        if variable.path.endswith("/" + name):
            variable.assign(value(variable) if callable(value) else
                            tf.cast(tf.fill(variable.shape, value), variable.dtype))


@needs_keras3
def test_the_ledger_written_between_runs_is_set_back():
    x, y = small_data()
    model, optimizer = _compiled()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    _set_optimizer_variable(optimizer, "dp_ledger_open_examples", 0.0)   # 2 passes stated as none before:
    _set_optimizer_variable(optimizer, "dp_ledger_open_steps", 0.0)      # epsilon 0.0, guarantee true
    with pytest.warns(UserWarning, match="optimizer.variables: the privacy ledger's variable"):
        statement = optimizer.privacy_statement()
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=1e-6)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert optimizer.privacy_statement()["quote"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3),
                                                                              rel=1e-6)


@needs_keras3
def test_a_custom_loops_weight_write_with_the_count_of_dp_writes_set_back_voids_the_guarantee():
    x, y = small_data()
    model, optimizer = _compiled()
    step = custom_loop_step(model, x, y)
    for i in range(4):
        step(x[8 * i:8 * (i + 1)], y[8 * i:8 * (i + 1)])
        if i == 1:  # the bias from the data, then the count set back: taken for a restore (10.73 printed)
            model.layers[-1].bias.assign(tf.constant(x.mean(axis=0)[:3]))
            _set_optimizer_variable(optimizer, "dp_write_count", lambda v: v - 1.0)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])


@pytest.mark.parametrize("store", ["on", "off"])
def test_an_optimizer_restored_between_runs_counts_every_step_that_ran(store, tmp_path, monkeypatch):
    if store == "off":
        monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", "off")
    x, y = small_data()
    model, optimizer = _compiled()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(checkpoint)   # the third pass ran
    statement = optimizer.privacy_statement()   # 7.08 before (store off: the quote too)
    assert statement["guarantee"] is True
    assert statement["quote"]["epsilon"] >= statement["run_epsilon"] >= gaussians_epsilon(1.0, 3) * (1 - 1e-6)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)   # store off: 9.01 before, 4 passes ran
    statement = optimizer.privacy_statement()
    assert statement["quote"]["epsilon"] >= statement["run_epsilon"] >= gaussians_epsilon(1.0, 4) * (1 - 1e-6)


@needs_keras3
def test_a_weight_written_with_the_counts_set_back_as_a_restore_sets_them_voids_the_guarantee(tmp_path):
    x, y = small_data()
    model, optimizer = _compiled()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(checkpoint)   # a real restore: accepted
    assert optimizer.privacy_statement()["guarantee"] is True
    # A forged one: a bias from the data, the count of DP writes and the ledger's steps set back by one.
    model.layers[-1].bias.assign(tf.constant(x.mean(axis=0)[:3]))
    _set_optimizer_variable(optimizer, "dp_write_count", lambda v: v - 1.0)
    _set_optimizer_variable(optimizer, "dp_ledger_open_steps", lambda v: v - 1.0)
    statement = optimizer.privacy_statement()   # 7.08 with guarantee true before
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])
