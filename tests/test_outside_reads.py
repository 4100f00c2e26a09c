"""A variable the model reads but does not own is part of what the DP step computes.

A global ``tf.Variable`` in a ``Lambda`` (``x - alpha * mean(x)``), trainable or not, set from 0 to 1 makes
the same code mix the examples of a batch: one example's clipped gradient then depends on the others, and
the clip bound no longer bounds the sensitivity (the true epsilon is unbounded). The check runs the model as
it is when it runs, so every such variable is listed with its value (``tfdpbnn.optimizers.outside_reads``,
trainable or not, by tracing the forward pass once); the model is checked again when one has changed by a
run's start, and a change during a run is refused (``fit``: at the epoch's end, set back, ``guarantee``
false; a custom loop: the next step; ``train_on_batch``: the next call). A random generator's state, which
its draws advance at every step, is listed apart and not compared. On Keras 2 and 3.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn.optimizers import outside_reads

N, D, BATCH = 64, 4, 8
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, 3, N).astype(np.int32)


def _centering(alpha):
    """Dense, then ``t - alpha * mean(t)`` over the batch: per example at alpha 0, mixing at alpha 1."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(lambda t: t - alpha * tf.reduce_mean(t, axis=0))])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=N, batch_size=BATCH,
                                       delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


def _weights(model):
    return [w.copy() for w in model.get_weights()]


def _unchanged(model, before):
    for now, then in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, then)


@pytest.mark.parametrize("trainable", [False, True])
def test_a_gate_set_between_fits_is_checked_again_and_refused(trainable, per_example_checks):
    """alpha 0 -> 1 after a fit: the next fit checks the model again and refuses it before any step."""
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=trainable, name="alpha")
    model, optimizer = _centering(alpha)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 1
    alpha.assign(1.0)
    before, steps = _weights(model), optimizer.steps
    with pytest.raises(ValueError, match="mixes examples"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2 and optimizer.steps == steps
    _unchanged(model, before)


def test_a_gate_set_between_fits_to_a_per_example_value_trains_after_a_new_check(per_example_checks):
    """A changed value is not refused by itself: the model is checked with it, and trains when it passes."""
    x, y = _data()
    scale = tf.Variable(1.0, trainable=False, name="scale")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(lambda t: t * scale)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # unchanged: not checked again
    assert len(per_example_checks) == 1
    scale.assign(2.0)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2
    assert optimizer.steps == 3 * N // BATCH and optimizer.privacy_statement()["guarantee"] is True


def test_a_gate_set_by_a_callback_during_fit_is_refused_set_back_and_named():
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    model, optimizer = _centering(alpha)

    class Gate(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                alpha.assign(1.0)

    found = r"'alpha:0'.* changed during DP fit \(found at the end of epoch 0\)"
    with pytest.raises(ValueError, match=found):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[Gate()])
    assert float(alpha.numpy()) == 0.0  # set back  # noqa: PLR2004 - exact: the value assigned
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])


def test_a_gate_set_between_the_steps_of_a_custom_loop_refuses_the_next_step():
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    model, optimizer = _centering(alpha)
    optimizer.begin_training(model, x, y, batch_size=BATCH)
    step = tf.function(lambda a, b: optimizer.dp_train_step(model, (a, b)))
    step(x[:BATCH], y[:BATCH])
    step(x[BATCH:2 * BATCH], y[BATCH:2 * BATCH])
    alpha.assign(1.0)
    before = _weights(model)
    with pytest.raises(tf.errors.InvalidArgumentError, match="changed outside the DP step"):
        step(x[:BATCH], y[:BATCH])
    _unchanged(model, before)


def test_a_gate_set_between_train_on_batch_calls_is_refused():
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    model, optimizer = _centering(alpha)
    model.train_on_batch(x[:BATCH], y[:BATCH])
    alpha.assign(1.0)
    before = _weights(model)
    with pytest.raises(ValueError, match=r"'alpha:0'.* changed between two train_on_batch calls"):
        model.train_on_batch(x[:BATCH], y[:BATCH])
    _unchanged(model, before)
    assert optimizer.steps == 1 and optimizer.privacy_statement()["guarantee"] is False


class _GeneratorDropout(tf.keras.layers.Layer):
    """Dropout drawn from a ``tf.random.Generator`` the layer holds (not one of the model's variables)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = tf.random.Generator.from_seed(3)

    def call(self, x):
        return x * tf.cast(self.generator.uniform(tf.shape(x)) > 0.25, x.dtype) / 0.75


def test_a_random_generator_state_is_listed_apart_and_not_compared():
    """Its draws advance it at every step: listed as random state, and the fits train."""
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    layer = _GeneratorDropout()
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(4), layer,
                                 tf.keras.layers.Dense(3)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    reads = outside_reads.traced_reads(model, None, tf.zeros([6, D]), None)
    assert reads.complete and reads.variables == ()
    assert [id(v) for v in reads.random_state] == [id(layer.generator.state)]
    state = layer.generator.state.numpy().copy()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert not np.array_equal(layer.generator.state.numpy(), state)  # advanced by the steps' draws
    assert optimizer.steps == 3 * N // BATCH and optimizer.privacy_statement()["guarantee"] is True


def test_traced_reads_lists_what_the_pass_the_losses_and_the_loss_read_outside_the_model():
    """Trainable or not, in the forward pass, in ``model.losses`` and in the loss; never the model's own."""
    forward = tf.Variable(0.5, trainable=False, name="forward")
    regularization = tf.Variable(0.1, name="regularization")
    in_loss = tf.Variable(2.0, trainable=False, name="in_loss")
    never = tf.Variable(3.0, trainable=False, name="never")  # read by nothing

    class Scaled(tf.keras.layers.Layer):
        def call(self, t):
            self.add_loss(regularization * 1.0)
            return t * forward

    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3), Scaled()])
    model(tf.zeros([2, D]))

    def loss_fn(y, y_pred, sample_weight):
        return in_loss * LOSS(y, y_pred) + 0.0 * never.dtype.size

    reads = outside_reads.traced_reads(model, loss_fn, tf.zeros([6, D]), tf.zeros([6], tf.int32))
    listed = {v.name for v in reads.variables}
    assert reads.complete and listed == {"forward:0", "regularization:0", "in_loss:0"}
    assert not reads.random_state


def test_a_model_that_cannot_be_traced_lists_the_trainable_reads_a_tape_saw_and_is_not_complete():
    """A layer that calls numpy runs only eagerly: the fallback is the eager tape's (trainable) list."""
    shift = tf.Variable(tf.zeros([3]), name="shift")

    class Numpy(tf.keras.layers.Layer):
        def call(self, t):
            return t + tf.constant(np.asarray(shift) * 0.0) + shift

    model = tf.keras.Sequential([tf.keras.layers.Dense(3), Numpy()])  # built by an eager call, below
    with tf.GradientTape() as tape:
        model(tf.zeros([6, D]))
    assert outside_reads.traced_reads(model, None, tf.zeros([6, D]), None) is None
    reads = outside_reads.eager_reads(model, tape.watched_variables())
    assert not reads.complete and [id(v) for v in reads.variables] == [id(shift)]


def test_changed_compares_every_bit():
    """-0.0 is not 0.0, a NaN equals itself, a scalar read compares with its kept copy."""
    zero, nan = tf.Variable(0.0), tf.Variable([np.nan, 1.0])
    pairs = outside_reads.values([zero, nan])
    assert outside_reads.changed(pairs) == []
    zero.assign(np.array(-0.0, np.float32))  # an array: TF caches Python scalars, -0.0 as 0.0
    assert outside_reads.changed(pairs) == [zero]
