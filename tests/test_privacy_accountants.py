"""Closed forms, equality with dp-accounting, and soundness against PLD for tfdpbnn's accountants."""

import math
import warnings

import dp_accounting as dpa
import numpy as np
import pytest
from _exact_gaussian import gaussian_delta, gaussian_epsilon
from scipy import integrate, stats

from tfdpbnn.privacy import (
    AdvancedCompositionAccountant,
    GDPAccountant,
    ZCDPAccountant,
    available_accountants,
    compute_epsilon,
    dp_sgd_event,
    get_accountant,
    register_accountant,
    sound_accountants,
)
from tfdpbnn.privacy.gdp import gdp_delta, gdp_epsilon

DELTA = 1e-5


def test_registry_names_and_soundness_flags():
    assert set(available_accountants()) >= {"rdp", "pld", "zcdp", "gdp", "ac"}
    assert set(sound_accountants()) >= {"rdp", "pld", "zcdp", "ac"}
    assert "gdp" not in sound_accountants()
    assert isinstance(get_accountant("rdp"), dpa.rdp.RdpAccountant)
    assert isinstance(get_accountant("pld"), dpa.pld.PLDAccountant)
    assert isinstance(get_accountant("ac", delta_prime=1e-7), AdvancedCompositionAccountant)
    for name in ("zcdp", "gdp", "ac"):
        assert isinstance(get_accountant(name), dpa.PrivacyAccountant)


def test_register_custom_accountant():
    register_accountant("rdp_small_orders", lambda **kw: dpa.rdp.RdpAccountant(orders=[2, 4, 8], **kw))
    assert "rdp_small_orders" in available_accountants()
    assert "rdp_small_orders" not in sound_accountants()
    eps = compute_epsilon(1.0, 0.01, 100, DELTA, accountant="rdp_small_orders")
    assert eps >= compute_epsilon(1.0, 0.01, 100, DELTA, accountant="rdp") - 1e-9


# ---- zCDP closed forms (Bun & Steinke 2016, Prop. 1.3, 1.6, Lemma 1.7) ----

@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 10.0])
def test_zcdp_gaussian_rho_and_composition(sigma):
    acc = ZCDPAccountant().compose(dpa.GaussianDpEvent(sigma))
    assert acc.rho == pytest.approx(1.0 / (2.0 * sigma ** 2), rel=1e-12)
    acc.compose(dpa.GaussianDpEvent(2 * sigma), 3)
    assert acc.rho == pytest.approx(1.0 / (2.0 * sigma ** 2) + 3.0 / (8.0 * sigma ** 2), rel=1e-12)


@pytest.mark.parametrize("rho_sigma,delta", [(1.0, 1e-5), (5.0, 1e-6), (30.0, 1e-3)])
def test_zcdp_conversion_tighter_than_classical_and_above_exact(rho_sigma, delta):
    acc = ZCDPAccountant().compose(dpa.GaussianDpEvent(rho_sigma), 10)
    rho = 10 / (2 * rho_sigma ** 2)
    eps = acc.get_epsilon(delta)
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12
    # ... but not below the exact epsilon of the composed Gaussian (sigma / sqrt(10), Balle & Wang 2018).
    assert eps >= gaussian_epsilon(rho_sigma / math.sqrt(10), delta) - 1e-9
    assert acc.get_delta(eps) <= delta * (1 + 1e-6)


def test_zcdp_subsampled_is_not_rho_zcdp_and_not_below_rdp():
    event = dp_sgd_event(1.1, 0.01, 1000)
    acc = ZCDPAccountant().compose(event)
    assert acc.rho is None  # truncated CDP, not plain zCDP
    omegas, rhos = acc.tcdp_curve
    assert np.all(np.diff(rhos) >= 0)
    rdp = dpa.rdp.RdpAccountant().compose(event).get_epsilon(DELTA)
    assert acc.get_epsilon(DELTA) >= rdp * (1 - 1e-3)


# Large noise and large sampling rates, where dp-accounting's series for fractional orders returns negative
# values (about -59 at orders 52.5 to 63.5 for s = 15, q = 0.5, 100 steps): zcdp printed 0 there.
@pytest.mark.parametrize("sigma,q,steps", [(15.0, 0.5, 100), (10.0, 0.4, 100), (1000.0, 0.5, 100),
                                           (30.0, 0.9, 100)])
def test_zcdp_not_below_the_pld_lower_bound_at_large_noise(sigma, q, steps):
    from dp_accounting.pld import privacy_loss_distribution as pld

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lower = pld.from_gaussian_mechanism(  # optimistic: at most the true epsilon
            sigma, sampling_prob=q, pessimistic_estimate=False, value_discretization_interval=1e-4,
            use_connect_dots=False).self_compose(steps).get_epsilon_for_delta(DELTA)
    assert lower > 0.005
    assert compute_epsilon(sigma, q, steps, DELTA, "zcdp") >= lower


