"""DenseVariational / Conv2DVariational: local reparameterization, KL approximation, pruning, sampling."""

import math

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32
from scipy import integrate

from tfdpbnn.layers import Conv2DVariational, DenseVariational, log_uniform_kl, mc_sampling

N = 20000  # samples for the statistical tests


def _dense(rng, in_dim=4, out=3):
    layer = DenseVariational(out, num_examples=50)
    layer.build((None, in_dim))
    layer.theta.assign(rng.normal(size=(in_dim, out)).astype("float32"))
    layer.log_sigma2.assign(rng.uniform(-3, 0, size=(in_dim, out)).astype("float32"))
    layer.bias.assign(rng.normal(size=(out,)).astype("float32"))
    return layer


def _compare(z_local, z_weights, mean, var):
    """Means agree within 5 standard errors; variances within 7% (about 5 standard errors of N=20000)."""
    se = np.sqrt(2 * var / N)
    assert np.all(np.abs(z_local.mean(0) - z_weights.mean(0)) < 5 * se)
    assert np.all(np.abs(z_local.mean(0) - mean) < 5 * np.sqrt(var / N))
    assert np.allclose(z_local.var(0), z_weights.var(0), rtol=0.07)
    assert np.allclose(z_local.var(0), var, rtol=0.05)


