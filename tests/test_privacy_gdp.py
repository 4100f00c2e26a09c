"""The GDP central-limit warning: it fires wherever GDP under-reports PLD by >5% on the measured grid,
and where it stays silent GDP is within 5% of PLD (re-checked here on the boundary of the safe region)."""

import warnings

import dp_accounting as dpa
import pytest

from tfdpbnn.privacy import (
    GDPAccountant,
    GDPApproximationWarning,
    calibrate_noise,
    compute_epsilon,
    dp_sgd_event,
)
from tfdpbnn.privacy.gdp import CLT_SAFE_REGION, clt_may_underreport

DELTA = 1e-5


def _pld(sigma, q, steps):
    event = dp_sgd_event(sigma, q, steps)
    return dpa.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA)


def _gdp(sigma, q, steps):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eps = GDPAccountant().compose(dp_sgd_event(sigma, q, steps)).get_epsilon(DELTA)
    return eps, any(issubclass(w.category, GDPApproximationWarning) for w in caught)


# docs/soundness.md, finding 3 (GDP 2.70 vs PLD 3.50; 6.35 vs 8.06; 6.01 vs 6.19) plus points where GDP is >5%
# low.
# The third of those points is 3% low: inside the safe region, so silent.
@pytest.mark.parametrize("sigma,q,steps,expected_gdp,under", [
    (1.0, 0.05, 100, 2.70, True), (0.8, 0.1, 50, 6.35, True), (1.0, 0.01, 10000, 6.01, False),
    (1.5, 0.01, 100, None, True), (2.0, 0.05, 100, None, True), (4.0, 0.02, 10, None, True)])
def test_warns_where_clt_underreports(sigma, q, steps, expected_gdp, under):
    gdp, warned = _gdp(sigma, q, steps)
    if expected_gdp is not None:
        assert gdp == pytest.approx(expected_gdp, abs=0.006)
    assert (gdp < 0.95 * _pld(sigma, q, steps)) == under
    assert warned == under


# Corners of the safe region (smallest sigma and steps of each step, smallest and largest q): no warning
# there, and GDP within 5% of PLD (both get larger with sigma and steps).
CORNERS = [(s, q, t) for s, t in CLT_SAFE_REGION for q in (0.001, 0.1) if t <= 1000] + [(1.0, 0.001, 10000)]


@pytest.mark.parametrize("sigma,q,steps", CORNERS)
def test_silent_and_within_5_percent_in_safe_region(sigma, q, steps):
    gdp, warned = _gdp(sigma, q, steps)
    assert not warned
    assert gdp >= 0.95 * _pld(sigma, q, steps)


def test_rule_boundaries():
    assert clt_may_underreport(0.01, 3.9, 999)
    assert not clt_may_underreport(0.01, 4.0, 100)
    assert clt_may_underreport(0.2, 10.0, 10 ** 6)  # q outside the measured range
    assert clt_may_underreport(0.0005, 10.0, 10 ** 6)


def test_gaussian_only_is_exact_and_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = GDPAccountant().compose(dpa.GaussianDpEvent(1.0), 4)
        assert not acc.is_approximate
        acc.get_epsilon(DELTA)
        # shuffle = composition of Gaussians: exact, no warning even with few epochs
        compute_epsilon(1.0, 0.1, 20, DELTA, accountant="gdp", sampling="shuffle")


def test_gdp_warns_through_compute_epsilon_and_calibrate_noise():
    with pytest.warns(GDPApproximationWarning, match="under-report"):
        compute_epsilon(1.0, 0.05, 100, DELTA, accountant="gdp")
    with pytest.warns(GDPApproximationWarning, match="under-report"):
        calibrate_noise(3.0, DELTA, 0.05, 100, accountant="gdp")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate_noise(1.0, DELTA, 0.01, 20000, accountant="gdp")  # sigma ~5.3: inside the safe region
