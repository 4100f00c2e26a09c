"""A per-example check passed once holds for models of the same known structure; any other model is run."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn import _private_api
from tfdpbnn.optimizers import fit_checks, known_structure

N, D, BATCH = 64, 6, 16


@pytest.fixture(autouse=True)
def _no_passed_structures(monkeypatch):
    """Each test starts from no passed structure (the set is process-wide)."""
    monkeypatch.setattr(known_structure, "_PASSED", set())


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, D)).astype(np.float32), rng.integers(0, 3, N)


def _model(*middle, activation="relu", functional=False):
    if not functional:
        return tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(8, activation=activation),
                                    *middle, tf.keras.layers.Dense(3)])
    inputs = tf.keras.Input((D,))
    h = tf.keras.layers.Dense(8, activation=activation)(inputs)
    for layer in middle:
        h = layer(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(h))


def _fit(model, loss=None):
    x, y = _data()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=N,
                                                   batch_size=BATCH, delta=1e-5),
                  loss=loss or tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    return model


@pytest.mark.parametrize("functional", [False, True])
def test_a_second_model_of_a_passed_structure_is_not_run_and_trains(per_example_checks, functional):
    first = _fit(_model(tf.keras.layers.Dropout(0.1), functional=functional))
    second = _model(tf.keras.layers.Dropout(0.1), functional=functional)
    before = [w.copy() for w in second.get_weights()]
    _fit(second)
    assert per_example_checks == [first]
    assert any(not np.allclose(a, b) for a, b in zip(before, second.get_weights(), strict=True))
    # Another loss configuration, another architecture: each is run once.
    _fit(_model(tf.keras.layers.Dropout(0.1), functional=functional),
         loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    _fit(_model(tf.keras.layers.Dropout(0.2), tf.keras.layers.Dense(4), functional=functional))
    assert len(per_example_checks) == 3


def _mixing(h):
    return h - tf.reduce_mean(h, axis=0, keepdims=True)


@pytest.mark.parametrize("case", ["lambda layer", "custom activation", "custom loss", "call of its own"])
def test_a_mixing_model_beside_a_passed_structure_is_still_refused(per_example_checks, case):
    _fit(_model())  # the plain structure passed
    loss = None
    if case == "lambda layer":
        model = _model(tf.keras.layers.Lambda(_mixing))
    elif case == "custom activation":
        model = _model(activation=_mixing)
    elif case == "custom loss":
        model = _model()

        def loss(y, logits):  # one example's loss moves with the batch's mean logits
            return tf.keras.losses.sparse_categorical_crossentropy(y, _mixing(logits), from_logits=True)
    else:
        model = _model()
        layer = model.layers[0]
        plain = layer.call
        layer.call = lambda h, *args, **kwargs: _mixing(plain(h, *args, **kwargs))
    with pytest.raises(ValueError, match="mixes examples|depends on other examples|changes with other"):
        _fit(model, loss=loss)
    assert len(per_example_checks) == 2


def test_a_failed_check_is_not_kept(per_example_checks):
    """A built-in loss over the batch axis fails its check; the same structure is run (and refused) again."""
    x, y = _data()
    for _ in range(2):
        model = _model()
        model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH,
                                                       delta=1e-5),
                      loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True, axis=0))
        with pytest.raises(ValueError, match="loss"):
            model.fit(x, np.eye(3, dtype=np.float32)[y], batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2


def _key(model, x=None, y=None):
    x_like, y_like = _data() if x is None else (x, y)
    model.compile(optimizer="sgd", loss=model.loss if getattr(model, "loss", None) else
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return known_structure.structure_key(model, x_like, y_like, _private_api.submodules(model))


class _Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(3)

    def call(self, inputs):
        return self.dense(inputs)


def test_what_is_known_from_its_structure():
    assert _key(_model()) is not None
    assert _key(_model()) == _key(_model())
    assert _key(_model()) != _key(_model(tf.keras.layers.Dense(4)))
    x, y = _data()
    assert _key(_model(), x.astype(np.float64), y) != _key(_model(), x, y)  # the inputs' dtype is part of it
    unknown = [
        _model(tf.keras.layers.Lambda(_mixing)),
        _model(activation=_mixing),
        _model(tf.keras.layers.Dense(4, activity_regularizer="l2")),
        _model(tf.keras.layers.LayerNormalization()),  # per example for most axes, not for all
    ]
    assert all(_key(model) is None for model in unknown)
    subclassed = _Subclassed()
    subclassed(np.zeros((1, D), np.float32))
    assert _key(subclassed) is None
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0]])
    assert _key(_model(), ragged, np.zeros(2)) is None
    unbuilt = tf.keras.Sequential([tf.keras.layers.Dense(3)])
    assert _key(unbuilt) is None


def test_custom_loss_functions_are_not_known():
    model = _model()
    model.compile(optimizer="sgd", loss=lambda y, p: tf.keras.losses.sparse_categorical_crossentropy(y, p))
    assert known_structure.structure_key(model, *_data(), _private_api.submodules(model)) is None
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    assert known_structure.structure_key(model, *_data(), _private_api.submodules(model)) is not None


@pytest.mark.parametrize("layer", [
    lambda: tf.keras.layers.Reshape((2, 4)), lambda: tf.keras.layers.Activation("softmax"),
    lambda: tf.keras.layers.ReLU(max_value=2.0), lambda: tf.keras.layers.Dropout(0.5, noise_shape=(1, 8)),
    lambda: tfdpbnn.layers.MCDropout(0.2), lambda: tfdpbnn.layers.DenseVariational(8, N, activation="relu"),
    lambda: tfdpbnn.layers.DenseBayesByBackprop(8, N, activation="tanh"),
])
def test_the_known_layers_pass_the_check_they_stand_for(layer):
    """Each known layer, inside a model, passes the check that its structure stands for (run here)."""
    made = layer()
    if isinstance(made, tf.keras.layers.Reshape):
        model = _model(made, tf.keras.layers.Flatten())
    else:
        model = _model(made)
    x, y = _data()
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert known_structure.structure_key(model, x, y, _private_api.submodules(model)) is not None
    reads = fit_checks.check_per_example(model, model.loss and
                                         tfdpbnn.optimizers.per_example_loss.compiled_per_example_loss_fn(model),
                                         x, y)
    assert reads.complete and reads.variables == ()  # nothing read outside the model: its structure is kept


def test_a_class_whose_call_was_replaced_is_another_structure(per_example_checks, monkeypatch):
    """Keras's own ``Dense.call`` replaced after a model of Dense layers passed: the next one is run again."""
    _fit(_model())
    plain = tf.keras.layers.Dense.call

    def call(self, inputs):
        return _mixing(plain(self, inputs))

    monkeypatch.setattr(tf.keras.layers.Dense, "call", call)
    with pytest.raises(ValueError, match="mixes examples"):
        _fit(_model())
    assert len(per_example_checks) == 2


