"""Temperature scaling: closed forms, public fit, private fit (ECE lowered; epsilon as dp-accounting's)."""

import dp_accounting
import numpy as np
import pytest

from tfdpbnn.record.private_release import noisy_bisection
from tfdpbnn.uncertainty import (
    expected_calibration_error,
    fit_temperature,
    fit_temperature_private,
    scale_probabilities,
)


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _miscalibrated(n, scale, seed, classes=10):
    """Labels drawn from softmax(z); the model reports softmax(scale * z): overconfident if scale > 1."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, classes)) * 2.0
    labels = (rng.random(n)[:, None] > _softmax(z).cumsum(1)).sum(1)
    return _softmax(scale * z), labels


def test_scale_probabilities_closed_forms():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 4))
    np.testing.assert_allclose(scale_probabilities(_softmax(z), 2.5), _softmax(z / 2.5), rtol=1e-10)
    np.testing.assert_allclose(scale_probabilities(_softmax(z), 1.0), _softmax(z), rtol=1e-10)
    p = np.array([[0.2], [0.9]])  # binary column: sigmoid(logit(p) / T)
    logit = np.log(p / (1 - p))
    expected = 1 / (1 + np.exp(-logit / 3.0))
    np.testing.assert_allclose(scale_probabilities(p, 3.0), np.hstack([1 - expected, expected]), rtol=1e-10)
    with pytest.raises(ValueError, match="temperature"):
        scale_probabilities(p, 0.0)


@pytest.mark.parametrize("scale", [2.5, 0.4])
def test_public_fit_recovers_the_temperature_and_lowers_ece(scale):
    probs, labels = _miscalibrated(4000, scale, seed=0)
    test_probs, test_labels = _miscalibrated(4000, scale, seed=1)
    fit = fit_temperature(probs, labels)
    # the model's probabilities are softmax(scale z): temperature `scale` undoes it; 4000 examples: within 5%
    assert fit.temperature == pytest.approx(scale, rel=0.05)
    assert fit.privacy.epsilon == 0.0 and isinstance(fit.privacy.dp_event, dp_accounting.NoOpDpEvent)
    before = expected_calibration_error(test_probs, test_labels)
    after = expected_calibration_error(fit.apply(test_probs), test_labels)
    assert before > 0.15 and after < 0.03


@pytest.mark.parametrize("scale", [2.5, 0.4])
def test_private_fit_lowers_ece_on_a_fixed_case(scale):
    probs, labels = _miscalibrated(1000, scale, seed=2)
    test_probs, test_labels = _miscalibrated(4000, scale, seed=3)
    before = expected_calibration_error(test_probs, test_labels)
    for seed in range(3):
        fit = fit_temperature_private(probs, labels, epsilon=1.0, delta=1e-5, seed=seed)
        after = expected_calibration_error(fit.apply(test_probs), test_labels)
        assert after < before / 2, (seed, fit.temperature, before, after)


@pytest.mark.parametrize("neighboring,scale", [("add_or_remove", 1.0), ("replace_one", 2.0)])
def test_private_fit_epsilon_is_dp_accountings(neighboring, scale):
    probs, labels = _miscalibrated(200, 2.0, seed=4)
    fit = fit_temperature_private(probs, labels, epsilon=0.5, delta=1e-6, steps=5, clip=1.5, seed=0,
                                  neighboring=neighboring)
    cost = fit.privacy
    sigma = cost.noise_multiplier
    # the event, rebuilt by hand: 5 Gaussian queries of noise std sigma * clip, sensitivity clip * scale
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / scale), 5)
    assert cost.dp_event == event
    relation = {"add_or_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE}[neighboring]
    rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation).compose(event).get_epsilon(1e-6)
    assert cost.epsilon == pytest.approx(rdp, rel=1e-9)
    assert 0.49 < cost.epsilon <= 0.5
    gaussian = {"name": "GaussianDpEvent", "noise_multiplier": sigma / scale}
    assert cost.as_dict()["dp_event"] == {"name": "SelfComposedDpEvent", "count": 5, "event": gaussian}


def test_noisy_bisection_finds_the_root_and_its_noise_has_the_stated_scale():
    lo, hi = noisy_bisection(lambda x: x - 0.3, 0.0, 1.0, queries=12, noise_std=1e-9, rng=0)
    assert lo <= 0.3 <= hi and hi - lo == pytest.approx(2.0 ** -12)
    # with a constant query c the first step goes left with probability Phi(c / std): 0.8413 at c = std
    left = [noisy_bisection(lambda x: 1.0, 0.0, 1.0, 1, noise_std=1.0, rng=s)[1] == 0.5 for s in range(4000)]
    # binomial(4000, 0.8413): standard deviation 0.0058; tolerance 4 standard deviations
    assert np.mean(left) == pytest.approx(0.8413, abs=0.023)


@pytest.mark.parametrize("kwargs,match", [
    ({"clip": 0.0}, "clip"), ({"steps": 0}, "steps"), ({"epsilon": 0.0}, "epsilon"),
    ({"delta": 1.0}, "delta"), ({"bounds": (2.0, 1.0)}, r"bounds\[1\]"), ({"bounds": 3.0}, "bounds"),
    ({"accountant": "nope"}, "accountant"), ({"neighboring": "swap"}, "neighboring"),
    ({"epsilon": [1.0]}, "epsilon"), ({"accountant": ["rdp"]}, "accountant"),
])
def test_bad_arguments(kwargs, match):
    probs, labels = _miscalibrated(20, 1.0, seed=5)
    args = {"epsilon": 1.0, "delta": 1e-5, **kwargs}
    with pytest.raises(ValueError, match=match):
        fit_temperature_private(probs, labels, **args)


def test_null_zone_keeps_a_calibrated_model_and_scales_a_miscalibrated_one():
    epsilon, delta, steps, z = 0.4, 1e-5, 4, 2.0
    calibrated, labels = _miscalibrated(300, 1.0, seed=4)
    # a calibrated model: D(1) is a sum of 300 mean-zero terms, small against the noise (sigma clip about 57)
    draws = [fit_temperature_private(calibrated, labels, epsilon, delta, steps=steps, seed=t, null_zone=z)
             for t in range(200)]
    kept = sum(d.temperature == 1.0 for d in draws)
    # P(|D(1) + N(0, s^2)| < 2 s) is 0.954 at D(1) = 0 and falls as |D(1)| grows: at least 170 of 200 (the
    # binomial's 1e-3 quantile at 0.9 is 167); without the zone T = 1 is never a result (midpoints only)
    assert kept >= 170, kept
    assert all(abs(d.temperature - 1.0) > 0.05 for d in (
        fit_temperature_private(calibrated, labels, epsilon, delta, steps=steps, seed=t) for t in range(20)))
    # an overconfident model (scale 2.5): D(1) is far beyond the zone, the bisection goes on to T > 1
    hot, hot_labels = _miscalibrated(300, 2.5, seed=5)
    fits = [fit_temperature_private(hot, hot_labels, epsilon, delta, steps=steps, seed=t, null_zone=z)
            for t in range(50)]
    assert all(f.temperature > 1.5 for f in fits), [f.temperature for f in fits]
    # the same event and epsilon as without the zone (it asks at most the same queries)
    plain = fit_temperature_private(hot, hot_labels, epsilon, delta, steps=steps, seed=0)
    assert fits[0].privacy.dp_event == plain.privacy.dp_event
    assert fits[0].privacy.epsilon == plain.privacy.epsilon
    with pytest.raises(ValueError, match="null_zone"):
        fit_temperature_private(hot, hot_labels, epsilon, delta, null_zone=0.0)
    with pytest.raises(ValueError, match="bounds must hold the temperature 1"):
        fit_temperature_private(hot, hot_labels, epsilon, delta, bounds=(1.5, 3.0), null_zone=2.0)
