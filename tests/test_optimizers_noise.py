"""The fused Box-Muller noise of the DP optimizers (``tfdpbnn.optimizers.noise``) is N(0, s^2), i.i.d.

Statistical tests with fixed seeds; each asserts a property a wrong sampler would fail (wrong scale, a
shifted mean, dependence between the cos and sin halves or between variables, repeated draws, wrong tails).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfdpbnn.optimizers.noise import gaussian_noise_like

SHAPES = [(301, 200), (7,), (200, 3), (1,)]   # 60,808 numbers: an even total, with odd-sized variables


def draw(stddev, shapes=SHAPES, seed=0):
    tf.keras.utils.set_random_seed(seed)
    return [z.numpy() for z in gaussian_noise_like([tf.zeros(s) for s in shapes], stddev)]


def test_shapes_dtypes_and_zero_stddev():
    out = gaussian_noise_like([tf.zeros(s) for s in SHAPES] + [tf.zeros((3, 2), tf.float64)], 1.0)
    assert [tuple(z.shape) for z in out] == SHAPES + [(3, 2)]
    assert [z.dtype for z in out] == [tf.float32] * len(SHAPES) + [tf.float64]
    assert all(np.all(z.numpy() == 0) for z in gaussian_noise_like([tf.zeros((5, 3))], 0.0))
    assert gaussian_noise_like([], 1.0) == []
    odd = gaussian_noise_like([tf.zeros((3, 3))], 2.0)[0]   # an odd total: one number is dropped, not reused
    assert odd.shape == (3, 3) and len(np.unique(odd.numpy())) == 9


def test_distribution_matches_gaussian():
    s = 0.37
    z = np.concatenate([np.ravel(a) for a in draw(s)] + [np.ravel(a) for a in draw(s, seed=1)])
    # Kolmogorov-Smirnov against N(0, s^2): 121,616 numbers detect a 1% error in the scale.
    assert stats.kstest(z / s, "norm").pvalue > 1e-3
    # Variance: chi-square with k degrees of freedom; mean within 5 standard errors.
    k = z.size
    chi = np.sum((z / s) ** 2)
    assert 2 * min(stats.chi2.cdf(chi, k), stats.chi2.sf(chi, k)) > 1e-3
    assert abs(z.mean()) < 5 * s / np.sqrt(k)
    # Tails: P(|z| > 3 s) = 0.0027; the count is binomial. The largest |z| is near the expected maximum.
    tail = np.sum(np.abs(z) > 3 * s)
    assert stats.binomtest(int(tail), k, 2 * stats.norm.sf(3)).pvalue > 1e-3
    assert 3.8 * s < np.abs(z).max() < 5.7 * s   # float32 uniforms bound the radius at 5.65 s


def test_halves_variables_and_steps_are_independent():
    z = np.concatenate([np.ravel(a) for a in draw(1.0)])
    half = z.size // 2
    cos_part, sin_part = z[:half], z[half:]
    # Box-Muller's pair (r cos t, r sin t) is uncorrelated, and so are their squares (independence, not
    # just zero correlation: a wrong angle would correlate the magnitudes).
    for a, b in ((cos_part, sin_part), (cos_part ** 2, sin_part ** 2)):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(half)
    # Two consecutive draws in one process (two DP steps) are different and uncorrelated.
    first = gaussian_noise_like([tf.zeros((20000,))], 1.0)[0].numpy()
    second = gaussian_noise_like([tf.zeros((20000,))], 1.0)[0].numpy()
    assert abs(np.corrcoef(first, second)[0, 1]) < 5 / np.sqrt(20000)
    # The global seed makes a run reproducible, as tf.random.normal does.
    np.testing.assert_array_equal(draw(1.0, seed=3)[0], draw(1.0, seed=3)[0])


def test_tensor_stddev_in_a_graph():
    stddev = tf.Variable(2.5)

    @tf.function
    def f():
        return gaussian_noise_like([tf.zeros((40000,))], stddev)[0]

    tf.keras.utils.set_random_seed(4)
    z = f().numpy()
    assert abs(z.std() / 2.5 - 1) < 0.02
    stddev.assign(0.5)
    assert abs(f().numpy().std() / 0.5 - 1) < 0.02   # the variable is read each call, not baked in


def test_unknown_shape_is_refused():
    @tf.function(input_signature=[tf.TensorSpec([None])])
    def f(x):
        return gaussian_noise_like([x], 1.0)

    with pytest.raises(ValueError, match="tensors"):
        f.get_concrete_function()
