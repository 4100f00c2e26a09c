"""The per-example check follows the code the DP step runs: every trace of the step, every eager step.

A trace bakes the model's Python code as it is then into the step. A layer changed after the model's first
``fit`` (an attribute that now subtracts the batch mean, adds a loss of the activations, or reshapes the
loss to one value per batch) takes effect at the next trace: a dropped train function, new input shapes,
``train_on_batch`` after it, a custom loop's ``tf.function`` called with a new shape. The step then clips
terms that mix examples, and the sensitivity is no longer the clip bound. Each such trace is checked before
any of its steps runs (``DPOptimizerMixin._check_traced_step``); a ``train_step`` override is probed again
at such a trace (``_probe_traced_override``); a run's first trace is checked where a callback of the
user's may precede it, and every trace of a custom loop; a model that runs eagerly is checked at every
run's start and at every step after the first (a callback or the loop's code may change a layer between
two steps). On Keras 2 and 3.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn

N, D, BATCH = 64, 4, 8


class Mixing(tf.keras.layers.Layer):
    """Per-example until ``mode`` is set: "center" subtracts the batch mean, "loss" adds the activations'
    batch mean to ``model.losses`` (found by its derivative only)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.mode = None

    def call(self, x):
        if self.mode == "center":
            return x - tf.reduce_mean(x, axis=0)
        if self.mode == "loss":
            self.add_loss(tf.reduce_mean(x))
        return x


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, 3, N)


def _compiled(*layers):
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3), *layers])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=N, batch_size=BATCH,
                                       delta=1e-5)
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, optimizer


def _refused_without_a_step(model, optimizer, call, match="mixes examples"):
    """``call()`` raises ``ValueError`` (``match``) and takes no DP step: weights and steps as before."""
    before, steps = [w.copy() for w in model.get_weights()], optimizer.steps
    with pytest.raises(ValueError, match=match):
        call()
    assert optimizer.steps == steps
    for now, then in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, then)


# The messages of the run's-start check: the trace's check is the same check (its derivatives too).
@pytest.mark.parametrize("mode, match", [
    ("center", "one example's output depends on another example's input"),
    ("loss", "model.losses depends on the input data")])
def test_a_layer_changed_after_fit_is_refused_when_the_step_is_traced_again(per_example_checks, mode, match):
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 1  # at the run's start; not again at the traces of the first fit
    layer.mode = mode
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # the step traced before runs: still per example
    assert len(per_example_checks) == 1
    model.train_function = None  # the next fit traces the step again, with the layer as it is now
    _refused_without_a_step(model, optimizer, lambda: model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0),
                            match)
    layer.mode = None  # set back: the next trace passes and trains
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert optimizer.steps == 3 * N // BATCH


def test_an_unchanged_model_traced_again_is_checked_again_and_trains(per_example_checks):
    x, y = _data()
    model, optimizer = _compiled(Mixing())
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.train_function = None
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2
    assert optimizer.steps == 2 * N // BATCH


def test_train_on_batch_after_a_change_is_refused_at_its_trace(per_example_checks):
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    model.train_on_batch(x[:BATCH], y[:BATCH])
    layer.mode = "center"
    model.train_function = None
    _refused_without_a_step(model, optimizer, lambda: model.train_on_batch(x[:BATCH], y[:BATCH]))


