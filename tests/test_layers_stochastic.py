"""DenseBayesByBackprop, MCDropout, NoisyDense, NoisyConv2D: distributions, sampling modes, bad input."""

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32

from tfdpbnn.layers import DenseBayesByBackprop, MCDropout, NoisyConv2D, NoisyDense, mc_sampling

N = 20000


def test_bbb_local_reparameterization_matches_weight_sampling():
    rng = np.random.default_rng(0)
    tf.random.set_seed(0)
    layer = DenseBayesByBackprop(3, num_examples=10)
    layer.build((None, 4))
    layer.kernel_mu.assign(rng.normal(size=(4, 3)).astype("float32"))
    layer.kernel_rho.assign(rng.uniform(-1, 0.5, size=(4, 3)).astype("float32"))
    layer.bias_mu.assign(rng.normal(size=(3,)).astype("float32"))
    layer.bias_rho.assign(np.full(3, -0.5, "float32"))
    x = rng.normal(size=(1, 4)).astype("float32")
    z_local = layer(np.repeat(x, N, 0), training=True).numpy()
    sw = np.log1p(np.exp(layer.kernel_rho.numpy()))
    sb = np.log1p(np.exp(layer.bias_rho.numpy()))
    w = layer.kernel_mu.numpy() + sw * rng.normal(size=(N, 4, 3))
    b = layer.bias_mu.numpy() + sb * rng.normal(size=(N, 3))
    z_w = np.einsum("i,nij->nj", x[0], w) + b
    var = (x[0] ** 2) @ sw ** 2 + sb ** 2
    assert np.all(np.abs(z_local.mean(0) - z_w.mean(0)) < 5 * np.sqrt(2 * var / N))
    np.testing.assert_allclose(z_local.var(0), z_w.var(0), rtol=0.07)
    np.testing.assert_allclose(z_local.var(0), var, rtol=0.05)


def test_bbb_closed_form_kl_and_scaling():
    layer = DenseBayesByBackprop(2, num_examples=25, prior_scale=0.5)
    layer(np.ones((3, 3), "float32"))
    mus = [layer.kernel_mu.numpy(), layer.bias_mu.numpy()]
    sigmas = [np.log1p(np.exp(layer.kernel_rho.numpy())), np.log1p(np.exp(layer.bias_rho.numpy()))]
    p = 0.5
    kl = sum(np.sum(np.log(p / s) + (s ** 2 + m ** 2) / (2 * p ** 2) - 0.5)
             for m, s in zip(mus, sigmas, strict=True))
    np.testing.assert_allclose(layer.kl_divergence().numpy(), kl, rtol=1e-5)
    np.testing.assert_allclose(layer.losses[0].numpy(), kl / 25, rtol=1e-5)


def test_bbb_sampling_modes_and_config():
    layer = DenseBayesByBackprop(3, num_examples=5, activation="tanh", kernel_rho_initializer="zeros")
    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    np.testing.assert_allclose(layer(x).numpy(), layer(x).numpy(), **F32)
    np.testing.assert_allclose(layer(x).numpy(), np.tanh(x @ layer.kernel_mu.numpy()), rtol=1e-5, atol=1e-6)
    with mc_sampling():
        assert not np.allclose(layer(x).numpy(), layer(x).numpy())
    clone = DenseBayesByBackprop.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="prior_scale"):
        DenseBayesByBackprop(3, num_examples=5, prior_scale=0.0)


@pytest.mark.parametrize("gaussian", [False, True])
def test_mc_dropout_moments(gaussian):
    tf.random.set_seed(2)
    rate = 0.3
    layer = MCDropout(rate, gaussian=gaussian)
    x = np.ones((N, 1), "float32")
    np.testing.assert_array_equal(layer(x).numpy(), x)  # identity at inference
    with mc_sampling():
        y = layer(x).numpy()[:, 0]
    # multiplier has mean 1 and variance rate / (1 - rate) in both variants; tolerances ~5 standard errors
    assert abs(y.mean() - 1) < 5 * np.sqrt(rate / (1 - rate) / N)
    assert abs(y.var() - rate / (1 - rate)) < 0.03
    if not gaussian:
        assert abs(np.mean(y == 0) - rate) < 5 * np.sqrt(rate * (1 - rate) / N)
    y2 = layer(x, training=True).numpy()[:, 0]
    assert not np.array_equal(y, y2)


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5])
def test_mc_dropout_bad_rate(rate):
    with pytest.raises(ValueError, match=r"rate must lie in \[0.0, 1.0\)"):
        MCDropout(rate)


