"""The f-DP one-run audit (Mahloujifar, Melis & Chaudhuri 2024; tfdpbnn.audit.fdp_one_run): its recursion
against the closed form of one guess, its coverage on simulated Gaussian canaries at a known mu, and that it
is at least as high as Steinke et al.'s (epsilon, delta) bound on the same scores."""

import numpy as np
import pytest
from scipy import stats

from tfdpbnn.audit.bounds import one_run_epsilon
from tfdpbnn.audit.fdp_one_run import fdp_claim_rejected, gdp_tradeoff, one_run_gdp_bound
from tfdpbnn.privacy.gdp import gdp_epsilon


@pytest.mark.parametrize("mu,alpha,m", [(0.0, 0.05, 10), (0.0, 0.6, 10), (1.0, 0.05, 3), (3.0, 0.2, 50)])
def test_one_correct_guess_matches_its_closed_form(mu, alpha, m):
    # k = c = 1: r = alpha / m, h = f(1 - r); rejected iff alpha / m + Phi(Phi^-1(alpha / m) - mu) > 1 / m.
    expected = alpha / m + stats.norm.cdf(stats.norm.ppf(alpha / m) - mu) > 1 / m
    assert fdp_claim_rejected(gdp_tradeoff(mu), m, 1, 1, alpha) == expected


def test_no_correct_guess_rejects_nothing_and_perfect_guesses_reject_perfect_privacy():
    assert not fdp_claim_rejected(gdp_tradeoff(0.0), 100, 20, 0, 0.05)
    assert fdp_claim_rejected(gdp_tradeoff(0.0), 100, 20, 20, 0.05)
    assert not fdp_claim_rejected(gdp_tradeoff(10.0), 100, 20, 20, 0.05)  # mu = 10 allows it


@pytest.mark.slow   # not in the fast tier: simulated canary runs (an audit)
def test_coverage_on_simulated_gaussian_canaries():
    # 80 one-run audits of canaries released through exactly mu-GDP channels (mu = 1.5): the 80%-confidence
    # bound may exceed the true mu in at most 20% of them (binomial test at level 0.001).
    rng = np.random.default_rng(0)
    mu, trials, above = 1.5, 80, 0
    for _ in range(trials):
        included = rng.random(100) < 0.5
        scores = mu * included + rng.normal(size=100)
        above += one_run_gdp_bound(scores, included, 1e-5, confidence=0.8).mu > mu
    assert stats.binomtest(above, trials, 0.2, alternative="greater").pvalue > 1e-3


def test_at_least_as_high_as_steinke_et_al_on_strong_canaries():
    rng = np.random.default_rng(1)
    included = rng.random(500) < 0.5
    scores = 4.0 * included + rng.normal(size=500)
    fdp = one_run_gdp_bound(scores, included, 1e-5)
    assert fdp.epsilon == pytest.approx(gdp_epsilon(fdp.mu, 1e-5))
    assert fdp.epsilon > one_run_epsilon(scores, included, 1e-5).epsilon
    assert 0 < fdp.mu < 4.0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="included"):
        one_run_gdp_bound([0.1, 0.2], [1, 0], 1e-5)
    with pytest.raises(ValueError, match="guesses"):
        one_run_gdp_bound([0.1, 0.2], np.array([True, False]), 1e-5, guesses=[3])
    with pytest.raises(ValueError, match="num_correct"):
        fdp_claim_rejected(gdp_tradeoff(1.0), 10, 2, 3, 0.05)