def test_a_custom_loop_traced_again_after_a_change_is_refused(per_example_checks):
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    optimizer.begin_training(model, x, y, batch_size=BATCH)
    step = tf.function(lambda a, b: optimizer.dp_train_step(model, (a, b)))
    step(x[:BATCH], y[:BATCH])
    step(x[BATCH:2 * BATCH], y[BATCH:2 * BATCH])
    # At begin_training, and again at every trace (the loop's own code runs between any two): Keras 2's
    # tf.function traces a first call that creates variables twice.
    assert len(per_example_checks) >= 2 and optimizer.steps == 2
    layer.mode = "center"
    # Another batch shape: tf.function traces the step again.
    _refused_without_a_step(model, optimizer, lambda: step(x[:BATCH // 2], y[:BATCH // 2]))


def test_a_model_that_runs_eagerly_is_checked_at_every_fit_and_every_step(per_example_checks):
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    model.run_eagerly = True
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    # Each fit: at its start (which stands for its first step), then at each of its 7 other steps.
    assert len(per_example_checks) == 2 * N // BATCH
    layer.mode = "center"
    _refused_without_a_step(model, optimizer, lambda: model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0))


def test_a_layer_changed_between_two_eager_steps_is_refused_at_the_next_step():
    """``run_eagerly``: each step runs the layer's Python code as it is then; a callback changes it."""
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    model.run_eagerly = True
    kept = {}

    class Change(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                kept["weights"] = [w.copy() for w in model.get_weights()]
                layer.mode = "center"

    with pytest.raises(ValueError, match="mixes examples"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[Change()])
    assert optimizer.steps == 2  # the third step was refused before its update
    for now, then in zip(model.get_weights(), kept["weights"], strict=True):
        np.testing.assert_array_equal(now, then)


def test_an_eager_custom_loop_is_checked_at_every_step():
    """A custom loop without ``tf.function``: its code runs between any two steps."""
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    optimizer.begin_training(model, x, y, batch_size=BATCH)
    optimizer.dp_train_step(model, (x[:BATCH], y[:BATCH]))
    optimizer.dp_train_step(model, (x[BATCH:2 * BATCH], y[BATCH:2 * BATCH]))
    layer.mode = "center"
    _refused_without_a_step(model, optimizer, lambda: optimizer.dp_train_step(model, (x[:BATCH], y[:BATCH])))


def test_the_checks_of_eager_steps_leave_a_released_metric_as_the_steps_made_it():
    """Each check's synthetic forward pass updates a forward-pass metric; it is set back after the check."""
    from test_training_metrics_release import _InputMean  # the batch's input mean + 10, as a metric

    x, y = _data()
    model = tf.keras.Sequential([tf.keras.Input((D,)), _InputMean(), tf.keras.layers.Dense(3), Mixing()])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5,
                                       release_training_metrics=True)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    batches = [x[i:i + BATCH].mean() + 10.0 for i in range(0, N, BATCH)]
    np.testing.assert_allclose(history["input_mean"][-1], np.mean(batches), rtol=1e-5, atol=1e-6)


def test_a_known_structure_changed_to_reduce_over_the_batch_is_refused_at_its_trace(per_example_checks):
    """A ``Reshape`` set to ``()`` after a fit: its loss is then one value per batch (sensitivity 2 C)."""
    x, y = _data()
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(1),
                                 tf.keras.layers.Reshape((1,))])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=N, batch_size=BATCH,
                                       delta=1e-5)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.MeanSquaredError())
    model.fit(x, y.astype(np.float32), batch_size=BATCH, epochs=1, verbose=0)
    model.layers[-1].target_shape = ()
    model.train_function = None
    _refused_without_a_step(model, optimizer,
                            lambda: model.fit(x, y.astype(np.float32), batch_size=BATCH, epochs=1, verbose=0),
                            "one loss per example")


def test_a_check_of_a_run_that_took_no_step_does_not_cover_the_next_run(per_example_checks):
    """The model checked at a run's start that stopped before its first trace, then changed: the next run's
    first trace checks it (the earlier run's check says nothing of the model as it is now)."""

    class Stop(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            raise RuntimeError("stopped before the first step")

    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    with pytest.raises(RuntimeError, match="before the first step"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[Stop()])
    assert len(per_example_checks) == 1 and optimizer.steps == 0
    layer.mode = "center"
    _refused_without_a_step(model, optimizer, lambda: model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0))


@pytest.mark.parametrize("way", ["minimize", "privatize_losses"])
def test_a_train_step_override_changed_after_fit_is_probed_again_at_its_trace(way, monkeypatch):
    """An override whose loss turns contrastive after a fit: probed at the next trace, refused there."""
    from test_state_checks import _OwnStep

    from tfdpbnn.optimizers.base import DPOptimizerMixin

    probes = []
    original = DPOptimizerMixin._probe_train_step

    def counted(self, model, *args, **kwargs):
        probes.append(model)
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(DPOptimizerMixin, "_probe_train_step", counted)
    x, y = _data()
    model = _OwnStep(way, coupled=False)
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(probes) == 1  # at the run's start; not again at the traces of the first fit
    model.coupled = True
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # the step traced before runs: still per example
    model.train_function = None
    _refused_without_a_step(model, optimizer, lambda: model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0),
                            "depends on other examples of the batch")
    assert len(probes) == 2


