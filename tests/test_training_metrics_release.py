"""Training-batch metrics a DP ``fit`` does not release are not readable anywhere after it.

Not in the logs (``tests/test_weights_record.py``), and not in ``model.get_metrics_result()`` or the metric
objects of ``model.metrics``: the DP step does not compute them, and resets every unreleased metric (an
``add_metric`` one too) inside the step. A released metric stays readable.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfdpbnn
from tests._small_runs import DELTA, LOSS, D, N, small_data
from tfdpbnn import _keras_version


class _InputMean(tf.keras.layers.Layer):
    """Identity that adds the batch's input mean as a metric, updated by the forward pass (``add_metric``;
    Keras 3, which has no ``add_metric``: a ``Mean`` metric of the layer)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if _keras_version.KERAS_MAJOR == 3:
            self.tracker = tf.keras.metrics.Mean(name="input_mean")

    def call(self, inputs):
        value = tf.reduce_mean(inputs) + 10.0   # + 10: never 0 by chance
        if _keras_version.KERAS_MAJOR == 3:
            self.tracker.update_state(value)
        else:
            self.add_metric(value, name="input_mean")
        return inputs


def _fit(release):
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((D,))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(_InputMean()(inputs)))
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                 release_training_metrics=release)
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return model, history.history


def _state(model):
    """Every metric object's variables, by metric name."""
    return {m.name: [v.numpy() for v in m.variables] for m in model.metrics}


def test_withheld_metrics_are_not_in_the_metric_objects_or_get_metrics_result():
    model, history = _fit(False)
    assert set(history) == {"epsilon"}
    state = _state(model)
    assert "loss" in state and "input_mean" in state
    for name, values in state.items():
        for value in values:
            np.testing.assert_allclose(value, 0.0, rtol=0, atol=0, err_msg=name)
    for name, value in model.get_metrics_result().items():
        np.testing.assert_allclose(float(value), 0.0, rtol=0, atol=0, err_msg=name)


def test_withheld_with_several_steps_per_execution_and_train_on_batch():
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"], steps_per_execution=4)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0).history
    assert set(history) == {"epsilon"} and opt.steps == 8
    for metric in model.metrics:
        for value in metric.variables:
            np.testing.assert_allclose(value.numpy(), 0.0, rtol=0, atol=0, err_msg=metric.name)
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
    assert model.train_on_batch(x[:8], y[:8], return_dict=True) == {}
    assert "training_metrics" not in opt.privacy_statement()["not_covered"]["releases"]


def test_a_released_metric_stays_readable_and_the_others_do_not():
    model, history = _fit(("accuracy", "input_mean"))
    assert set(history) == {"epsilon", "accuracy", "input_mean"}
    result = model.get_metrics_result()
    assert 0.0 < float(result["accuracy"]) <= 1.0
    np.testing.assert_allclose(float(result["accuracy"]), history["accuracy"][-1], rtol=1e-6)
    np.testing.assert_allclose(float(result["input_mean"]), history["input_mean"][-1], rtol=1e-6)
    assert 9.0 < float(result["input_mean"]) < 11.0
    for value in _state(model)["loss"]:   # the loss was not released
        np.testing.assert_allclose(value, 0.0, rtol=0, atol=0)
    model, history = _fit(("loss",))
    assert set(history) == {"epsilon", "loss"} and history["loss"][-1] > 0
    np.testing.assert_allclose(float(model.get_metrics_result()["loss"]), history["loss"][-1], rtol=1e-6)
    for value in _state(model).get("accuracy", []):
        np.testing.assert_allclose(value, 0.0, rtol=0, atol=0)


def test_a_callback_acting_on_a_released_training_metric_is_refused():
    """``ReduceLROnPlateau(monitor="loss")`` cut the learning rate, and ``EarlyStopping(monitor="loss")``
    stopped after 2 of 3 epochs, on the noiseless training loss ``release_training_metrics`` puts in the
    logs: the weights then depend on a release no epsilon covers (9.01 and 7.08 were printed with
    ``guarantee: True``). Refused before any step; a callback on a metric not released, on a validation
    metric, or a checkpoint saved every epoch, trains."""
    x, y = small_data()

    def fit(release, callback, **kwargs):
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                     release_training_metrics=release)
        model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback], **kwargs)
        return opt

    for release, callback in (
            (True, tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0)),
            (True, tf.keras.callbacks.EarlyStopping(monitor="loss", patience=0)),
            (["accuracy"], tf.keras.callbacks.EarlyStopping(monitor="accuracy", patience=0))):
        with np.testing.assert_raises_regex(ValueError, f"monitors '{callback.monitor}', a training-batch "
                                                        "metric this optimizer releases without noise"):
            fit(release, callback)
    held_out = small_data(n=16, seed=5)
    for release, callback, kwargs in (
            (["accuracy"], tf.keras.callbacks.EarlyStopping(monitor="loss", patience=0), {}),
            (True, tf.keras.callbacks.EarlyStopping(monitor="val_loss", patience=0),
             {"validation_data": held_out})):
        assert fit(release, callback, **kwargs).steps > 0
