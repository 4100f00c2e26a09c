"""A variable the model's outputs read but the model does not own is part of what the DP step computes.

A global ``tf.Variable`` in a ``Lambda`` (``x - alpha * mean(x)``), trainable or not, set from 0 to 1 makes
the same code mix the examples of a batch: one example's clipped gradient then depends on the others, and
the clip bound no longer bounds the sensitivity (the true epsilon is unbounded). The check runs the model as
it is when it runs, so every such variable is listed with its value (``tfdpbnn.optimizers.outside_reads``:
the pass traced once, its graph walked back from the outputs); a check pass that changes one is refused; the
model is checked again when one has changed by a run's start; during a run a change is refused (``fit``:
before every batch, after every callback, set back, ``guarantee`` false; a custom loop: the next step;
``train_on_batch``: the next call), unless the variable is asserted public
(``optimizer.assert_public_variable``), where each new value is checked before a step reads it. A random
generator's state, which the outputs read only through random draws, is not kept. On Keras 2 and 3.
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


def test_a_variable_read_only_by_a_custom_gradient_is_listed_and_a_change_checked(per_example_checks):
    """The DP step clips gradients: a ``tf.custom_gradient`` whose gradient alone reads ``beta`` (mixing the
    batch's output gradients at beta 1) is listed from the traced gradients, and checked again after beta
    changed."""
    x, y = _data()
    beta = tf.Variable(0.0, trainable=False, name="beta")

    @tf.custom_gradient
    def mixed_gradient(t):
        def gradient(upstream):
            return upstream - beta * tf.reduce_mean(upstream, axis=0)
        return tf.identity(t), gradient

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(mixed_gradient)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert [v.name for v, _ in optimizer._dp_foreign_variables[id(model)]] == ["beta:0"]
    beta.assign(1.0)
    with pytest.raises(ValueError, match="mixes examples"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2 and optimizer.steps == N // BATCH


def test_a_model_reading_a_resource_no_variable_names_is_checked_at_every_run(per_example_checks):
    """A lookup table's value cannot be kept: a gate in a table set between fits is found by the check run
    at the next run's start."""
    x, y = _data()
    table = tf.lookup.experimental.MutableHashTable(tf.int32, tf.float32, default_value=0.0)
    table.insert(tf.constant([0]), tf.constant([0.0]))

    def gated(t):
        alpha = tf.reshape(table.lookup(tf.constant([0])), [])
        return t - alpha * tf.reduce_mean(t, axis=0)

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(gated)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    assert not outside_reads.traced_reads(model, None, tf.zeros([6, D]), None).complete
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2  # at every run's start
    table.insert(tf.constant([0]), tf.constant([1.0]))
    with pytest.raises(ValueError, match="mixes examples"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert optimizer.steps == 2 * N // BATCH


def test_a_gate_set_by_a_callback_during_fit_is_refused_before_the_next_step_set_back_and_named():
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    model, optimizer = _centering(alpha)

    class Gate(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                alpha.assign(1.0)

    found = r"'alpha:0'.* changed during DP fit \(found before batch 3, after every callback"
    with pytest.raises(ValueError, match=found):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[Gate()])
    assert optimizer.steps == 3  # no step ran with alpha 1
    assert float(alpha.numpy()) == 0.0  # set back  # noqa: PLR2004 - exact: the value assigned
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["quote"]["epsilon"])


def test_a_gate_set_and_undone_around_every_batch_is_refused_before_its_first_step():
    """Set by one callback's ``on_train_batch_begin``, undone by its ``on_train_batch_end``: an epoch's end
    would see alpha 0; the check after every callback's ``on_train_batch_begin`` sees alpha 1."""
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    model, optimizer = _centering(alpha)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)

    class Toggle(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            alpha.assign(1.0)

        def on_train_batch_end(self, batch, logs=None):
            alpha.assign(0.0)

    before = _weights(model)
    with pytest.raises(ValueError, match=r"'alpha:0'.* changed during DP fit \(found before batch 0"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[Toggle()])
    assert optimizer.steps == N // BATCH
    _unchanged(model, before)


def test_a_variable_the_forward_pass_changes_and_reads_is_refused_by_the_check():
    """A counter the pass advances and reads (mixing at one count): refused before the first step."""
    x, y = _data()
    count = tf.Variable(0.0, trainable=False, name="count")

    def counted(t):
        count.assign_add(1.0)
        return t - tf.cast(tf.equal(count, 5.0), t.dtype) * tf.reduce_mean(t, axis=0)

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(counted)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    found = r"changed the variable\(s\) \['count:0'\], which the model's outputs"
    with pytest.raises(ValueError, match=found):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert optimizer.steps == 0


class _MetricGate(tf.keras.layers.Layer):
    """Subtracts the running mean of its inputs, kept in a ``Mean`` metric object (not a model variable)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.running = tf.keras.metrics.Mean(name="running")

    def call(self, t):
        self.running.update_state(tf.reduce_mean(t))
        return t - tf.stop_gradient(self.running.result())


def test_a_metric_object_read_by_the_outputs_is_watched_and_its_update_in_the_pass_refused():
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3), _MetricGate()])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    with pytest.raises(ValueError, match="which the model's outputs read but the model does not own"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert optimizer.steps == 0


class _AnnealedKL(tf.keras.layers.Layer):
    """A dense layer whose weight penalty (data-independent) is scaled by a KL weight it does not own."""

    def __init__(self, weight, **kwargs):
        super().__init__(**kwargs)
        self.dense = tf.keras.layers.Dense(3)
        self.kl_weight = lambda: weight  # not tracked: the variable stays outside the model

    def call(self, t):
        out = self.dense(t)
        self.add_loss(self.kl_weight() * 1e-3 * tf.reduce_sum(tf.square(self.dense.kernel)))
        return out


def _annealed(kl_weight):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), _AnnealedKL(kl_weight)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


class _Anneal(tf.keras.callbacks.Callback):
    """KL annealing: the weight set from the epoch number at each epoch's start."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def on_epoch_begin(self, epoch, logs=None):
        self.weight.assign(min(1.0, 0.5 * (epoch + 1)))


@pytest.fixture
def kl_weight():
    return tf.Variable(0.0, trainable=False, name="kl_weight")


def test_a_schedule_asserted_public_changes_during_fit_and_is_checked_at_each_value(kl_weight,
                                                                                   per_example_checks):
    x, y = _data()
    model, optimizer = _annealed(kl_weight)
    reads = outside_reads.traced_reads(model, None, tf.zeros([6, D]), None)
    assert [v.name for v in reads.variables] == ["kl_weight:0"]  # model.losses depend on it
    optimizer.assert_public_variable(kl_weight, reason="KL annealing: set from the epoch number")
    model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[_Anneal(kl_weight)])
    # The run's start, then each new value before the step that reads it first: 0.5, 1.0 (the third epoch
    # keeps 1.0).
    assert len(per_example_checks) == 3
    assert optimizer.steps == 3 * N // BATCH and float(kl_weight.numpy()) == 1.0  # noqa: PLR2004 - exact
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    assert any("'kl_weight:0'" in a and "KL annealing" in a for a in statement["asserted_by_user"])


