"""Every layer in Sequential and subclassed models (functional: test_export.py): fit, losses, training."""

import numpy as np
import tensorflow as tf
from _float32 import F32
from _tiers import slow_on_keras2

import tfdpbnn.layers as L

RNG = np.random.default_rng(0)
X = RNG.normal(size=(8, 5, 5, 1)).astype("float32")
Y = RNG.integers(0, 3, size=8)


def _stack():
    return [L.PublicBatchNormalization(public_batch=RNG.normal(size=(4, 5, 5, 1))),
            L.Conv2DVariational(2, 3, num_examples=8, padding="same"),
            L.NoisyConv2D(2, 2, noise_stddev=0.05),
            tf.keras.layers.Flatten(),
            L.MCDropout(0.2),
            L.DenseBayesByBackprop(6, num_examples=8, activation="relu"),
            L.DenseVariational(5, num_examples=8, activation="relu"),
            L.NoisyDense(3, noise_stddev=0.05, activation="softmax")]


class _Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__(name="subclassed")   # Keras 3 refuses its default "__subclassed" as a name scope
        self.stack = _stack()

    def call(self, x, training=None):
        for layer in self.stack:
            x = layer(x, training=training)
        return x


def _check(model):
    model.compile(tf.keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    hist = model.fit(X, Y, epochs=1, batch_size=4, verbose=0)
    assert np.isfinite(hist.history["loss"][0])
    assert len(model.losses) == 3  # KL terms of Conv2DVariational, DenseBayesByBackprop, DenseVariational
    data_loss = tf.keras.losses.sparse_categorical_crossentropy(Y, model(X)).numpy().mean()
    assert model.evaluate(X, Y, verbose=0) > data_loss  # the KL terms are part of the compiled loss
    np.testing.assert_allclose(model.predict(X, verbose=0), model.predict(X, verbose=0), **F32)
    a, b = model(X, training=True).numpy(), model(X, training=True).numpy()
    assert not np.allclose(a, b)
    with L.mc_sampling():
        assert not np.allclose(model(X).numpy(), model(X).numpy())


def test_sequential():
    _check(tf.keras.Sequential([tf.keras.Input((5, 5, 1))] + _stack()))


@slow_on_keras2   # the layer stack of test_sequential; subclassed-model clipping: test_clipping_ghost.py
def test_subclassed():
    _check(_Subclassed())
