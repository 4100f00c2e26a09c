"""The Keras integration: import changes no tf.keras class; compile/fit trains with DP for all model kinds."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tests._float32 import F32


@pytest.mark.slow   # not in the fast tier: a fresh interpreter that imports TensorFlow
def test_importing_tfdpbnn_changes_no_keras_class():
    """Every attribute of tf.keras.Model, Sequential and the Layer base is the same object after importing
    tfdpbnn and all of its modules; only constructing a DP optimizer installs the fit integration."""
    script = textwrap.dedent("""
        import importlib, pkgutil
        import tensorflow as tf
        classes = [tf.keras.Model, tf.keras.Sequential, tf.keras.layers.Layer, tf.keras.optimizers.legacy.SGD]
        before = [dict(vars(c)) for c in classes]
        import tfdpbnn
        for info in pkgutil.walk_packages(tfdpbnn.__path__, "tfdpbnn."):
            importlib.import_module(info.name)
        for c, old in zip(classes, before):
            new = dict(vars(c))
            assert new.keys() == old.keys(), (c, set(new) ^ set(old))
            changed = [k for k in old if new[k] is not old[k]]
            assert not changed, (c, changed)
        from tfdpbnn.optimizers import keras_integration
        assert not keras_integration.installed()
        tfdpbnn.DPSGDOptimizer(1.0, 1.0, batch_size=4, num_examples=40)
        assert keras_integration.installed()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _sequential():
    return tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(3, activation="tanh"),
                                tf.keras.layers.Dense(2)])


def _functional():
    inputs = tf.keras.Input((5,))
    hidden = tf.keras.layers.Dense(3, activation="tanh")(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2)(hidden))


class SubclassedModel(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(3, activation="tanh")
        self.out = tf.keras.layers.Dense(2)

    def call(self, x, training=None):
        return self.out(self.hidden(x))


def _one_step_reference(model, x, y, lr):
    """w - lr * grad(mean loss): what one non-private full-batch SGD step does."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return [(v - lr * g).numpy() for v, g in zip(model.trainable_variables, grads, strict=True)]


@pytest.mark.parametrize("build", [_sequential, _functional, SubclassedModel],
                         ids=["sequential", "functional", "subclassed"])
def test_compile_fit_is_dp_sgd_for_every_model_kind(build):
    """sigma = 0 and a clip above every norm: one DP-SGD step of fit equals the plain SGD step, and the
    ledger counted it (the DP step ran, not Keras's)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)).astype(np.float32)
    y = rng.integers(0, 2, size=8)
    tf.keras.utils.set_random_seed(1)
    model = build()
    model(x[:1])
    expected = _one_step_reference(model, x, y, lr=0.1)
    opt = tfdpbnn.DPSGDOptimizer(1e6, 0.0, batch_size=8, num_examples=8, learning_rate=0.1,
                                 release_training_metrics=("loss",))
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.trainable_variables, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, **F32)
    assert opt.ledger.steps == 1 and history.history["loss"]


def test_non_private_models_train_exactly_as_keras_after_install():
    """Once the integration is installed, a model with a Keras optimizer runs Keras's own step."""
    tfdpbnn.DPSGDOptimizer(1.0, 1.0, batch_size=4, num_examples=40)  # installs
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 5)).astype(np.float32)
    y = rng.integers(0, 2, size=6)
    tf.keras.utils.set_random_seed(3)
    model = _functional()
    expected = _one_step_reference(model, x, y, lr=0.2)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.2),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.trainable_variables, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, **F32)


class OverridingModel(SubclassedModel):
    """A train_step override that takes its DP step through the optimizer's mechanism."""

    def train_step(self, data):
        x, y = data
        released = self.optimizer.mechanism.privatize_model(self, x, y)
        self.optimizer.apply_gradients(zip(released.gradients, self.trainable_variables, strict=False))
        return {"norm": tf.reduce_mean(released.clipped.per_example_norms)}


def test_train_step_override_is_counted_and_checked():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(12, 5)).astype(np.float32)
    y = rng.integers(0, 2, size=12)
    tf.keras.utils.set_random_seed(5)
    model = OverridingModel()
    model(x[:1])
    expected = _one_step_reference(model, x[:6], y[:6], lr=0.1)
    opt = tfdpbnn.DPSGDOptimizer(1e6, 0.0, batch_size=6, num_examples=12, learning_rate=0.1)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="num_examples"):  # fit's checks still run before the first step
        model.fit(x[:10], y[:10], batch_size=6, epochs=1, verbose=0)
    history = model.fit(x, y, batch_size=6, epochs=1, shuffle=False, verbose=0, steps_per_epoch=1)
    for got, want in zip(model.trainable_variables, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, **F32)
    assert opt.ledger.steps == 1 and "norm" in history.history
    assert opt.ledger.phases[-1].participations == 1  # 6 of 12 examples seen: one participation each


class ScaledLossModel(SubclassedModel):
    """A compute_loss override (the loss scaled): the DP step, clipping the compiled loss, never calls it."""

    def compute_loss(self, *args, **kwargs):
        return 1000.0 * super().compute_loss(*args, **kwargs)


def test_compute_loss_override_is_refused_not_ignored():
    # It used to train the compiled loss, the override silently ignored (epsilon printed, guarantee true).
    rng = np.random.default_rng(4)
    x = rng.normal(size=(12, 5)).astype(np.float32)
    y = rng.integers(0, 2, size=12)
    model = ScaledLossModel()
    model(x[:1])
    before = [w.copy() for w in model.get_weights()]
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, batch_size=6, num_examples=12)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="compute_loss: ScaledLossModel overrides Model.compute_loss"):
        model.fit(x, y, batch_size=6, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="compute_loss"):
        model.train_on_batch(x[:6], y[:6])
    opt.begin_training(model, x, y, batch_size=6)   # a custom loop's dp_train_step is refused too
    with pytest.raises(ValueError, match="compute_loss"):
        opt.dp_train_step(model, (x[:6], y[:6]))
    assert opt.steps == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_mechanism_of_an_optimizer_refuses_to_clip_before_begin_training():
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, batch_size=4, num_examples=40)
    model = _sequential()
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match="begin_training"):
        opt.mechanism.clip_model(model, x, np.zeros(4, np.int64))


def test_pandas_inputs_train_as_keras_reads_them():
    # Keras reads a DataFrame as its values and a Series as a column; tfdpbnn's checks read dtypes and
    # failed on a DataFrame (AttributeError: no attribute 'dtype') in fit and train_on_batch.
    pandas = pytest.importorskip("pandas")
    from _small_runs import DELTA, LOSS, N, gaussians_epsilon, small_data, small_model

    x, y = small_data()
    model = small_model()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(pandas.DataFrame(x), pandas.Series(y), batch_size=8, epochs=2, verbose=0)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"]
    assert statement["quote"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=1e-6)
    model.train_on_batch(pandas.DataFrame(x[:8]), pandas.Series(y[:8]))
    assert optimizer.privacy_statement()["quote"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3),
                                                                              rel=1e-6)
    # The rows are records by content as arrays would be: validation on them is refused.
    with pytest.raises(ValueError, match="validation_data: 8 of its 8 records are training records"):
        model.fit(pandas.DataFrame(x), pandas.Series(y), batch_size=8, epochs=1, verbose=0,
                  validation_data=(pandas.DataFrame(x[:8]), pandas.Series(y[:8])))