def test_the_same_schedule_not_asserted_is_refused_before_the_first_step(kl_weight):
    x, y = _data()
    model, optimizer = _annealed(kl_weight)
    with pytest.raises(ValueError, match=r"'kl_weight:0'.*assert_public_variable"):
        model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[_Anneal(kl_weight)])
    assert optimizer.steps == 0


def test_a_gate_asserted_public_is_still_checked_and_refused_when_it_makes_the_model_mix():
    """The assertion says where the values come from, not that they keep examples apart: each is checked."""
    x, y = _data()
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    model, optimizer = _centering(alpha)
    optimizer.assert_public_variable(alpha, reason="a schedule of the epoch")

    class Gate(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            alpha.assign(float(epoch))

    with pytest.raises(ValueError, match="mixes examples"):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[Gate()])
    assert optimizer.steps == N // BATCH  # the first epoch (alpha 0) trained; no step with alpha 1


class _OwnGate(tf.keras.layers.Layer):
    """``t * (1 + scale) - gate * mean(t)``: ``scale`` and ``gate`` are the layer's own non-trainable weights
    (any ``scale`` keeps examples apart; a ``gate`` other than 0 mixes them)."""

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(), initializer="zeros", trainable=False)
        self.gate = self.add_weight(name="gate", shape=(), initializer="zeros", trainable=False)

    def call(self, t):
        return t * (1.0 + self.scale) - self.gate * tf.reduce_mean(t, axis=0)


