"""State changed outside the DP step during a run (callbacks, code between steps), not only at its start.

Each write below sets a model variable from the training data (the data's mean): the model would release the
mean exactly, with no noise. The run refuses it, naming the variable, and the optimizer's statement then
gives no guarantee. Weights set back to an epoch's end (post-processing) are accepted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, custom_loop_step, small_data

import tfdpbnn
from tfdpbnn import _keras_version
from tfdpbnn.optimizers.state_checks import WriteWatch

REFUSED = (ValueError, tf.errors.InvalidArgumentError)


class MeanShift(tf.keras.layers.Layer):
    """Subtracts a non-trainable mean (zero unless something sets it)."""

    def build(self, input_shape):
        self.mu = self.add_weight(name="mu", shape=input_shape[-1:], initializer="zeros", trainable=False)

    def call(self, inputs):
        return inputs - self.mu


class At(tf.keras.callbacks.Callback):
    """Runs ``action(model)`` at batch end ``batch`` (or at epoch end ``epoch``)."""

    def __init__(self, action, batch=None, epoch=None):
        super().__init__()
        self.action, self.batch, self.epoch = action, batch, epoch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.action(self.model)

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            self.action(self.model)


def _model(shift=False):
    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.Input((D,))] + ([MeanShift()] if shift else []) + [tf.keras.layers.Dense(3)]
    model = tf.keras.Sequential(layers)
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    return model


def _kernel_from_data(x):
    def action(model):
        kernel = model.layers[-1].kernel
        kernel.assign(np.tile(x.mean(axis=0)[:, None], (1, 3)))
    return action


def _no_guarantee(model, name):
    statement = model.optimizer.privacy_statement()
    assert statement["guarantee"] is False
    assert math.isinf(statement["epsilon"]) and math.isinf(statement["quote"]["epsilon"])
    assert name in statement["guarantee_reason"]
    assert np.isfinite(statement["epsilon_if_state_were_untouched"])


def test_a_weight_written_between_batches_is_refused_by_the_next_step():
    x, y = small_data()
    model = _model()
    with pytest.raises(REFUSED, match="changed outside the DP step"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[At(_kernel_from_data(x), batch=2)])
    assert model.optimizer.steps == 3  # the fourth step, after the write, was refused
    _no_guarantee(model, "kernel")


def test_non_trainable_state_set_from_data_mid_run_is_refused_and_set_back():
    x, y = small_data()
    model = _model(shift=True)
    layer = model.layers[0]
    with pytest.raises(ValueError, match="mu"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                  callbacks=[At(lambda m: layer.mu.assign(x.mean(axis=0)), epoch=0)])
    np.testing.assert_array_equal(layer.mu.numpy(), np.zeros(D, np.float32))  # set back
    _no_guarantee(model, "mu")


def test_non_trainable_state_set_around_each_batch_is_refused_before_the_step_that_reads_it():
    """Set at a batch's start, undone at its end (from the second batch on): an epoch's end would see the
    old value; the comparison after every callback's ``on_train_batch_begin`` sees the new one."""
    x, y = small_data()
    model = _model(shift=True)
    layer = model.layers[0]

    class Toggle(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch >= 1:
                layer.mu.assign(x.mean(axis=0))

        def on_train_batch_end(self, batch, logs=None):
            layer.mu.assign(np.zeros(D, np.float32))

    with pytest.raises(ValueError, match=r"found before batch 1.*mu"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Toggle()])
    assert model.optimizer.steps == 1  # no step ran with the mean in mu
    np.testing.assert_array_equal(layer.mu.numpy(), np.zeros(D, np.float32))
    _no_guarantee(model, "mu")


def test_non_trainable_state_set_from_data_in_on_train_begin_is_refused_before_the_first_step():
    """A callback's ``on_train_begin`` runs after the run's start checked the layer: checked after it too."""
    x, y = small_data()
    model = _model(shift=True)
    layer = model.layers[0]

    class Begin(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            layer.mu.assign(x.mean(axis=0))

    with pytest.raises(ValueError, match=r"'mu:0'|mu.*differs from the layer's initial value"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Begin()])
    assert model.optimizer.steps == 0


def test_a_weight_written_after_the_last_step_is_refused_at_the_end_of_fit():
    x, y = small_data()
    model = _model()
    with pytest.raises(ValueError, match="after the last DP step"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[At(_kernel_from_data(x), epoch=1)])
    _no_guarantee(model, "kernel")