def test_noisy_dense_shared_sample_and_variance():
    tf.random.set_seed(3)
    s = 0.2
    layer = NoisyDense(2, noise_stddev=s)
    x = np.random.default_rng(4).normal(size=(1, 3)).astype("float32")
    layer.build((None, 3))
    assert not layer.noise_stddev.trainable and layer.noise_stddev.shape == ()
    assert layer.noise_stddev in layer.non_trainable_weights
    # one weight sample per call, shared by the batch: identical rows give identical outputs
    out = layer(np.repeat(x, 5, 0), training=True).numpy()
    np.testing.assert_allclose(out, np.repeat(out[:1], 5, 0), **F32)
    # across calls z_j = x theta_j + b_j has variance s^2 (|x|^2 + 1)
    sample = tf.function(lambda: layer(x, training=True))
    draws = np.stack([sample().numpy()[0] for _ in range(2000)])
    expected_var = s ** 2 * (np.sum(x ** 2) + 1)
    np.testing.assert_allclose(draws.var(0), expected_var, rtol=0.15)  # 2000 draws: ~3.2% s.e. per unit
    mean = x @ layer.kernel.numpy() + layer.bias.numpy()
    np.testing.assert_allclose(layer(x).numpy(), mean, **F32)  # inference: the means
    with mc_sampling():
        assert not np.allclose(layer(x).numpy(), layer(x).numpy())
    layer.noise_stddev.assign(0.0)  # what an optimizer does each step
    np.testing.assert_allclose(layer(x, training=True).numpy(), mean, rtol=1e-6)


def test_noisy_inference_noise_and_sample_into_kernel():
    tf.random.set_seed(5)
    layer = NoisyConv2D(8, 3, noise_stddev=0.5, inference_noise=True, padding="same")
    x = np.ones((1, 5, 5, 2), "float32")
    assert not np.allclose(layer(x).numpy(), layer(x).numpy())
    layer.inference_noise = False
    mu = layer.kernel.numpy()
    np.testing.assert_allclose(layer(x).numpy(), layer(x).numpy(), **F32)
    layer.sample_weights_into_kernel()
    diff = layer.kernel.numpy() - mu
    assert abs(diff.std() - 0.5) < 0.1 and abs(diff.mean()) < 0.1  # 144 draws of N(0, 0.25)
    assert not np.allclose(layer.bias.numpy(), 0.0)
    clone = NoisyConv2D.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_noisy_bad_noise_std():
    with pytest.raises(ValueError, match="noise_stddev"):
        NoisyDense(3, noise_stddev=-0.1)
    layer = NoisyDense(3)
    layer.build((None, 2))
    with pytest.raises(ValueError, match="noise_stddev"):
        layer.set_noise_stddev(-1.0)
    layer.set_noise_stddev(0.7)
    assert layer.noise_stddev.numpy() == pytest.approx(0.7)


def test_mc_sampling_ends_with_its_block():
    model = tf.keras.Sequential([tf.keras.Input((3,)), MCDropout(0.5), tf.keras.layers.Dense(4)])
    x = np.ones((6, 3), "float32")
    sample = tf.function(lambda t: model(t, training=False))
    with mc_sampling():
        inside = model.predict(x, verbose=0)  # Keras traces and caches its predict function here
        assert not np.allclose(inside, model.predict(x, verbose=0))
        assert not np.allclose(sample(x), sample(x))
    np.testing.assert_allclose(model.predict(x, verbose=0), model(x).numpy(), **F32)  # deterministic again
    np.testing.assert_allclose(sample(x), model(x).numpy(), **F32)
    with mc_sampling():  # the same traced function samples again inside a new block
        assert not np.allclose(sample(x), sample(x))


def test_heteroscedastic_head_is_a_layer():
    import tfdpbnn.layers
    import tfdpbnn.uncertainty

    assert tfdpbnn.layers.HeteroscedasticHead is tfdpbnn.uncertainty.HeteroscedasticHead
    assert issubclass(tfdpbnn.layers.HeteroscedasticHead, tf.keras.layers.Layer)
