"""The fused Box-Muller noise of the DP optimizers (``tfdpbnn.privacy.noise``) is N(0, s^2), i.i.d.

Statistical tests with fixed seeds; each asserts a property a wrong sampler would fail (wrong scale, a
shifted mean, dependence between the cos and sin halves or between variables, repeated draws, wrong tails).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tfdpbnn.privacy import noise
from tfdpbnn.privacy.noise import exponential_variates, gaussian_noise_like, max_radius

SHAPES = [(301, 200), (7,), (200, 3), (1,)]   # 60,808 numbers: an even total, with odd-sized variables


def draw(stddev, shapes=SHAPES, seed=0):
    """One draw from a key replayable from ``seed`` (fixed-seed statistics)."""
    return [z.numpy() for z in gaussian_noise_like([tf.zeros(s) for s in shapes], stddev,
                                                   key=noise.NoiseKey(debug_seed=seed))]


def test_shapes_dtypes_and_zero_stddev():
    out = gaussian_noise_like([tf.zeros(s) for s in SHAPES] + [tf.zeros((3, 2), tf.float64)], 1.0)
    assert [tuple(z.shape) for z in out] == SHAPES + [(3, 2)]
    assert [z.dtype for z in out] == [tf.float32] * len(SHAPES) + [tf.float64]
    assert all(np.all(z.numpy() == 0) for z in gaussian_noise_like([tf.zeros((5, 3))], 0.0))
    assert gaussian_noise_like([], 1.0) == []
    # An odd total: one number is dropped, not reused (a replayable key: nine distinct float32 values are
    # then fixed, where the default key's fresh draw held two equal ones with probability about 7e-7:
    # 36 pairs, each equal in float32 with probability about 2^-23 / (2 pi)).
    odd = gaussian_noise_like([tf.zeros((3, 3))], 2.0, key=noise.NoiseKey(debug_seed=5))[0]
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
    assert 3.8 * s < np.abs(z).max() < 5.7 * s   # the expected maximum of 121,616 |z| is about 4.4 s


def test_halves_variables_and_steps_are_independent():
    z = np.concatenate([np.ravel(a) for a in draw(1.0)])
    half = z.size // 2
    cos_part, sin_part = z[:half], z[half:]
    # Box-Muller's pair (r cos t, r sin t) is uncorrelated, and so are their squares (independence, not
    # just zero correlation: a wrong angle would correlate the magnitudes).
    for a, b in ((cos_part, sin_part), (cos_part ** 2, sin_part ** 2)):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(half)
    # Two consecutive draws in one process (two DP steps) are different and uncorrelated. They come from the
    # process-wide default key, drawn by whichever test used it first (not seeded by this test): two fresh
    # draws of 20,000 exceed 6 / sqrt(20000) with probability 2e-9 each (5 / sqrt(n) was 5.7e-7 each);
    # replayed noise gives r = 1.
    first = gaussian_noise_like([tf.zeros((20000,))], 1.0)[0].numpy()
    second = gaussian_noise_like([tf.zeros((20000,))], 1.0)[0].numpy()
    assert abs(np.corrcoef(first, second)[0, 1]) < 6 / np.sqrt(20000)
    # A replayable key replays; TensorFlow's global seed does not replay the default key's noise.
    np.testing.assert_array_equal(draw(1.0, seed=3)[0], draw(1.0, seed=3)[0])
    tf.keras.utils.set_random_seed(0)
    first = gaussian_noise_like([tf.zeros((20000,))], 1.0)[0].numpy()
    tf.keras.utils.set_random_seed(0)
    second = gaussian_noise_like([tf.zeros((20000,))], 1.0)[0].numpy()
    assert abs(np.corrcoef(first, second)[0, 1]) < 6 / np.sqrt(20000)


def test_tensor_stddev_in_a_graph():
    stddev = tf.Variable(2.5)
    key = noise.NoiseKey(debug_seed=4)

    @tf.function
    def f():
        return gaussian_noise_like([tf.zeros((40000,))], stddev, key=key)[0]

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


def test_radius_tail_is_not_cut_where_it_matters():
    # The largest attainable radius (every one of the 4 words 0): sqrt(2 (32 * 4 + 1) log 2) = 13.37.
    assert max_radius(2.0) == pytest.approx(2.0 * np.sqrt(2 * 129 * np.log(2)), rel=1e-12)
    assert max_radius(1.0) > 13.3
    # The Gaussian mass beyond it is < 1e-39 per coordinate; the per-step reveal probability of an example
    # whose clipped gradient lies in one coordinate, exp(-(r_max - 1/sigma)^2 / 2), is < 1e-28 at sigma 0.5.
    assert 2 * stats.norm.sf(max_radius(1.0)) < 1e-39
    assert noise.tail_reveal_probability(0.5) < 1e-28
    assert noise.tail_reveal_probability(1.0) == pytest.approx(np.exp(-(max_radius(1.0) - 1) ** 2 / 2))
    with pytest.raises(ValueError, match="noise_multiplier"):
        noise.tail_reveal_probability(0.0)


def test_radius_recursion_is_exact_with_short_words():
    # 4-bit words make the continuation frequent: E > 4k log 2 exactly when the first k words are 0, with
    # probability 16^-k; beyond one word, E - 4 log 2 is again distributed as E (memorylessness).
    size, bits = 1_000_000, 4
    e = exponential_variates(size, tf.constant([5, 6], tf.int64), words=4, word_bits=bits).numpy()
    step = np.float32(bits * np.log(2))   # float32 arithmetic with e under numpy 1 and 2 alike
    for k in (1, 2, 3):
        count = int(np.sum(e > k * step + 1e-4))
        assert stats.binomtest(count, size, 16.0 ** -k).pvalue > 1e-3, (k, count)
    assert e.max() == pytest.approx((4 * bits + 1) * np.log(2), rel=1e-6)   # the cut: all 4 words 0
    assert e.min() >= 0
    rest = e[e > step + 1e-4] - step   # rounded: both are 16 atoms per word, equal up to float32 rounding
    assert stats.ks_2samp(np.round(rest, 4), np.round(e[:200_000], 4)).pvalue > 1e-3


def test_tail_frequencies_beyond_five_sigma():
    # 10^8 numbers in 20 fixed-seed chunks. |z| > 5: probability 5.73e-7, about 57 expected. A radius above
    # 5.66 (probability exp(-5.66^2 / 2) = 1.1e-7 per pair, about 5.5 expected in 5e7 pairs) was impossible
    # with float32 uniforms (their radius stops at 5.65).
    pairs = 2_500_000

    @tf.function
    def counts(seed):
        z = gaussian_noise_like([tf.zeros((2 * pairs,))], 1.0, seed)[0]
        r2 = tf.square(z[:pairs]) + tf.square(z[pairs:])
        return (tf.reduce_sum(tf.cast(tf.abs(z) > 5.0, tf.int64)),
                tf.reduce_sum(tf.cast(r2 > 5.66 ** 2, tf.int64)), tf.reduce_max(tf.abs(z)))

    beyond5 = radius = 0
    for chunk in range(20):
        a, b, top = counts(tf.constant([chunk, 99], tf.int64))
        beyond5, radius = beyond5 + int(a), radius + int(b)
        assert float(top) <= max_radius(1.0)
    assert stats.binomtest(beyond5, 40 * pairs, 2 * stats.norm.sf(5.0)).pvalue > 1e-3, beyond5
    assert radius >= 1
    assert stats.binomtest(radius, 20 * pairs, np.exp(-5.66 ** 2 / 2)).pvalue > 1e-3, radius


def test_secure_mode_seeds_from_os_entropy():
    with pytest.raises(ValueError, match="enabled"):
        noise.set_secure_mode(1)
    assert noise.secure_mode() is False

    @tf.function
    def f():
        return gaussian_noise_like([tf.zeros((40000,))], 2.0, secure=True)[0]

    tf.keras.utils.set_random_seed(0)
    first = f().numpy()
    tf.keras.utils.set_random_seed(0)
    second = f().numpy()   # the global seed does not replay secure noise
    assert abs(np.corrcoef(first, second)[0, 1]) < 5 / np.sqrt(40000)
    assert abs(first.std() / 2.0 - 1) < 0.02
    noise.set_secure_mode(True)
    try:
        tf.keras.utils.set_random_seed(0)
        a = gaussian_noise_like([tf.zeros((1000,))], 1.0)[0].numpy()
        tf.keras.utils.set_random_seed(0)
        b = gaussian_noise_like([tf.zeros((1000,))], 1.0)[0].numpy()
    finally:
        noise.set_secure_mode(False)
    assert not np.allclose(a, b)