def test_zcdp_fractional_orders_bound_the_renyi_divergence_by_integration():
    # One Poisson-subsampled Gaussian (q, s): D_alpha((1 - q) N(0, s^2) + q N(1, s^2) || N(0, s^2)), the
    # direction that dominates (Mironov, Talwar & Zhang 2019), integrated numerically at fractional orders.
    from tfdpbnn.privacy.zcdp import TRUNCATION_ORDERS, subsampled_gaussian_rdp

    q, s = 0.5, 2.0
    bounds = subsampled_gaussian_rdp(q, s, 1)
    assert np.all(np.isfinite(bounds)) and np.all(bounds >= 0)
    for alpha in (1.5, 2.5, 7.3, 12.5, 30.5):
        i = int(np.flatnonzero(np.isclose(TRUNCATION_ORDERS, alpha))[0])

        def integrand(z, alpha=alpha):
            ratio = (1 - q) + q * math.exp((2 * z - 1) / (2 * s * s))
            return stats.norm.pdf(z, scale=s) * ratio ** alpha

        moment, _ = integrate.quad(integrand, -20 * s, 20 * s, limit=400, epsabs=0, epsrel=1e-10)
        exact = math.log(moment) / (alpha - 1)
        assert bounds[i] >= exact * (1 - 1e-6), alpha
        if alpha > 2:  # the chord between integer orders stays close (below 2 the bound is D_2)
            assert bounds[i] <= exact * 1.15, alpha


# ---- GDP closed forms (Dong, Roth & Su 2019) ----

@pytest.mark.parametrize("sigma,count", [(1.0, 1), (2.0, 4), (0.7, 9)])
def test_gdp_gaussian_mu_composition_exact(sigma, count):
    acc = GDPAccountant().compose(dpa.GaussianDpEvent(sigma), count)
    assert acc.mu == pytest.approx(math.sqrt(count) / sigma, rel=1e-12)
    assert not acc.is_approximate
    # mu-GDP duality equals the exact Gaussian mechanism's privacy profile (Balle & Wang 2018).
    for eps in (0.1, 1.0, 3.0):
        expected = gaussian_delta(sigma / math.sqrt(count), eps)
        assert gdp_delta(acc.mu, eps) == pytest.approx(expected, rel=1e-9)


def test_gdp_duality_by_numerical_integration():
    # delta(eps) = E_{x ~ N(mu,1)}[(1 - e^{eps - mu x + mu^2/2})_+] for mu-GDP (likelihood-ratio form).
    mu, eps = 1.3, 0.8
    lr = lambda x: math.exp(mu * x - mu * mu / 2)
    f = lambda x: max(0.0, 1 - math.exp(eps) / lr(x)) * stats.norm.pdf(x, loc=mu)
    integral, _ = integrate.quad(f, -10, 15, limit=200)
    assert gdp_delta(mu, eps) == pytest.approx(integral, rel=1e-6)
    assert gdp_epsilon(mu, gdp_delta(mu, eps)) == pytest.approx(eps, rel=1e-6)


def test_gdp_clt_formula_and_flag():
    q, sigma, steps = 0.01, 1.2, 5000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = GDPAccountant().compose(dp_sgd_event(sigma, q, steps))
    assert acc.is_approximate
    assert acc.mu == pytest.approx(q * math.sqrt(steps * math.expm1(1 / sigma ** 2)), rel=1e-12)


# ---- AC (Ermis & Cemgil (2017a) DPVD-AC) ----

def test_ac_single_gaussian_is_analytic_gaussian():
    sigma, delta = 2.0, 1e-5
    acc = AdvancedCompositionAccountant(delta_prime=1e-9).compose(dpa.GaussianDpEvent(sigma))
    # one step: basic composition wins, all delta - delta' goes to the step
    assert acc.get_epsilon(delta) == pytest.approx(gaussian_epsilon(sigma, delta - 1e-9), rel=1e-9)


def test_ac_matches_dwork_roth_formula():
    q, sigma, steps, delta, dprime = 0.01, 4.0, 1000, 1e-5, 5e-6
    acc = AdvancedCompositionAccountant(delta_prime=dprime).compose(dp_sgd_event(sigma, q, steps))
    delta0 = (delta - dprime) / steps / q
    e0 = gaussian_epsilon(sigma, delta0)
    e = math.log1p(q * math.expm1(e0))
    expected = min(math.sqrt(2 * steps * math.log(1 / dprime)) * e + steps * e * math.expm1(e), steps * e)
    assert acc.get_epsilon(delta) == pytest.approx(expected, rel=1e-9)
    # the default optimizes delta' and can only be tighter
    assert AdvancedCompositionAccountant().compose(dp_sgd_event(sigma, q, steps)).get_epsilon(delta) <= (
        expected + 1e-12)


