"""The paired mean-shift bound on mu (tfdpbnn.audit.shift) against the pure Gaussian mechanism (closed form).

N(mu, 1) against N(0, 1) is exactly mu-GDP (Dong, Roth & Su 2019): the bound must cover mu at its stated
confidence, its estimate must be consistent, and its stated power must match the rejection rate of repeated
audits. Every check is a seeded simulation with a stated binomial tolerance.
"""

import math

import numpy as np
import pytest
from scipy import stats

from tfdpbnn.audit.shift import paired_shift_bound, paired_shift_power


def _pairs(rng, mu, k):
    """K paired differences: (N(mu, 1) with the canary) - (N(0, 1) without), independent noise."""
    return rng.normal(mu, 1.0, k) - rng.normal(0.0, 1.0, k)


def test_coverage_matches_the_confidence():
    # 400 audits at confidence 0.9: the number whose bound exceeds the true mu is Binomial(400, <= 0.1).
    rng = np.random.default_rng(0)
    mu, repeats = 0.5, 400
    misses = sum(paired_shift_bound(_pairs(rng, mu, 500), confidence=0.9).mu_lower > mu
                 for _ in range(repeats))
    assert stats.binomtest(misses, repeats, 0.1).pvalue > 1e-3
    assert misses > 10  # the bound is not trivially loose: about 40 expected


def test_estimate_is_consistent_and_bound_below_it():
    rng = np.random.default_rng(1)
    r = paired_shift_bound(_pairs(rng, 0.8, 200_000), confidence=0.999)
    assert r.mu_hat == pytest.approx(0.8, abs=0.015)  # sd of the estimate about 0.0033
    assert r.mu_lower < r.mu_hat and r.mu_lower > 0.8 - 0.03


def test_zero_shift_gives_zero():
    rng = np.random.default_rng(2)
    assert paired_shift_bound(-np.abs(_pairs(rng, 0.0, 1000))).mu_lower == 0.0


def test_replayed_noise_gives_an_unbounded_mu():
    # Both runs of every pair drew the same noise: the differences are the constant shift.
    r = paired_shift_bound(np.full(100, 0.3))
    assert math.isinf(r.mu_lower)


def test_power_matches_repeated_audits():
    # Claim mu = 0.3, truth 1.5 x 0.3, K = 400 pairs, confidence 0.99: stated vs simulated rejection rate.
    rng = np.random.default_rng(3)
    claim, k, repeats = 0.3, 400, 400
    power = paired_shift_power(claim, k, 1.5, 0.99)
    assert 0.2 < power < 0.8  # a region where the check has teeth
    flagged = sum(paired_shift_bound(_pairs(rng, 1.5 * claim, k), 0.99).mu_lower > claim
                  for _ in range(repeats))
    assert stats.binomtest(flagged, repeats, power).pvalue > 1e-3
    # Under the claim itself the test flags at most 1 - confidence of the time.
    assert paired_shift_power(claim, k, 1.0, 0.99) == pytest.approx(0.01, rel=1e-6)


@pytest.mark.parametrize("bad", [dict(differences=[1.0, 2.0]), dict(differences=np.ones(5), confidence=1.0)])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        paired_shift_bound(**bad)
