"""The optimizer's own state per weight (a momentum, Adam's moments, Keras 3's EMA averages) is the DP step's.

A callback that sets a momentum slot from the data carries the data into every later update, unclipped and
without noise: the epsilon printed before (7.08 for two passes of 64 records, B = 8, sigma 1, delta 1e-5,
with ``guarantee: true``) held for nothing. Such a write is refused inside the next step, at the next run's
start, or before Keras 3's ``use_ema`` sets the averages into the weights; a restore of the model and its
optimizer together, and ``use_ema`` itself (an average of the DP iterates: post-processing), are accepted.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn import _adapters, _keras_version

KERAS_3 = _keras_version.KERAS_MAJOR == 3


def _compiled(optimizer_class=tfdpbnn.DPSGDOptimizer, **kwargs):
    model = small_model()
    optimizer = optimizer_class(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, **kwargs)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


def _slot(model, name):
    return _adapters.current().optimizer_slot(model.optimizer, model.trainable_variables[0], name)


def _from_the_data(slot, x):
    """A value for ``slot`` computed from the training records (their mean, scaled up)."""
    return tf.fill(slot.shape, tf.cast(100.0 * float(np.mean(x[:, 0])), slot.dtype))


class _WriteSlot(tf.keras.callbacks.Callback):
    """Writes slot ``name`` of the first weight from the data at ``when`` (a hook name) of batch ``batch``."""

    def __init__(self, x, name, when, batch=3):
        super().__init__()
        self.x, self.name, self.when, self.batch = x, name, when, batch

    def _write(self):
        slot = _slot(self.model, self.name)
        slot.assign(_from_the_data(slot, self.x))

    def on_train_begin(self, logs=None):
        if self.when == "on_train_begin":
            self._write()

    def on_train_batch_begin(self, batch, logs=None):
        if self.when == "on_train_batch_begin" and batch == self.batch:
            self._write()


@pytest.mark.parametrize("optimizer_class, kwargs, name", [
    (tfdpbnn.DPSGDOptimizer, {"momentum": 0.9}, "momentum"),
    (tfdpbnn.DPAdamOptimizer, {}, "m"),
    (tfdpbnn.DPAdamOptimizer, {}, "v"),
])
def test_a_slot_written_from_the_data_during_fit_is_refused(optimizer_class, kwargs, name):
    x, y = small_data()
    model, optimizer = _compiled(optimizer_class, **kwargs)
    refused = "changed outside the DP step during DP training"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                  callbacks=[_WriteSlot(x, name, "on_train_batch_begin")])
    assert optimizer.steps == 3  # the fourth step was refused before its update
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False
    assert statement["epsilon"] == float("inf")


def test_a_slot_written_before_the_first_step_is_refused():
    x, y = small_data()
    model, optimizer = _compiled(momentum=0.9)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the slot now holds what the DP steps wrote
    with pytest.raises(tf.errors.InvalidArgumentError, match="momentum"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[_WriteSlot(x, "momentum", "on_train_begin")])
    assert optimizer.steps == 8
    assert optimizer.privacy_statement()["guarantee"] is False


def test_a_slot_written_between_two_runs_is_refused_at_the_next():
    x, y = small_data()
    model, optimizer = _compiled(momentum=0.9)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    slot = _slot(model, "momentum")
    slot.assign(_from_the_data(slot, x))
    with pytest.raises(ValueError, match=r"optimizer: its variable\(s\) \[.*momentum.*changed since its "
                                         r"last DP write"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert optimizer.steps == 8
    assert optimizer.privacy_statement()["guarantee"] is False
    with pytest.raises(ValueError, match="momentum"):  # train_on_batch starts a run the same way
        model.train_on_batch(x[:8], y[:8])


def test_untouched_slots_and_a_restore_of_model_and_optimizer_are_accepted():
    x, y = small_data()
    model, optimizer = _compiled(momentum=0.9)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    saved = checkpoint.write(tempfile.mkdtemp() + "/ckpt")
    slot = _slot(model, "momentum")
    kept = np.array(slot.numpy())
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the slot as the DP steps left it: accepted
    assert not np.allclose(slot.numpy(), kept)
    checkpoint.read(saved).assert_existing_objects_matched()  # weights, slots and counters set back together
    np.testing.assert_allclose(slot.numpy(), kept, rtol=0, atol=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    # Three passes ran (the one after the restore point counted again): dp-accounting's RDP of each record's
    # three Gaussian releases at sigma 1.
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=1e-6)


@pytest.mark.skipif(not KERAS_3, reason="use_ema is a Keras 3 optimizer argument")
def test_use_ema_sets_the_average_of_the_dp_iterates_into_the_weights():
    x, y = small_data()
    model, optimizer = _compiled(use_ema=True)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    averages = _adapters.current().optimizer_state_variables(optimizer)
    for weight, average in zip(model.trainable_variables, averages, strict=True):
        np.testing.assert_allclose(weight.numpy(), average.numpy(), rtol=0, atol=0)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=1e-6)  # two passes


@pytest.mark.skipif(not KERAS_3, reason="use_ema is a Keras 3 optimizer argument")
def test_use_ema_refuses_averages_written_after_the_last_step():
    x, y = small_data()
    model, optimizer = _compiled(use_ema=True)

    class WriteAverage(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                average = _adapters.current().optimizer_state_variables(optimizer)[0]
                average.assign(_from_the_data(average, x))

    with pytest.raises(ValueError, match="before use_ema set the averages into the weights"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[WriteAverage()])
    assert optimizer.privacy_statement()["guarantee"] is False


class _NoiseScaleFromARecord(tf.keras.callbacks.Callback):
    def __init__(self, layer, value):
        super().__init__()
        self.layer, self.value = layer, value

    def on_epoch_end(self, epoch, logs=None):
        self.layer.noise_stddev.assign(self.value)  # a record's feature, saved with the model's weights


def test_a_noisy_layers_noise_scale_written_from_the_data_is_refused_under_dp_sgd():
    # The state a noisy layer names as managed was left out of the checks under any DP optimizer; only
    # SI-DPSGD sets it. Under DP-SGD a callback's write of a record's value left with the model: 4.73 printed,
    # guarantee true, the record's feature exported exactly.
    x, y = small_data()
    layer = tfdpbnn.NoisyDense(3)
    model = tf.keras.Sequential([tf.keras.Input((x.shape[1],)), layer])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=optimizer, loss=LOSS)
    with pytest.raises(ValueError, match="noise_stddev"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[_NoiseScaleFromARecord(layer, float(abs(x[0, 0])))])
    assert float(layer.noise_stddev.numpy()) == 0.0  # set back
    assert optimizer.privacy_statement()["guarantee"] is False
    # SI-DPSGD sets it at every step: its own writes are its state, not a change outside the DP step.
    layer = tfdpbnn.NoisyDense(3)
    model = tf.keras.Sequential([tf.keras.Input((x.shape[1],)), layer])
    optimizer = tfdpbnn.SIDPOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=1e-6)
