"""Estimators of tfdpbnn.audit against closed forms and simulated mechanisms with known epsilon."""

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from tfdpbnn.audit import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    gdp_lower_bound,
    max_multi_run_epsilon,
    multi_run_epsilon,
    one_run_epsilon,
    one_run_epsilon_from_counts,
    one_run_p_value,
)
from tfdpbnn.privacy.gdp import gdp_epsilon

DELTA = 1e-5


def gaussian_mu(epsilon, delta=DELTA):
    """mu of the Gaussian mechanism (mu-GDP, exact) whose epsilon at delta is ``epsilon``."""
    return optimize.brentq(lambda m: gdp_epsilon(m, delta) - epsilon, 1e-4, 50.0)


def test_clopper_pearson_matches_scipy_and_closed_form():
    for k, n in [(0, 10), (3, 10), (17, 200), (199, 200)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
        np.testing.assert_allclose(clopper_pearson_upper(k, n, 0.05), ci.high, rtol=1e-6)
        np.testing.assert_allclose(clopper_pearson_lower(k, n, 0.05), ci.low, rtol=1e-6, atol=1e-12)
    # zero successes: P[Bin(n, p) = 0] = (1 - p)^n = alpha
    np.testing.assert_allclose(clopper_pearson_upper(0, 500, 0.025), 1 - 0.025 ** (1 / 500), rtol=1e-9)
    assert clopper_pearson_upper(7, 7, 0.05) == 1.0


def test_max_multi_run_epsilon_closed_form():
    # perfect separation with 500 runs each: log((1 - FNR_ub) / FPR_ub), FPR_ub = 1 - 0.025^(1/500)
    fpr = 1 - 0.025 ** (1 / 500)
    np.testing.assert_allclose(max_multi_run_epsilon(500, 500), math.log((1 - fpr) / fpr), rtol=1e-9)


@pytest.mark.parametrize("epsilon", [2.0, 8.0])
def test_gaussian_mechanism_bounds_below_and_close(epsilon):
    """Gaussian mechanism with known epsilon (mu-GDP, 100k runs per side): every bound is below the truth,
    the GDP bound within 10% of mu, the (epsilon, delta) bound at least 35% of epsilon (it is limited by
    resolving false-positive rates near delta)."""
    mu = gaussian_mu(epsilon)
    rng = np.random.default_rng(0)
    ins, outs = rng.normal(mu, 1, 100_000), rng.normal(0, 1, 100_000)
    ed = multi_run_epsilon(ins, outs, delta=DELTA)
    g = gdp_lower_bound(ins, outs, delta=DELTA, threshold=mu / 2)
    assert 0.35 * epsilon < ed.epsilon < epsilon
    assert 0.9 * mu < g.mu < mu
    assert 0.85 * epsilon < g.epsilon < epsilon


@pytest.mark.parametrize("strategy", ["split", "bonferroni", "fixed"])
def test_multi_run_bound_is_valid_at_95_percent(strategy):
    """Coverage: over 200 repetitions with 100 runs per side, the bound exceeds the true epsilon in at most
    5% of them (with binomial slack: P[Binomial(200, 0.05) > 21] < 0.001). A Gaussian shift of mu = 2.5
    has a large epsilon at delta = 1e-5 but at delta = 0.2 a moderate one, which 100-run audits reach."""
    mu, delta = 2.5, 0.2
    true_eps = gdp_epsilon(mu, delta)
    rng = np.random.default_rng(1)
    exceed_ed = exceed_gdp = 0
    for rep in range(200):
        ins, outs = rng.normal(mu, 1, 100), rng.normal(0, 1, 100)
        threshold = mu / 2 if strategy == "fixed" else strategy
        ed = multi_run_epsilon(ins, outs, delta=delta, threshold=threshold, seed=rep)
        exceed_ed += ed.epsilon > true_eps
        exceed_gdp += gdp_lower_bound(ins, outs, delta=delta, threshold=threshold, seed=rep).mu > mu
    assert exceed_ed <= 21 and exceed_gdp <= 21


def test_multi_run_bound_monotone_in_evidence():
    """Fewer false positives (or negatives) at a fixed threshold never lower the bound."""
    outs = np.zeros(200)
    ins = np.ones(200)
    previous = -1.0
    for fp in range(60, -1, -10):
        o = outs.copy()
        o[:fp] = 1.0  # fp runs without the canary look like runs with it
        eps = multi_run_epsilon(ins, o, delta=DELTA, threshold=0.5).epsilon
        assert eps >= previous
        previous = eps
    assert previous == pytest.approx(max_multi_run_epsilon(200, 200, DELTA))


def test_one_run_p_value_closed_forms():
    m, r, v = 1000, 100, 70
    p = special.expit(1.0)
    assert one_run_p_value(m, r, v, 1.0) == pytest.approx(stats.binom.sf(v - 1, r, p))
    # the delta term: f(v) + 2 m delta max_i (f(v - i) - f(v)) / i
    f = lambda k: stats.binom.sf(k - 1, r, p)  # noqa: E731
    expected = f(v) + 2 * m * 1e-4 * max((f(v - i) - f(v)) / i for i in range(1, v + 1))
    assert one_run_p_value(m, r, v, 1.0, delta=1e-4) == pytest.approx(expected)
    # r correct guesses out of r, delta 0: p^r = alpha, so eps = logit(alpha^(1/r))
    assert one_run_epsilon_from_counts(m, r, r, 0.0, 0.95) == pytest.approx(special.logit(0.05 ** (1 / r)),
                                                                             rel=1e-5)


def test_one_run_bound_monotone_in_evidence():
    bounds = [one_run_epsilon_from_counts(1000, 200, v, DELTA) for v in range(100, 201, 10)]
    assert all(b2 >= b1 for b1, b2 in zip(bounds, bounds[1:], strict=False))
    assert bounds[0] == 0.0 and bounds[-1] > 3.0


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_one_run_randomized_response_close_to_epsilon(epsilon):
    """eps-DP randomized response on 20000 canaries (the mechanism the one-run bound is tight for): the
    bound is below epsilon and within 15% of it."""
    rng = np.random.default_rng(0)
    included = rng.random(20_000) < 0.5
    truthful = rng.random(20_000) < special.expit(epsilon)
    scores = np.where(truthful == included, 1.0, 0.0) + 1e-6 * rng.random(20_000)  # tiny tie-break
    result = one_run_epsilon(scores, included, delta=0.0, guesses=[(10_000, 10_000)])
    assert 0.85 * epsilon < result.epsilon < epsilon


def test_one_run_gaussian_below_truth():
    rng = np.random.default_rng(3)
    mu = gaussian_mu(4.0)
    included = rng.random(1000) < 0.5
    scores = rng.normal(np.where(included, mu, 0.0), 1.0)
    result = one_run_epsilon(scores, included, delta=DELTA)
    assert 0.3 < result.epsilon < 4.0


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="confidence"):
        multi_run_epsilon([1.0, 2.0], [0.0, 1.0], confidence=1.5)
    with pytest.raises(ValueError, match="threshold"):
        multi_run_epsilon([1.0, 2.0], [0.0, 1.0], threshold="best")
    with pytest.raises(ValueError, match="included must be boolean"):
        one_run_epsilon([1.0, 2.0], [1, 0])
    with pytest.raises(ValueError, match="guesses"):
        one_run_epsilon([1.0, 2.0], np.array([True, False]), guesses=[(2, 1)])
    with pytest.raises(ValueError, match="num_correct"):
        one_run_p_value(10, 5, 6, 1.0)