def test_the_loss_is_the_compiled_one(per_example_checks):
    """``model.loss`` set after compiling another loss: not known (the compiled loss is run)."""
    _fit(_model())

    def mixing_loss(y, logits):
        return tf.keras.losses.sparse_categorical_crossentropy(y, _mixing(logits), from_logits=True)

    model = _model()
    x, y = _data()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=BATCH, delta=1e-5),
                  loss=mixing_loss)
    model.loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert known_structure.structure_key(model, x, y, _private_api.submodules(model)) is None
    with pytest.raises(ValueError, match="depends on other examples|changes with other"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert len(per_example_checks) == 2


def test_a_tensor_of_the_batch_axis_alone_is_not_known(per_example_checks):
    """``Reshape(())`` then a log-softmax works across the batch: after a zero kernel the check passes
    (no input reaches it), so the structure must not stand for the same model with other weights.

    On Keras 3 the log-softmax is a ``tf.keras.activations`` function (the rank is what leaves the model
    unknown); on Keras 2 it resolves to ``tf.nn.log_softmax``, which is not one (unknown either way).
    """
    def model(kernel):
        return tf.keras.Sequential([
            tf.keras.Input((D,)), tf.keras.layers.Dense(1, kernel_initializer=kernel),
            tf.keras.layers.Reshape(()), tf.keras.layers.Activation("log_softmax"),
            tf.keras.layers.Reshape((1,)),
            tf.keras.layers.Dense(3)])

    zero = model("zeros")
    x, y = _data()
    zero.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert known_structure.structure_key(zero, x, y, _private_api.submodules(zero)) is None
    _fit(model("zeros"))  # passes: nothing of the inputs reaches the softmax
    with pytest.raises(ValueError, match="mixes examples"):
        _fit(model("glorot_uniform"))
    assert len(per_example_checks) == 2


def test_an_attribute_set_after_building_is_another_structure(per_example_checks):
    """A ``Reshape`` whose target shape is set to ``()`` after the model was built: its loss then reduces over
    the batch (one value per batch); the key holds the layers' configurations, so that model is run."""
    x, y = _data()

    def model():
        return tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(1),
                                    tf.keras.layers.Reshape((1,))])

    first = model()
    _fit(first, loss=tf.keras.losses.MeanSquaredError())
    second = model()
    second.layers[-1].target_shape = ()
    second.compile(optimizer="sgd", loss=tf.keras.losses.MeanSquaredError())
    first.compile(optimizer="sgd", loss=tf.keras.losses.MeanSquaredError())
    assert known_structure.structure_key(second, x, y, _private_api.submodules(second)) != \
        known_structure.structure_key(first, x, y, _private_api.submodules(first))
    with pytest.raises(ValueError, match="one loss per example"):
        _fit(second, loss=tf.keras.losses.MeanSquaredError())
    assert len(per_example_checks) == 2


def test_what_the_check_refuses_is_not_known_and_the_check_says_why():
    """An unknown loss name, an input of unknown rank: no key (the check's own error follows), no crash."""
    model = _model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = _data()
    known = known_structure.structure_key(model, x, y, _private_api.submodules(model))
    model.loss = "no_such_loss"
    assert known is not None
    assert known_structure._loss_key("no_such_loss") is None
    assert known_structure._loss_key("SparseCategoricalCrossentropy") is not None  # a class name
    unknown_rank = tf.TensorSpec(None, tf.float32)
    assert known_structure.structure_key(model, unknown_rank, y, _private_api.submodules(model)) is None


def test_an_activation_keras_defines_but_does_not_export_is_not_known():
    """Keras's own batch mean as an activation works across examples (after a zero kernel the check would
    pass): only the functions ``tf.keras.activations`` exports (each per example) are known."""
    mean = getattr(tf.keras.backend, "mean", None) or tf.keras.ops.mean
    model = _model()
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert known_structure.structure_key(model, *_data(), _private_api.submodules(model)) is not None
    model.layers[0].activation = mean  # set after building (a mean over every axis would not build)
    assert known_structure.structure_key(model, *_data(), _private_api.submodules(model)) is None
