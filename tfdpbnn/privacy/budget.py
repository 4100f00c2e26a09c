"""DP-SGD privacy budget: the event for a training run, its epsilon, and noise calibration.

Noise multiplier convention: ``noise_multiplier`` = noise std / C, with C the per-example clip norm, for a
noised SUM of clipped per-example gradients divided by a constant. Its L2 sensitivity Delta is C under
add/remove adjacency and 2C under replace-one, so events for replace-one carry noise_multiplier / 2
(dp-accounting's events are in units of Delta).

Sampling:
- "poisson": each example joins each batch independently with probability ``sample_rate`` (Abadi et al.
  2016; what RDP, PLD, GDP-CLT and subsampling amplification assume). ``steps`` compositions.
- "shuffle": fixed-size batches, each example exactly once per epoch, steps_per_epoch = ceil(1/sample_rate).
  No amplification is assumed (Chua et al. 2024, "How private are DP-SGD implementations?"): an example
  enters one noised sum per epoch, so the run is the composition over ceil(steps / steps_per_epoch) epochs of
  a Gaussian mechanism. Under add/remove this is the zero-out reading of adjacency used for shuffled batches
  (the removed example's slot contributes a zero gradient, batch layout unchanged); replace-one needs no such
  reading. Poisson gives a far smaller epsilon at the same noise (docs/privacy.md shows numbers).
"""

from __future__ import annotations

import math
import warnings

import dp_accounting
from dp_accounting import NeighboringRelation

from tfdpbnn._validation import (
    check_choice,
    check_nonnegative_int,
    check_open_unit,
    check_positive,
    check_sample_rate,
)
from tfdpbnn.privacy.registry import get_accountant, sound_accountants

SAMPLINGS = ("poisson", "shuffle")
NEIGHBORING = {"add_or_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
               "replace_one": NeighboringRelation.REPLACE_ONE}
# Sensitivity of a sum of clipped gradients in units of the clip norm C.
SENSITIVITY = {"add_or_remove": 1.0, "replace_one": 2.0}


def steps_per_epoch(sample_rate: float) -> int:
    """Batches per epoch for shuffled fixed-size batches: ceil(1 / sample_rate)."""
    check_sample_rate("sample_rate", sample_rate)
    return math.ceil(1.0 / sample_rate - 1e-9)


def dp_sgd_event(noise_multiplier: float, sample_rate: float, steps: int,
                 sampling: str = "poisson") -> dp_accounting.DpEvent:
    """The ``DpEvent`` of ``steps`` DP-SGD steps (Abadi et al. 2016), in units of the sensitivity.

    "poisson": ``steps`` x PoissonSampled(sample_rate, Gaussian(noise_multiplier)); "shuffle": epochs x
    Gaussian(noise_multiplier), epochs = ceil(steps / steps_per_epoch(sample_rate)) (see module docstring).
    """
    check_positive("noise_multiplier", noise_multiplier)
    check_sample_rate("sample_rate", sample_rate)
    check_nonnegative_int("steps", steps)
    check_choice("sampling", sampling, SAMPLINGS)
    if steps == 0:
        return dp_accounting.NoOpDpEvent()
    gaussian = dp_accounting.GaussianDpEvent(float(noise_multiplier))
    if sampling == "shuffle":
        epochs = math.ceil(steps / steps_per_epoch(sample_rate))
        return dp_accounting.SelfComposedDpEvent(gaussian, epochs)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(float(sample_rate), gaussian), int(steps))


def _check_common(delta, sample_rate, steps, accountant, neighboring, sampling):
    check_open_unit("delta", delta)
    check_sample_rate("sample_rate", sample_rate)
    check_nonnegative_int("steps", steps)
    check_choice("neighboring", neighboring, tuple(NEIGHBORING))
    check_choice("sampling", sampling, SAMPLINGS)
    get_accountant(accountant)  # raises ValueError for an unknown name


def compute_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                    accountant: str = "rdp", neighboring: str = "add_or_remove",
                    sampling: str = "poisson") -> float:
    """Epsilon at ``delta`` after ``steps`` DP-SGD steps, by the named accountant.

    Raises ``ValueError`` for out-of-range arguments and ``dp_accounting.UnsupportedEventError`` when the
    accountant cannot bound the event (e.g. Poisson sampling under replace-one).
    """
    check_positive("noise_multiplier", noise_multiplier)
    _check_common(delta, sample_rate, steps, accountant, neighboring, sampling)
    event = dp_sgd_event(noise_multiplier / SENSITIVITY[neighboring], sample_rate, steps, sampling)
    acc = get_accountant(accountant, neighboring_relation=NEIGHBORING[neighboring])
    return float(acc.compose(event).get_epsilon(delta))


