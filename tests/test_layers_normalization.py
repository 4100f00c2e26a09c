"""PublicBatchNormalization: statistics from the public batch only, first layer and deep in a network."""

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32

from tfdpbnn.clipping.independence import check_per_example_independence
from tfdpbnn.layers import AppendPublicBatch, DropPublicBatch, NoisyDense, PublicBatchNormalization

RNG = np.random.default_rng(0)
PUBLIC = RNG.normal(2.0, 3.0, size=(16, 5)).astype("float32")


def test_first_layer_uses_public_statistics_only():
    layer = PublicBatchNormalization(public_batch=PUBLIC, epsilon=1e-3)
    x = RNG.normal(size=(6, 5)).astype("float32")
    y = layer(x, training=True).numpy()
    expected = (x - PUBLIC.mean(0)) / np.sqrt(PUBLIC.var(0) + 1e-3)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, layer(x, training=False).numpy(), **F32)  # same statistics at inference
    x2 = x.copy()
    x2[1:] = RNG.normal(10.0, 5.0, size=(5, 5))  # change every other private example
    np.testing.assert_allclose(layer(x2, training=True).numpy()[0], y[0], **F32)
    assert [v.name.split("/")[-1].split(":")[0] for v in layer.trainable_weights] == ["gamma", "beta"]


def _deep_model(noisy=False):
    inp = tf.keras.Input((5,))
    h = AppendPublicBatch(public_batch=PUBLIC)(inp)
    first = NoisyDense(4, noise_stddev=0.3) if noisy else tf.keras.layers.Dense(4)
    h = first(h)
    h = PublicBatchNormalization(num_public=16, carried=True)(h)
    h = tf.keras.layers.Dense(3, activation="relu")(h)
    h = PublicBatchNormalization(num_public=16, carried=True, axis=1)(h)
    out = DropPublicBatch(16)(tf.keras.layers.Dense(2)(h))
    return tf.keras.Model(inp, out), first


def test_deep_layer_statistics_come_from_public_activations():
    model, first = _deep_model()
    x = RNG.normal(size=(7, 5)).astype("float32")
    out = model(x, training=True).numpy()
    assert out.shape == (7, 2)
    pbn = model.layers[3]
    # the PBN output of a private example equals normalization with the public batch's activations
    w, b = first.get_weights()
    h_pub, h_priv = PUBLIC @ w + b, x @ w + b
    expected = (h_priv - h_pub.mean(0)) / np.sqrt(h_pub.var(0) + pbn.epsilon)
    sub = tf.keras.Model(model.inputs, pbn.output)
    np.testing.assert_allclose(sub(x).numpy()[:7], expected, rtol=1e-4, atol=1e-4)
    x2 = x.copy()
    x2[1:] *= 50.0
    np.testing.assert_allclose(model(x2, training=True).numpy()[0], out[0], **F32)
    check_per_example_independence(model)


def test_deep_with_noisy_weights_is_per_example_independent_in_training():
    model, _ = _deep_model(noisy=True)
    x = RNG.normal(size=(4, 5)).astype("float32")
    x2 = x.copy()
    x2[1:] = -x2[1:] + 3.0
    tf.random.set_seed(11)
    a = model(x, training=True).numpy()
    tf.random.set_seed(11)  # same weight sample for both calls
    b = model(x2, training=True).numpy()
    np.testing.assert_allclose(a[0], b[0], **F32)
    assert not np.allclose(a[1:], b[1:])
    # the gradient of example 0's loss does not change either
    def grads(xx):
        tf.random.set_seed(11)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(xx, training=True)[0] ** 2)
        return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    for g1, g2 in zip(grads(x), grads(x2), strict=False):
        np.testing.assert_allclose(g1, g2, rtol=1e-6, atol=1e-7)


def test_set_public_batch_and_round_trip():
    layer = PublicBatchNormalization(num_public=16)
    with pytest.raises(ValueError, match="public_batch"):
        layer(np.ones((2, 5), "float32"))  # no public batch yet
    layer.set_public_batch(PUBLIC)
    x = RNG.normal(size=(3, 5)).astype("float32")
    y = layer(x).numpy()
    clone = PublicBatchNormalization.from_config(layer.get_config())
    clone.build((None, 5))
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(x).numpy(), y, **F32)
    with pytest.raises(ValueError, match=r"public_batch: expected shape \(16, 5\)"):
        layer.set_public_batch(PUBLIC[:, :4])
    with pytest.raises(ValueError, match="public_batch"):
        layer.set_public_batch(PUBLIC[:8])


def test_public_batch_set_after_a_model_with_an_input_is_built():
    # The documented "num_public=M, later set_public_batch(x)": building a Sequential with an Input (or a
    # functional model) runs the layer on symbolic inputs, which used to raise (no public batch yet).
    import tfdpbnn

    layer = PublicBatchNormalization(num_public=16)
    model = tf.keras.Sequential([tf.keras.Input((5,)), layer, tf.keras.layers.Dense(3)])
    x = RNG.normal(size=(32, 5)).astype("float32")
    with pytest.raises(ValueError, match="no public batch yet"):
        model(x)
    layer.set_public_batch(PUBLIC)
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=32, batch_size=8, delta=1e-5)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, RNG.integers(0, 3, 32), batch_size=8, epochs=1, verbose=0)
    assert optimizer.steps == 4 and optimizer.privacy_statement()["guarantee"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="public_batch"):
        tf.keras.Sequential([tf.keras.Input((5,)), PublicBatchNormalization(public_batch=PUBLIC[:, :4])])
    with pytest.raises(ValueError, match="num_public"):
        PublicBatchNormalization()
    with pytest.raises(ValueError, match="num_public"):
        PublicBatchNormalization(public_batch=PUBLIC, num_public=3)
    with pytest.raises(ValueError, match="set_public_batch"):
        PublicBatchNormalization(num_public=4, carried=True).set_public_batch(PUBLIC[:4])
    with pytest.raises(ValueError, match="epsilon"):
        PublicBatchNormalization(num_public=4, epsilon=0.0)


def test_public_batch_survives_from_config_and_clone_model():
    x = (RNG.normal(size=(4, 5)) * 3 + 10).astype("float32")
    for stored in (PublicBatchNormalization(public_batch=PUBLIC * 3 + 10),
                   AppendPublicBatch(public_batch=PUBLIC * 3 + 10)):
        fresh = type(stored).from_config(stored.get_config())  # no weights copied
        np.testing.assert_allclose(fresh(x).numpy(), stored(x).numpy(), **F32)
    model = tf.keras.Sequential([tf.keras.Input((5,)), AppendPublicBatch(public_batch=PUBLIC * 3 + 10),
                                 PublicBatchNormalization(num_public=16, carried=True),
                                 PublicBatchNormalization(public_batch=PUBLIC), DropPublicBatch(16)])
    y = model(x).numpy()
    clone = tf.keras.models.clone_model(model)  # re-initializes weights: gamma 1, beta 0 as in `model`
    np.testing.assert_allclose(clone(x).numpy(), y, **F32)
    assert np.abs(y).max() < 10  # normalized; a lost (all-zero) public batch scales by 1/sqrt(1e-3) ~ 32
