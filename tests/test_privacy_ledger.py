"""The privacy ledger's composition and the Poisson batch-size test, against closed forms and simulation."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from tfdpbnn.privacy import gdp_epsilon
from tfdpbnn.privacy.sampling_test import poisson_batch_test
from tfdpbnn.record.ledger import Phase, PrivacyLedger


def _rdp(event, delta=1e-5):
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(delta)


def test_phases_compose_as_one_event():
    ledger = PrivacyLedger([
        Phase("poisson", 1.1, "add_or_remove", steps=100, sample_rate=0.01),
        Phase("participations", 2.0, "add_or_remove", steps=30, participations=3)])
    expected = _rdp(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            0.01, dp_accounting.GaussianDpEvent(1.1)), 100),
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 3)]))
    assert ledger.epsilon(1e-5, "rdp") == pytest.approx(expected, rel=1e-9)
    assert ledger.steps == 130
    assert ledger.gaussian_mu() is None  # a subsampled phase: no exact GDP form


def test_replace_one_doubles_the_sensitivity():
    ledger = PrivacyLedger([Phase("participations", 2.0, "replace_one", steps=5, participations=5)])
    assert ledger.epsilon(1e-5, "rdp") == pytest.approx(
        _rdp(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 5)), rel=1e-9)
    with pytest.raises(ValueError, match="neighboring"):
        ledger.add(Phase("participations", 2.0, "add_or_remove", steps=1, participations=1))


def test_gaussian_phases_have_an_exact_gdp_form():
    ledger = PrivacyLedger([Phase("participations", 2.0, "add_or_remove", steps=8, participations=4),
                            Phase("gaussian", 0.5, "add_or_remove", steps=3)])
    mu = math.sqrt(4 / 2.0 ** 2 + 1 / 0.5 ** 2)
    assert ledger.gaussian_mu() == pytest.approx(mu, rel=1e-12)
    # exact GDP conversion is never above the RDP bound of the same Gaussians
    assert gdp_epsilon(mu, 1e-5) <= ledger.epsilon(1e-5, "rdp") * (1 + 1e-9)


def test_ledger_bookkeeping():
    phase = Phase("poisson", 1.0, "add_or_remove", steps=10, sample_rate=0.1)
    ledger = PrivacyLedger([phase, phase])  # the same phase (by id) is recorded once
    assert len(ledger.phases) == 1
    assert PrivacyLedger(ledger.to_config()).epsilon(1e-5) == pytest.approx(ledger.epsilon(1e-5), rel=1e-12)
    assert PrivacyLedger().epsilon(1e-5) == 0.0
    assert math.isinf(PrivacyLedger([Phase("poisson", 0.0, "add_or_remove", 1, 0.1)]).epsilon(1e-5))
    with pytest.raises(ValueError, match="sound"):
        ledger.epsilon(1e-5, "gdp")
    assert ledger.approximate_epsilon(1e-5, "gdp") > 0
    for bad, name in ((dict(kind="uniform"), "kind"), (dict(sample_rate=0.0), "sample_rate"),
                      (dict(noise_multiplier=-1.0), "noise_multiplier")):
        args = dict(kind="poisson", noise_multiplier=1.0, neighboring="add_or_remove", steps=1,
                    sample_rate=0.1)
        args.update(bad)
        with pytest.raises(ValueError, match=name):
            Phase(**args)


def _sizes_test(sizes, n, q, alpha):
    sizes = np.asarray(sizes, dtype=float)
    return poisson_batch_test(n, q, len(sizes), sizes.sum(), ((sizes - n * q) ** 2).sum(), alpha)


def test_real_poisson_batches_are_rarely_flagged():
    # 400 runs of 20 Binomial(200, 0.05) batches, checked once at t = 20 with alpha = 0.9: the threshold
    # per statistic is 0.9 / (3 * 20 * 21) = 7.1e-4, so at most 3 * 7.1e-4 * 400 = 0.86 flags are expected.
    rng = np.random.default_rng(0)
    flags = sum(_sizes_test(rng.binomial(200, 0.05, 20), 200, 0.05, 0.9).rejected for _ in range(400))
    assert flags <= 5


def test_chernoff_bound_is_above_the_simulated_tail():
    # P(D <= d) and P(D >= d) by simulation (20000 runs, T = 10, n = 60, q = 0.1) never exceed the bound.
    rng = np.random.default_rng(1)
    n, q, steps = 60, 0.1, 10
    d = ((rng.binomial(n, q, (20000, steps)) - n * q) ** 2).sum(axis=1) / (n * q * (1 - q))
    for quantile in (0.001, 0.01, 0.05):
        low = np.quantile(d, quantile)
        result = poisson_batch_test(n, q, steps, n * q * steps, low * n * q * (1 - q))
        assert result.p_dispersion_low >= np.mean(d <= low) - 3 * math.sqrt(quantile / 20000)
        high = np.quantile(d, 1 - quantile)
        result = poisson_batch_test(n, q, steps, n * q * steps, high * n * q * (1 - q))
        assert result.p_dispersion_high >= np.mean(d >= high) - 3 * math.sqrt(quantile / 20000)


def test_total_uses_the_exact_binomial_tail():
    result = _sizes_test([10, 12, 9], 100, 0.1, 1e-6)
    expected = 2 * min(stats.binom.cdf(31, 300, 0.1), stats.binom.sf(30, 300, 0.1))
    assert result.p_total == pytest.approx(min(1.0, expected), rel=1e-9)


def test_fixed_size_and_full_batches_are_caught():
    n, q = 1437, 128 / 1437
    steps_to_flag = next(t for t in range(1, 30) if _sizes_test([128] * t, n, q, 1e-6).rejected)
    assert steps_to_flag <= 8
    assert _sizes_test([n], n, q, 1e-6).rejected  # every example in the first batch
    assert "mean batch size 1437.00" in _sizes_test([n], n, q, 1e-6).describe()