@pytest.mark.parametrize("mixing", [False, True])
def test_a_weight_of_the_models_own_asserted_public_is_checked_at_each_value(mixing):
    """A layer's own non-trainable weight (a KL weight kept in the layer), asserted public: a callback may
    set it during a fit; each value is checked before a step reads it (refused where it makes the model
    mix), and the next run's start does not take it for state set from the data."""
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    layer = _OwnGate()
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3), layer])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=LOSS)
    for weight in (layer.scale, layer.gate):
        optimizer.assert_public_variable(weight, reason="a schedule of the epoch")
    changed = layer.gate if mixing else layer.scale

    class Set(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            changed.assign(float(epoch))

    if mixing:
        with pytest.raises(ValueError, match="mixes examples"):
            model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[Set()])
        assert optimizer.steps == N // BATCH  # no step read the gate at 1
    else:
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[Set()])
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        assert optimizer.steps == 3 * N // BATCH and optimizer.privacy_statement()["guarantee"] is True


@pytest.mark.parametrize("reason, variable, match", [
    ("", None, "reason must be a non-empty string"),
    ("public", 1.0, "variable must be a tf.Variable"),
])
def test_assert_public_variable_refuses_bad_arguments(reason, variable, match):
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    with pytest.raises(ValueError, match=match):
        optimizer.assert_public_variable(tf.Variable(0.0) if variable is None else variable, reason=reason)


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
    assert [id(v) for v in reads.others] == [id(layer.generator.state)]
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
    assert not reads.others


def test_traced_reads_keeps_a_seed_gate_and_a_value_passed_through_a_variable_but_no_generator_state():
    """A variable fed to a stateless draw's seed that nothing in the pass writes gates the draw's value: kept.
    A value written into a variable the outputs then read (``v.assign(alpha)``, ``v.read_value()``): kept.
    A generator's state, which its draws advance: not kept."""
    seed_gate = tf.Variable(0, name="seed_gate")
    alpha = tf.Variable(0.0, trainable=False, name="alpha")
    scratch = tf.Variable(0.0, trainable=False, name="scratch")
    generator = tf.random.Generator.from_seed(1)

    def layer(t):
        drawn = tf.random.stateless_uniform([], seed=tf.stack([seed_gate, 0]))
        scratch.assign(alpha)
        passed = scratch.read_value()
        return t * drawn + passed + generator.normal(tf.shape(t))

    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(layer)])
    reads = outside_reads.traced_reads(model, None, tf.zeros([6, D]), None)
    assert {v.name for v in reads.variables} == {"seed_gate:0", "alpha:0", "scratch:0"}
    assert [id(v) for v in reads.others] == [id(generator.state)]


def test_an_asserted_variable_the_steps_change_inside_an_execution_voids_the_guarantee():
    """``steps_per_execution=4``: each new value is checked before an execution, not inside one."""
    x, y = _data()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)

    def warm_up(t):  # reads the optimizer's step counter, which every step changes
        return t * tf.cast(tf.minimum(optimizer.iterations + 1, 4), t.dtype) / 4.0

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Lambda(warm_up)])
    model.compile(optimizer=optimizer, loss=LOSS, steps_per_execution=4)
    optimizer.assert_public_variable(optimizer.iterations, reason="the step count is public")
    with pytest.raises(ValueError, match="changed inside an execution of 4 steps"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert optimizer.privacy_statement()["guarantee"] is False


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