def test_weights_set_back_to_an_epoch_end_are_accepted():
    x, y = small_data()
    model = _model()
    kept = {}

    class KeepAndRestore(tf.keras.callbacks.Callback):  # as EarlyStopping(restore_best_weights=True)
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                kept["weights"] = model.get_weights()
            if epoch == 2:
                model.set_weights(kept["weights"])

    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[KeepAndRestore()])
    statement = model.optimizer.privacy_statement()
    assert statement["guarantee"] is True and np.isfinite(statement["epsilon"])
    # Weights written between two runs are refused at the next run's start, as after a run
    # (tests/test_redteam_cases.py), unless asserted to use no private data.
    model.layers[-1].kernel.assign(model.layers[-1].kernel * 0.5)
    model.optimizer.assert_post_processing("the kernel halved: no data used")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert model.optimizer.privacy_statement()["guarantee"] is True


def test_a_custom_loop_write_between_steps_is_refused():
    x, y = small_data()
    model = _model()
    step = custom_loop_step(model, x, y)

    step(x[:8], y[:8])
    step(x[8:16], y[8:16])
    model.layers[-1].bias.assign(tf.constant(x[:3, 0]))
    with pytest.raises(REFUSED, match="bias"):
        step(x[16:24], y[16:24])
    _no_guarantee(model, "bias")


# ------------------------------------------------------------------ writes a sum of squares does not see
def _neighbour(x):
    """``x`` with its first row replaced (a replace-one neighbour) by a row far from the others."""
    other = x.copy()
    other[0] = [40.0, -40.0, 0.0, 0.0]
    return other


def _permute_rows(x):  # the kernel's rows sorted by the data's feature means
    return lambda kernel: tf.gather(kernel, np.argsort(x.mean(axis=0)))


def _flip_signs(x):  # the sign of each row set by the sign of the data's feature mean
    return lambda kernel: kernel * np.where(x.mean(axis=0) > 0, 1.0, -1.0)[:, None].astype(np.float32)


def _swap_two_rows(x):  # rows 0 and 1 swapped when feature 1's mean exceeds feature 0's
    def write(kernel):
        means = x.mean(axis=0)
        return tf.gather(kernel, [1, 0, 2, 3]) if means[1] > means[0] else tf.convert_to_tensor(kernel)
    return write


@pytest.mark.parametrize("write", [_permute_rows, _flip_signs, _swap_two_rows])
def test_a_write_that_keeps_the_sums_of_squares_is_seen_by_the_next_step(write):
    x, _ = small_data()
    tf.keras.utils.set_random_seed(0)
    kernel = tf.Variable(tf.random.normal([D, 3]), name="kernel")
    # The truth, independently: the write is a deterministic function of the data that differs between
    # neighbouring data sets, and keeps the kernel's sum of squares (so a sum-of-squares check cannot see it).
    mine, theirs = np.asarray(write(x)(kernel.numpy())), np.asarray(write(_neighbour(x))(kernel.numpy()))
    assert not np.array_equal(mine, theirs)  # no noise: the two data sets are told apart, no epsilon holds
    np.testing.assert_allclose(np.sum(np.square(mine)), np.sum(np.square(kernel.numpy())), rtol=1e-6)
    watch, iterations = WriteWatch(), tf.Variable(0, dtype=tf.int64)
    watch.new_run([kernel])

    @tf.function
    def step():  # what a DP optimizer's apply_gradients does around its update
        with tf.control_dependencies(watch.before_write([kernel], iterations)):
            kernel.assign_sub(0.01 * tf.ones_like(kernel))
            iterations.assign_add(1)
        watch.after_write([kernel], iterations)

    step()
    step()
    kernel.assign(write(x)(kernel))
    with pytest.raises(tf.errors.InvalidArgumentError, match="kernel"):
        step()
    assert int(iterations.numpy()) == 2 and watch.written() == [kernel.name]


def test_a_permutation_of_a_kernel_between_batches_is_refused():
    x, y = small_data()
    model = _model()

    def action(m):
        m.layers[-1].kernel.assign(_permute_rows(x)(m.layers[-1].kernel))

    with pytest.raises(REFUSED, match="changed outside the DP step"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[At(action, batch=2)])
    assert model.optimizer.steps == 3
    _no_guarantee(model, "kernel")


class AtEnd(tf.keras.callbacks.Callback):
    """Runs ``action(model)`` in ``on_train_end``."""

    def __init__(self, action):
        super().__init__()
        self.action = action

    def on_train_end(self, logs=None):
        self.action(self.model)


def test_a_weight_written_in_on_train_end_is_refused():
    x, y = small_data()
    model = _model()
    with pytest.raises(ValueError, match="after the last DP step"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[AtEnd(_kernel_from_data(x))])
    np.testing.assert_allclose(model.layers[-1].kernel.numpy()[:, 0], x.mean(axis=0), rtol=1e-6)
    _no_guarantee(model, "kernel")


