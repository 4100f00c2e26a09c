"""compute_epsilon / calibrate_noise / dp_sgd_event: round trip, shuffle, neighbouring, bad input."""

import math
import warnings

import dp_accounting as dpa
import pytest
from _exact_gaussian import gaussian_epsilon
from _tiers import SLOW_ON_KERAS2

from tfdpbnn.privacy import (
    available_accountants,
    calibrate_noise,
    compute_epsilon,
    dp_sgd_event,
    steps_per_epoch,
)

DELTA = 1e-5


@pytest.mark.parametrize("accountant", ["rdp", "pld", "zcdp", "gdp", "ac"])
@pytest.mark.parametrize("epsilon,q,steps", [(1.0, 0.01, 2000), (0.3, 0.05, 200)])
def test_calibration_round_trip(accountant, epsilon, q, steps):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sigma = calibrate_noise(epsilon, DELTA, q, steps, accountant=accountant)
        eps = compute_epsilon(sigma, q, steps, DELTA, accountant=accountant)
    assert eps <= epsilon
    assert eps >= 0.99 * epsilon


def test_calibration_is_smallest_sigma():
    sigma = calibrate_noise(1.0, DELTA, 0.01, 2000)
    assert compute_epsilon(sigma * 0.99, 0.01, 2000, DELTA) > 1.0


def test_notes_anchor_rdp_mnist():
    # docs/soundness.md, finding 2: RDP needs sigma 5.78 for epsilon 1, q 0.01, 200 epochs, delta 1e-5.
    assert calibrate_noise(1.0, DELTA, 0.01, 20000) == pytest.approx(5.78, abs=0.01)


def test_dp_sgd_event_structure():
    assert dp_sgd_event(1.5, 0.01, 300) == dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.5)), 300)
    # shuffle: 1/q = 3.3 -> 4 steps per epoch; 10 steps -> 3 epochs -> 3 Gaussians
    assert steps_per_epoch(0.3) == 4
    assert steps_per_epoch(0.01) == 100
    shuffled = dp_sgd_event(1.5, 0.3, 10, sampling="shuffle")
    assert shuffled == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.5), 3)
    assert isinstance(dp_sgd_event(1.5, 0.3, 0), dpa.NoOpDpEvent)
    assert compute_epsilon(1.5, 0.3, 0, DELTA) == 0.0


@pytest.mark.parametrize("accountant", ["rdp", "pld", "zcdp", "gdp", "ac"])
def test_shuffle_is_gaussian_composition_over_epochs(accountant):
    sigma, q, steps = 8.0, 0.01, 2000  # 20 epochs -> Gaussian with sigma / sqrt(20)
    exact = gaussian_epsilon(sigma / math.sqrt(20), DELTA)
    eps = compute_epsilon(sigma, q, steps, DELTA, accountant=accountant, sampling="shuffle")
    assert eps >= exact * (1 - 1e-6)
    if accountant in ("gdp", "pld"):  # exact for a Gaussian composition (PLD up to its discretization)
        assert eps == pytest.approx(exact, rel=2e-2)
    assert compute_epsilon(sigma, q, steps, DELTA, accountant=accountant) < eps  # Poisson is far better


def test_replace_one_doubles_sensitivity():
    sigma, q, steps = 4.0, 0.01, 500
    shuffle_replace = compute_epsilon(sigma, q, steps, DELTA, "gdp", neighboring="replace_one",
                                      sampling="shuffle")
    assert shuffle_replace == pytest.approx(gaussian_epsilon(sigma / 2 / math.sqrt(5), DELTA), rel=1e-9)
    for name in available_accountants():
        with pytest.raises(dpa.UnsupportedEventError):
            compute_epsilon(sigma, q, steps, DELTA, name, neighboring="replace_one")


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=0.0), r"noise_multiplier.*\(0, inf\)"),
    (dict(noise_multiplier=-1.0), r"noise_multiplier.*\(0, inf\)"),
    (dict(delta=0.0), r"delta.*\(0, 1\)"),
    (dict(delta=1.0), r"delta.*\(0, 1\)"),
    (dict(sample_rate=0.0), r"sample_rate.*\(0, 1\]"),
    (dict(sample_rate=1.5), r"sample_rate.*\(0, 1\]"),
    (dict(steps=-1), r"steps.*\[0, inf\)"),
    (dict(steps=2.5), r"steps.*integer"),
    (dict(accountant="moments"), r"accountant.*'rdp'"),
    (dict(sampling="random"), r"sampling.*'poisson', 'shuffle'"),
    (dict(neighboring="swap"), r"neighboring.*'add_or_remove', 'replace_one'"),
])
def test_compute_epsilon_bad_input(kwargs, match):
    args = dict(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=DELTA)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        compute_epsilon(**args)


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=0.0), r"epsilon.*\(0, inf\)"),
    (dict(epsilon=-1.0), r"epsilon.*\(0, inf\)"),
    (dict(delta=2.0), r"delta.*\(0, 1\)"),
    (dict(sample_rate=-0.1), r"sample_rate.*\(0, 1\]"),
    (dict(steps=-5), r"steps.*\[0, inf\)"),
    (dict(accountant="nope"), r"accountant"),
])
def test_calibrate_noise_bad_input(kwargs, match):
    args = dict(epsilon=1.0, delta=DELTA, sample_rate=0.01, steps=100)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        calibrate_noise(**args)


# fast tier: rdp (the same calibration code; PLD against dp-accounting: tests/test_privacy_accountants.py)
@pytest.mark.parametrize("accountant", ["rdp", pytest.param("pld", marks=SLOW_ON_KERAS2)])
def test_calibrate_noise_leaves_room_for_other_releases(accountant):
    # Training at q = 0.2 for 120 steps plus a release of 6 Gaussian queries at sigma 20 (a private
    # calibration): the training noise is the smallest whose composition with it meets epsilon 1, checked
    # by an independent dp-accounting composition.
    other = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(20.0), 6)
    sigma = calibrate_noise(1.0, 1e-5, 0.2, 120, accountant, other_events=[other])
    alone = calibrate_noise(1.0, 1e-5, 0.2, 120, accountant)
    make = {"rdp": dpa.rdp.RdpAccountant, "pld": dpa.pld.PLDAccountant}[accountant]

    def composed(s):
        training = dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(0.2, dpa.GaussianDpEvent(s)), 120)
        return make().compose(dpa.ComposedDpEvent([training, other])).get_epsilon(1e-5)

    assert composed(sigma) <= 1.0 + 1e-6
    assert composed(sigma * 0.99) > 1.0  # not much more noise than needed (the 0.1% tolerance)
    assert sigma > alone


def test_calibrate_noise_refuses_other_releases_that_spend_everything():
    other = dpa.GaussianDpEvent(0.5)  # epsilon well above 1 on its own
    with pytest.raises(ValueError, match="other_events"):
        calibrate_noise(1.0, 1e-5, 0.2, 120, other_events=[other])
    with pytest.raises(ValueError, match=r"other_events\[0\]"):
        calibrate_noise(1.0, 1e-5, 0.2, 120, other_events=["gaussian"])
