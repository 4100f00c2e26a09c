"""tfdpbnn's accountants at dp-accounting's domain edges, against dp-accounting's RDP and PLD accountants.

The contract (dp-accounting's ``PrivacyAccountant``): ``get_epsilon`` takes delta in [0, 1], ``get_delta``
takes epsilon in [0, inf]; nothing composed gives epsilon 0 and delta 0; a non-private event gives epsilon
inf and delta 1; a Gaussian (or subsampled one) is eps-DP for no finite eps (epsilon inf at delta 0), is
(0, 1)-DP (epsilon 0 at delta 1) and (inf, 0)-DP (delta 0 at epsilon inf).
"""

import math

import dp_accounting as dpa
import pytest

from tfdpbnn.privacy import get_accountant

# Warnings of the interior (the GDP CLT's, dp-accounting's RDP arithmetic at inf) are not what is tested here.
pytestmark = [pytest.mark.filterwarnings("ignore::tfdpbnn.privacy.gdp.GDPApproximationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]
OURS = ("zcdp", "gdp", "ac", "pld")   # "pld": tfdpbnn's adaptive PLD accountant
GAUSSIAN = dpa.GaussianDpEvent(1.0)
SUBSAMPLED = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0)), 10)
CASES = {
    "empty": [],
    "no-op": [dpa.NoOpDpEvent()],
    "rate 0": [dpa.PoissonSampledDpEvent(0.0, GAUSSIAN)],
    "gaussian": [GAUSSIAN],
    "subsampled": [SUBSAMPLED],
    "non-private": [GAUSSIAN, dpa.NonPrivateDpEvent()],
    "sigma 0": [dpa.GaussianDpEvent(0.0)],
}


def _composed(accountant, events):
    for event in events:
        accountant.compose(event)
    return accountant


def _reference(events):
    """dp-accounting's RDP and PLD accountants over ``events``."""
    return (_composed(dpa.rdp.RdpAccountant(), events),
            _composed(dpa.pld.PLDAccountant(value_discretization_interval=1e-3), events))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", OURS)
def test_epsilon_at_delta_0_and_1_as_dp_accounting(name, case):
    ours = _composed(get_accountant(name), CASES[case])
    rdp, pld = _reference(CASES[case])
    for delta in (0.0, 1.0):
        expected = rdp.get_epsilon(delta)
        assert pld.get_epsilon(delta) == pytest.approx(expected, abs=1e-12)   # the two agree at the edges
        got = ours.get_epsilon(delta)
        if math.isinf(expected):
            assert math.isinf(got) and got > 0, (case, delta, got)
        else:
            assert got == pytest.approx(expected, abs=1e-12), (case, delta, got)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", OURS)
def test_delta_at_infinite_epsilon_as_dp_accounting(name, case):
    ours = _composed(get_accountant(name), CASES[case])
    rdp, pld = _reference(CASES[case])
    expected = rdp.get_delta(math.inf)
    assert pld.get_delta(math.inf) == pytest.approx(expected, abs=1e-14)   # PLD: 5e-16 of discretization
    assert ours.get_delta(math.inf) == pytest.approx(expected, abs=1e-14), case


@pytest.mark.parametrize("name", OURS)
@pytest.mark.parametrize("case", ["empty", "no-op", "rate 0"])
def test_empty_composition_is_exactly_zero(name, case):
    """No private event: epsilon 0 at every delta and delta 0 at every epsilon (the zCDP accountant gave
    delta 3.7e-9 here, its Renyi-to-delta conversion at rho = 0)."""
    ours = _composed(get_accountant(name), CASES[case])
    for delta in (1e-10, 1e-5, 0.5):
        assert ours.get_epsilon(delta) == pytest.approx(0.0, abs=1e-15)
    for epsilon in (0.0, 0.1, 10.0):
        assert ours.get_delta(epsilon) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("name", ["zcdp", "gdp", "ac"])
def test_interior_unchanged_and_consistent_near_the_edges(name):
    """Just inside the edges the accountants answer from their own bounds: finite and monotone."""
    ours = _composed(get_accountant(name), [SUBSAMPLED])
    eps_small_delta, eps_large_delta = ours.get_epsilon(1e-12), ours.get_epsilon(0.5)
    assert math.isfinite(eps_small_delta) and eps_small_delta > eps_large_delta >= 0.0
    assert 0.0 <= ours.get_delta(50.0) <= ours.get_delta(1.0) <= 1.0


@pytest.mark.parametrize("name", OURS)
@pytest.mark.parametrize("method,argument,value", [
    ("get_epsilon", "target_delta", -0.1), ("get_epsilon", "target_delta", 1.5),
    ("get_epsilon", "target_delta", math.nan), ("get_delta", "target_epsilon", -1.0),
    ("get_delta", "target_epsilon", math.nan), ("get_delta", "target_epsilon", -math.inf)])
def test_outside_the_domain_is_an_error_naming_the_argument(name, method, argument, value):
    ours = _composed(get_accountant(name), [GAUSSIAN])
    with pytest.raises(ValueError, match=argument):
        getattr(ours, method)(value)