def test_weights_restored_to_an_epoch_end_in_on_train_end_are_accepted():
    x, y = small_data()
    model = _model()
    kept = {}

    class RestoreAtEnd(tf.keras.callbacks.Callback):  # Keras 3's EarlyStopping restores in on_train_end
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                kept["weights"] = model.get_weights()

        def on_train_end(self, logs=None):
            model.set_weights(kept["weights"])

    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[RestoreAtEnd()])
    np.testing.assert_array_equal(model.layers[-1].kernel.numpy(), kept["weights"][0])
    assert model.optimizer.privacy_statement()["guarantee"] is True


def _frozen_model():
    tf.keras.utils.set_random_seed(0)
    frozen = tf.keras.layers.Dense(D, trainable=False)
    model = tf.keras.Sequential([tf.keras.Input((D,)), frozen, tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    return model, frozen


@pytest.mark.parametrize("which", ["frozen kernel", "non-trainable mean"])
def test_state_changed_between_train_on_batch_calls_is_refused(which):
    x, y = small_data()
    if which == "frozen kernel":
        model, frozen = _frozen_model()
        variable, name = frozen.kernel, "kernel"
    else:
        model = _model(shift=True)
        variable, name = model.layers[0].mu, "mu"
    model.train_on_batch(x[:8], y[:8])
    mean = x.mean(axis=0)
    variable.assign(np.tile(mean[:, None], (1, D)) if which == "frozen kernel" else mean)
    with pytest.raises(ValueError, match=name):
        model.train_on_batch(x[8:16], y[8:16])
    assert model.optimizer.steps == 1
    _no_guarantee(model, name)


def test_state_changed_between_custom_loop_steps_is_refused():
    x, y = small_data()
    model = _model(shift=True)
    opt = model.optimizer
    step = custom_loop_step(model, x, y)

    step(x[:8], y[:8])
    model.layers[0].mu.assign(x.mean(axis=0))
    with pytest.raises(REFUSED, match="mu"):
        step(x[8:16], y[8:16])
    assert opt.steps == 1
    _no_guarantee(model, "mu")


def test_a_write_is_refused_under_xla():
    x, y = small_data()
    model = _model()
    model.compile(optimizer=model.optimizer, loss=LOSS, jit_compile=True)
    with pytest.raises(REFUSED, match="changed outside the DP step"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[At(_kernel_from_data(x), batch=2)])
    assert model.optimizer.steps <= 4  # the step after the write ran (XLA dropped its assertion), no more
    _no_guarantee(model, "kernel")
    # The next run's start takes the flag into the record and clears it (the watch's flags have no static
    # shape): that run's steps run, and the statement stays void.
    steps = model.optimizer.steps
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert model.optimizer.steps == steps + N // 8
    flags = [tf.convert_to_tensor(f).numpy() for _, f in model.optimizer._dp_write_watch._flag_sets()
             if f is not None]
    assert flags and not any(np.any(f) for f in flags)
    _no_guarantee(model, "kernel")


@pytest.mark.slow  # XLA compiles the step (about 6 s); the fit under XLA above stays in the fast tier
def test_a_custom_loop_write_under_xla_voids_the_statement():
    x, y = small_data()
    model = _model()
    opt = model.optimizer
    opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="per-example cross-entropy")

    @tf.function(jit_compile=True)
    def step(xb, yb):
        opt.minimize(lambda: LOSS.__class__(from_logits=True, reduction="none")(yb, model(xb, training=True)),
                     model.trainable_variables)

    step(x[:8], y[:8])
    assert model.optimizer.privacy_statement()["guarantee"] is True
    model.layers[-1].bias.assign(tf.constant(x[:3, 0]))
    step(x[8:16], y[8:16])  # XLA dropped the step's assertion: it ran, and its flag was set
    assert opt.steps == 2
    _no_guarantee(model, "bias")


@pytest.mark.slow  # three fits
@pytest.mark.skipif(_keras_version.KERAS_MAJOR == 3, reason="Keras 3's reused step still updates the layer "
                    "made non-trainable: the first batch's check refuses the second fit before any write")
def test_a_write_after_the_trainable_set_changed_still_voids_the_statement():
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(D), tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.layers[0].trainable = False  # a new set of trainable variables; the step traced before stays
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # nothing written outside the steps: accepted
    assert model.optimizer.privacy_statement()["guarantee"] is True
    with pytest.raises(REFUSED, match="changed outside the DP step"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[At(_kernel_from_data(x), batch=2)])
    _no_guarantee(model, "kernel")