@pytest.mark.parametrize("way", ["minimize", "privatize_losses"])
def test_an_eager_train_step_override_changed_between_two_steps_is_probed_and_refused(way):
    """``run_eagerly``: a callback makes the override's loss contrastive after the second step."""
    from test_state_checks import _OwnStep

    x, y = _data()
    model = _OwnStep(way, coupled=False)
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    kept = {}

    class Change(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                kept["weights"] = [w.copy() for w in model.get_weights()]
                model.coupled = True

    with pytest.raises(ValueError, match="depends on other examples of the batch"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[Change()])
    assert optimizer.steps == 2
    for now, then in zip(model.get_weights(), kept["weights"], strict=True):
        np.testing.assert_array_equal(now, then)


def test_a_custom_loop_of_the_mechanism_traced_again_after_a_change_is_refused(per_example_checks):
    """``mechanism.privatize_model`` (the compiled loss) in a custom loop's ``tf.function``: checked at a
    retrace, as ``dp_train_step`` is."""
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    optimizer.begin_training(model, x, y, batch_size=BATCH)
    variables = model.trainable_variables

    @tf.function
    def step(a, b):
        released = optimizer.mechanism.privatize_model(model, a, b)
        optimizer.apply_gradients(zip(released.gradients, variables, strict=True))

    step(x[:BATCH], y[:BATCH])
    assert len(per_example_checks) >= 2 and optimizer.steps == 1  # begin_training, every trace
    layer.mode = "center"
    _refused_without_a_step(model, optimizer, lambda: step(x[:BATCH // 2], y[:BATCH // 2]))


def test_a_callback_that_changes_the_model_before_the_first_trace_is_seen(per_example_checks):
    """A ``fit`` callback's ``on_train_begin`` runs after the run's check and before the first trace: with
    such a callback the first trace checks the model as it finds it."""

    class Centering(tf.keras.callbacks.Callback):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def on_train_begin(self, logs=None):
            self.layer.mode = "center"

    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    _refused_without_a_step(model, optimizer, lambda: model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                                                                callbacks=[Centering(layer)]))


def test_a_custom_loop_changing_the_model_after_begin_training_is_seen(per_example_checks):
    """A custom loop's own code runs between ``begin_training`` and the first trace."""
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    optimizer.begin_training(model, x, y, batch_size=BATCH)
    layer.mode = "center"
    step = tf.function(lambda a, b: optimizer.dp_train_step(model, (a, b)))
    _refused_without_a_step(model, optimizer, lambda: step(x[:BATCH], y[:BATCH]))


def test_every_trace_of_a_custom_loop_is_checked(per_example_checks):
    """A custom loop's code runs between any two traces, with or without a DP write in between: a concrete
    function traced ahead, then the layer changed, then a new shape; two steps in one ``tf.function`` with
    the layer changed between them."""
    x, y = _data()
    layer = Mixing()
    model, optimizer = _compiled(layer)
    optimizer.begin_training(model, x, y, batch_size=BATCH)
    step = tf.function(lambda a, b: optimizer.dp_train_step(model, (a, b)))
    step.get_concrete_function(tf.TensorSpec((BATCH, D), tf.float32), tf.TensorSpec((BATCH,), tf.int64))
    layer.mode = "center"
    _refused_without_a_step(model, optimizer, lambda: step(x[:BATCH // 2], y[:BATCH // 2]))
    layer.mode = None

    @tf.function
    def two_steps(a, b):
        optimizer.dp_train_step(model, (a, b))
        layer.mode = "center"
        optimizer.dp_train_step(model, (a, b))

    try:
        _refused_without_a_step(model, optimizer, lambda: two_steps(x[:BATCH], y[:BATCH]))
    finally:
        layer.mode = None