def test_ac_delta_prime_must_be_below_target():
    acc = AdvancedCompositionAccountant(delta_prime=1e-4).compose(dp_sgd_event(4.0, 0.01, 10))
    with pytest.raises(ValueError, match="target_delta"):
        acc.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="delta_prime"):
        AdvancedCompositionAccountant(delta_prime=0.0)


# ---- rdp/pld are dp-accounting's own ----

@pytest.mark.parametrize("sigma,q,steps", [(1.0, 0.01, 1000), (2.5, 0.05, 300)])
def test_rdp_and_pld_equal_dp_accounting(sigma, q, steps):
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    assert compute_epsilon(sigma, q, steps, DELTA, "rdp") == dpa.rdp.RdpAccountant().compose(
        event).get_epsilon(DELTA)
    # a fixed interval is exactly dp-accounting's PLDAccountant
    pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(DELTA)
    assert get_accountant("pld", value_discretization_interval=1e-3).compose(event).get_epsilon(DELTA) == pld
    # the adaptive default: never below a fine dp-accounting PLD (both pessimistic), within 1% of it
    fine = dpa.pld.PLDAccountant(value_discretization_interval=5e-5).compose(event).get_epsilon(DELTA)
    adaptive = compute_epsilon(sigma, q, steps, DELTA, "pld")
    assert fine * (1 - 1e-3) <= adaptive <= fine * 1.01


def test_adaptive_pld_fixes_coarse_over_report():
    # An MNIST-like setting at epsilon ~0.09: a fixed 1e-3 interval reports about twice the epsilon.
    event = dp_sgd_event(48.12, 0.01, 20000)
    coarse = dpa.pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(DELTA)
    adaptive = get_accountant("pld").compose(event).get_epsilon(DELTA)
    assert adaptive < 0.6 * coarse
    assert adaptive == pytest.approx(0.0896, rel=0.01)


# ---- soundness: zcdp and ac never below PLD (an upper bound itself, pessimistic discretization) ----

GRID = [(s, q, t) for s in (0.8, 1.5, 4.0) for q in (0.004, 0.05) for t in (10, 1000)]


@pytest.mark.parametrize("sigma,q,steps", GRID)
def test_sound_accountants_not_below_pld(sigma, q, steps):
    # PLD (pessimistic, refined to 1%) is itself an upper bound close to the true curve; a sound accountant
    # can be no tighter than the truth, so it must not fall below PLD by more than PLD's own 1% refinement.
    pld = compute_epsilon(sigma, q, steps, DELTA, "pld")
    for name in ("zcdp", "ac", "rdp"):
        assert compute_epsilon(sigma, q, steps, DELTA, name) >= pld * 0.99, name


@pytest.mark.parametrize("name", ["zcdp", "gdp", "ac"])
def test_unsupported_events_raise(name):
    acc = get_accountant(name)
    for event in (dpa.LaplaceDpEvent(1.0), dpa.UnsupportedDpEvent(),
                  dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1.0)),
                  dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0))):
        assert not acc.supports(event)
        with pytest.raises(dpa.UnsupportedEventError):
            acc.compose(event)
    replace = get_accountant(name, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    assert replace.supports(dpa.GaussianDpEvent(1.0))
    with pytest.raises(dpa.UnsupportedEventError):
        replace.compose(dp_sgd_event(1.0, 0.1, 10))


@pytest.mark.parametrize("name", ["zcdp", "gdp", "ac"])
def test_ledger_and_non_private(name):
    acc = get_accountant(name)
    assert isinstance(acc.ledger, dpa.NoOpDpEvent)
    assert acc.get_epsilon(DELTA) == 0.0
    acc.compose(dpa.GaussianDpEvent(2.0), 3)
    assert acc.ledger == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 3)
    assert acc.neighboring_relation is dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    eps = acc.get_epsilon(DELTA)
    assert 0 < eps < math.inf
    assert acc.get_delta(eps) <= DELTA * 1.001
    acc.compose(dpa.NonPrivateDpEvent())
    assert acc.get_epsilon(DELTA) == math.inf


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 1.5, 40.0, 709.0, 800.0, 5000.0])
def test_amplification_by_subsampling_holds_past_the_float_range(epsilon):
    # log(1 + q (e^eps - 1)) in 60-digit decimals; a weak mechanism (SI-DPSGD's paper mode at sigma 1 gives
    # eps near 900 per step) once raised OverflowError from the statement instead of printing it.
    from decimal import Decimal, getcontext

    from tfdpbnn.privacy.advanced_composition import amplify

    getcontext().prec = 60
    q = Decimal("0.125")
    reference = float((1 + q * (Decimal(epsilon).exp() - 1)).ln())
    amplified, delta = amplify(epsilon, 1e-6, 0.125)
    assert amplified == pytest.approx(reference, rel=1e-12)
    assert delta == pytest.approx(0.125e-6, rel=1e-15)