def calibrate_noise(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp",
                    neighboring: str = "add_or_remove", sampling: str = "poisson",
                    other_events=()) -> float:
    """Smallest noise multiplier (to 0.1%) whose epsilon at ``delta`` is <= ``epsilon``.

    Uses dp-accounting's ``calibrate_dp_mechanism`` (Brent's method on epsilon(noise) - epsilon over an
    explicit bracket found here); the result always meets the budget. ``other_events``: ``DpEvent``s of the
    other releases the same ``epsilon`` must cover (a private calibration, prediction sets, a selection),
    under the same neighbouring relation; the training noise is then the smallest whose composition with
    them meets ``epsilon`` (sequential composition: no disjointness of the data is assumed).
    """
    check_positive("epsilon", epsilon)
    _check_common(delta, sample_rate, steps, accountant, neighboring, sampling)
    check_positive("steps", steps)
    other_events = list(other_events)
    for i, event in enumerate(other_events):
        if not isinstance(event, dp_accounting.DpEvent):
            raise ValueError(f"other_events[{i}] must be a dp_accounting.DpEvent, got {type(event).__name__}")
    rel = NEIGHBORING[neighboring]
    scale = SENSITIVITY[neighboring]

    def with_others(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return dp_accounting.ComposedDpEvent([event, *other_events]) if other_events else event

    if other_events:
        floor = float(get_accountant(accountant, neighboring_relation=rel).compose(
            dp_accounting.ComposedDpEvent(other_events)).get_epsilon(delta))
        if floor >= epsilon:
            raise ValueError(f"other_events: the other releases alone spend epsilon {floor:.4g} >= "
                             f"epsilon={epsilon!r}; nothing is left for training")

    def eps_at(sigma: float) -> float:
        acc = get_accountant(accountant, neighboring_relation=rel)
        event = with_others(dp_sgd_event(sigma / scale, sample_rate, steps, sampling))
        return float(acc.compose(event).get_epsilon(delta))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lo, hi = _bracket(eps_at, epsilon, _initial_guess(epsilon, delta, sample_rate, steps, accountant,
                                                          neighboring, sampling))

        def make_accountant():
            return get_accountant(accountant, neighboring_relation=rel)

        def make_event(sigma: float) -> dp_accounting.DpEvent:
            return with_others(dp_sgd_event(sigma / scale, sample_rate, steps, sampling))

        sigma = dp_accounting.calibrate_dp_mechanism(
            make_accountant, make_event, epsilon, delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi), tol=1e-3 * lo)
    if accountant not in sound_accountants():
        eps_at(sigma)  # outside the suppression: an approximate accountant's warning reaches the caller
    return float(sigma)


def _initial_guess(epsilon, delta, sample_rate, steps, accountant, neighboring, sampling) -> float:
    """A starting sigma: RDP's calibration (cheap) for the slow accountants ("pld", "zcdp"), else 1."""
    if accountant not in ("pld", "zcdp"):
        return 1.0
    try:
        return calibrate_noise(epsilon, delta, sample_rate, steps, "rdp", neighboring, sampling)
    except (ValueError, dp_accounting.UnsupportedEventError):
        return 1.0


def _bracket(eps_at, epsilon: float, guess: float, factor: float = 1.5) -> tuple[float, float]:
    """(lo, hi) with eps_at(lo) > epsilon >= eps_at(hi), searched geometrically from ``guess``."""
    lo = hi = guess
    if eps_at(guess) <= epsilon:
        while eps_at(lo) <= epsilon:
            hi, lo = lo, lo / factor
            if lo < 1e-4:
                raise ValueError(f"epsilon={epsilon!r} is met by every noise_multiplier >= 1e-4; "
                                 "allowed range of the calibrated noise multiplier is [1e-4, 1e4]")
    else:
        while eps_at(hi) > epsilon:
            lo, hi = hi, hi * factor
            if hi > 1e4:
                raise ValueError(f"epsilon={epsilon!r} needs a noise_multiplier above 1e4 (allowed "
                                 "range [1e-4, 1e4]); raise epsilon or lower steps/sample_rate")
    return lo, hi