def test_dense_local_reparameterization_matches_weight_sampling():
    rng = np.random.default_rng(0)
    tf.random.set_seed(0)
    layer = _dense(rng)
    x = rng.normal(size=(1, 4)).astype("float32")
    z_local = layer(np.repeat(x, N, axis=0), training=True).numpy()
    theta, sigma = layer.theta.numpy(), np.exp(0.5 * layer.log_sigma2.numpy())
    w = theta + sigma * rng.normal(size=(N,) + theta.shape)
    z_weights = np.einsum("i,nij->nj", x[0], w) + layer.bias.numpy()
    mean = x[0] @ theta + layer.bias.numpy()
    var = (x[0] ** 2) @ sigma ** 2
    _compare(z_local, z_weights, mean, var)
    # independent noise per example: off-diagonal correlation of two examples' outputs near 0
    assert abs(np.corrcoef(z_local[: N // 2, 0], z_local[N // 2:, 0])[0, 1]) < 0.05


def test_conv_local_reparameterization_matches_weight_sampling():
    rng = np.random.default_rng(1)
    tf.random.set_seed(1)
    layer = Conv2DVariational(2, 3, num_examples=50)
    layer.build((None, 4, 4, 1))
    layer.theta.assign(rng.normal(size=(3, 3, 1, 2)).astype("float32"))
    layer.log_sigma2.assign(rng.uniform(-3, 0, size=(3, 3, 1, 2)).astype("float32"))
    x = rng.normal(size=(1, 4, 4, 1)).astype("float32")
    z_local = layer(np.repeat(x, N, axis=0), training=True).numpy().reshape(N, -1)
    patches = tf.image.extract_patches(x, [1, 3, 3, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID").numpy()
    patches = patches.reshape(4, 9)  # 2x2 output positions, kh*kw*in in the kernel's flattening order
    theta = layer.theta.numpy().reshape(9, 2)
    sigma = np.exp(0.5 * layer.log_sigma2.numpy()).reshape(9, 2)
    w = theta + sigma * rng.normal(size=(N, 9, 2))
    z_weights = np.einsum("pk,nko->npo", patches, w).reshape(N, -1)
    mean = (patches @ theta).reshape(-1)
    var = ((patches ** 2) @ sigma ** 2).reshape(-1)
    _compare(z_local, z_weights, mean, var)


def _exact_kl(log_alpha):
    """KL(N(theta, alpha theta^2) || log-uniform) by quadrature: -(0.5 log a - E log|1 + sqrt(a) z| - c)."""
    alpha = math.exp(log_alpha)
    c = (np.euler_gamma + math.log(2.0)) / 2  # makes the KL vanish as alpha -> infinity
    def f(z):
        return math.log(abs(1.0 + math.sqrt(alpha) * z)) * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    z0 = -1.0 / math.sqrt(alpha)
    if -12 < z0 < 12:
        e_log = integrate.quad(f, -12, z0, limit=200)[0] + integrate.quad(f, z0, 12, limit=200)[0]
    else:
        e_log = integrate.quad(f, -12, 12, limit=200)[0]
    return -(0.5 * log_alpha - e_log - c)


def test_kl_approximation_matches_numerical_integration():
    grid = np.linspace(-8, 8, 33)
    approx = log_uniform_kl(tf.constant(grid)).numpy()
    exact = np.array([_exact_kl(a) for a in grid])
    assert np.max(np.abs(approx - exact)) < 1e-2
    assert approx[0] > 4 and abs(approx[-1]) < 1e-3  # large KL for small alpha, ~0 for large alpha


def test_kl_added_with_add_loss_scaled_by_num_examples():
    layer = DenseVariational(3, num_examples=40)
    layer(np.ones((2, 5), "float32"))
    expected = np.sum(log_uniform_kl(layer.log_alpha).numpy()) / 40
    assert len(layer.losses) == 1
    np.testing.assert_allclose(layer.losses[0].numpy(), expected, rtol=1e-6)


def test_pruning_zeroes_exactly_the_weights_above_threshold():
    rng = np.random.default_rng(2)
    layer = DenseVariational(6, num_examples=10, threshold=1.5)
    layer.build((None, 5))
    theta = rng.normal(size=(5, 6)).astype("float32")
    target_log_alpha = rng.uniform(-6, 6, size=(5, 6)).astype("float32")
    layer.theta.assign(theta)
    layer.log_sigma2.assign(target_log_alpha + np.log(theta ** 2 + layer.eps))
    log_alpha = layer.log_alpha.numpy()
    pruned = log_alpha > 1.5
    assert 5 < pruned.sum() < 25
    effective = layer(np.eye(5, dtype="float32")).numpy() - layer.bias.numpy()  # rows = effective kernel
    assert np.all(effective[pruned] == 0.0)
    np.testing.assert_array_equal(effective[~pruned], theta[~pruned])


def test_log_alpha_is_clipped_to_documented_range():
    layer = DenseVariational(2, num_examples=1)
    layer.build((None, 2))
    layer.theta.assign([[1e-6, 1.0], [1.0, 1.0]])
    layer.log_sigma2.assign([[5.0, -30.0], [0.0, 0.0]])
    la = layer.log_alpha.numpy()
    assert la[0, 0] == 8.0 and la[0, 1] == -8.0 and abs(la[1, 0]) < 1e-6


@pytest.mark.parametrize("make,shape", [
    (lambda: DenseVariational(3, num_examples=5), (4, 6)),
    (lambda: Conv2DVariational(2, 2, num_examples=5, padding="same"), (3, 4, 4, 2)),
])
def test_deterministic_repeats_and_mc_differs(make, shape):
    layer = make()
    x = np.random.default_rng(3).normal(size=shape).astype("float32")
    layer(x)
    layer.log_sigma2.assign(tf.fill(layer.log_sigma2.shape, -2.0))
    np.testing.assert_allclose(layer(x).numpy(), layer(x).numpy(), **F32)
    with mc_sampling():
        a, b = layer(x).numpy(), layer(x).numpy()
    assert not np.allclose(a, b)
    assert not np.allclose(layer(x, training=True).numpy(), layer(x, training=True).numpy())
    # a boolean tensor for `training` selects the branch with tf.cond
    np.testing.assert_allclose(layer(x, training=tf.constant(False)).numpy(), layer(x).numpy(), **F32)
    assert not np.allclose(layer(x, training=tf.constant(True)).numpy(), layer(x).numpy())
    assert layer.compute_output_shape(shape) == layer(x).shape


def test_config_round_trip():
    layer = Conv2DVariational(4, (3, 2), num_examples=7, strides=2, padding="same", activation="relu",
                              threshold=2.0)
    clone = Conv2DVariational.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    dense = DenseVariational(3, num_examples=9, use_bias=False)
    assert DenseVariational.from_config(dense.get_config()).get_config() == dense.get_config()


@pytest.mark.parametrize("kwargs,name", [
    ({"units": 0, "num_examples": 3}, "units"),
    ({"units": 2, "num_examples": 0}, "num_examples"),
    ({"units": 2, "num_examples": 3, "eps": 0.0}, "eps"),
    ({"units": 2, "num_examples": 3, "threshold": float("nan")}, "threshold"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DenseVariational(**kwargs)
    with pytest.raises(ValueError, match="padding"):
        Conv2DVariational(2, 3, num_examples=3, padding="full")


@pytest.mark.parametrize("weight", [0.0, 0.25, 1.0])
def test_kl_weight_scales_the_added_kl_exactly(weight):
    x = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    base = DenseVariational(3, num_examples=50)
    base(x)
    tempered = DenseVariational(3, num_examples=50, kl_weight=weight)
    tempered(x)
    tempered.set_weights(base.get_weights())
    base(x, training=True)
    tempered(x, training=True)
    kl = float(tf.reduce_sum(log_uniform_kl(base.log_alpha))) / 50.0
    assert float(base.losses[-1]) == pytest.approx(kl, rel=1e-5)
    assert float(tempered.losses[-1]) == pytest.approx(weight * kl, rel=1e-5, abs=1e-7)
    assert DenseVariational.from_config(tempered.get_config()).kl_weight == weight


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "1", None])
def test_kl_weight_refuses_bad_values(bad):
    with pytest.raises(ValueError, match="kl_weight"):
        DenseVariational(3, num_examples=50, kl_weight=bad)
