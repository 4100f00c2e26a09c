"""How one stated epsilon covers DP training and the private calibration that follows it.

A model calibrated on private held-out data releases two more things about that data: a temperature (Guo
et al. 2017; ``fit_temperature_private``, Gaussian noisy bisection) and a split-conformal threshold
(Angelopoulos et al. 2022; ``private_conformal_threshold``). Their noise is fixed by their own epsilon and
number of queries alone, so their ``DpEvent``s are known before any data is read. Two ways to stay inside
one stated epsilon:

- ``"parallel"`` (default): the held-out part is chosen record by record, by a keyed hash of each record's
  bytes (``split_by_record``), so adding or removing one record changes one part only and leaves every
  other record where it was. Training on one part and calibrating on the other is then parallel
  composition (McSherry 2009): training gets the whole epsilon, and the two calibration releases together
  get the whole epsilon on their part (their noise scaled so that their composition meets it). Valid under
  add/remove adjacency (a replaced record may move between the parts).
- ``"sequential"``: any split; the training noise is the smallest whose composition with the two releases
  meets the stated epsilon (``tfdpbnn.privacy.calibrate_noise(other_events=...)``), and the releases get
  ``temperature_share`` and ``conformal_share`` of it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import numpy as np

from tfdpbnn._validation import check_choice, check_open_unit, check_positive, check_positive_int

COMPOSITIONS = ("parallel", "sequential")


def split_by_record(arrays, fraction, key):
    """Boolean mask of the held-out records: SHA-256(``key``, record bytes) below ``fraction``.

    ``arrays``: arrays with one row per record (features, labels); a record's membership depends on its own
    bytes and the (public) integer ``key`` only, which is what parallel composition needs.
    """
    fraction = check_open_unit("fraction", fraction)
    if isinstance(key, bool) or not isinstance(key, int | np.integer):
        raise ValueError(f"key must be an integer, got {type(key).__name__}")
    arrays = [np.ascontiguousarray(np.asarray(a)) for a in arrays]
    sizes = {len(a) for a in arrays}
    if len(sizes) != 1:
        raise ValueError(f"arrays must have the same number of rows, got {sorted(sizes)}")
    held = np.zeros(sizes.pop(), dtype=bool)
    prefix = int(key).to_bytes(16, "little", signed=True)
    for i in range(len(held)):
        digest = hashlib.sha256(prefix + b"".join(a[i].tobytes() for a in arrays)).digest()
        held[i] = int.from_bytes(digest[:8], "little") < fraction * 2.0 ** 64
    return held


@dataclasses.dataclass(frozen=True)
class CalibrationPlan:
    """How a private temperature and a private conformal threshold share a stated epsilon.

    ``composition``: "parallel" or "sequential" (module docstring). ``temperature_share`` /
    ``conformal_share``: each release's own epsilon as a fraction of the stated one under "sequential";
    under "parallel" their ratio (both are scaled until their composition meets the stated epsilon).
    ``*_steps``: their numbers of Gaussian queries; ``conformal_gamma``: the share of ``alpha`` spent on the
    noise; ``alpha``: miscoverage of the prediction sets (0.1: 90% sets); ``conformal_grid``: the
    threshold's candidate grid ("linear" or "log", ``private_conformal_threshold``);
    ``temperature_null_zone``: None, or z > 0 to keep the temperature 1 unless a first noisy test of
    miscalibration exceeds z noise standard deviations (``fit_temperature_private(null_zone=...)``).
    """

    composition: str = "parallel"
    temperature_share: float = 0.2
    temperature_steps: int = 4
    conformal_share: float = 0.5
    conformal_steps: int = 4
    conformal_gamma: float = 0.3
    alpha: float = 0.1
    conformal_grid: str = "linear"
    temperature_null_zone: float | None = None

    def __post_init__(self):
        check_choice("composition", self.composition, COMPOSITIONS)
        for name in ("temperature_share", "conformal_share", "conformal_gamma", "alpha"):
            check_open_unit(name, getattr(self, name))
        check_positive_int("temperature_steps", self.temperature_steps)
        check_positive_int("conformal_steps", self.conformal_steps)
        from tfdpbnn.uncertainty.conformal import GRIDS

        check_choice("conformal_grid", self.conformal_grid, GRIDS)
        if self.temperature_null_zone is not None:
            check_positive("temperature_null_zone", self.temperature_null_zone)

    def release_epsilons(self, epsilon, delta, accountant="rdp"):
        """``(temperature epsilon, conformal epsilon)``, each release's own, at a stated ``epsilon``."""
        epsilon = check_positive("epsilon", epsilon)
        if self.composition == "sequential":
            return self.temperature_share * epsilon, self.conformal_share * epsilon
        return _parallel_release_epsilons(self, float(epsilon), float(delta), accountant)

    def _events(self, temperature_epsilon, conformal_epsilon, delta, accountant):
        from tfdpbnn.record.private_release import gaussian_queries

        return [gaussian_queries(temperature_epsilon, delta, self.temperature_steps, "temperature",
                                 accountant)[1].dp_event,
                gaussian_queries(conformal_epsilon, delta, self.conformal_steps, "conformal",
                                 accountant)[1].dp_event]

    def training_events(self, epsilon, delta, accountant="rdp"):
        """The ``DpEvent``s the training noise must leave room for: none under "parallel"."""
        if self.composition == "parallel":
            return []
        return self._events(*self.release_epsilons(epsilon, delta, accountant), delta, accountant)

    def min_calibration_size(self, epsilon, delta, accountant="rdp"):
        """The held-out size the plan's private prediction sets need to be informative, at a stated epsilon.

        ``tfdpbnn.uncertainty.min_calibration_size`` at the conformal release's own epsilon (computed from
        the arguments alone, before any budget is spent); ``fit`` refuses fewer held-out examples.
        """
        from tfdpbnn.uncertainty.conformal import min_calibration_size

        return min_calibration_size(self.alpha, self.release_epsilons(epsilon, delta, accountant)[1], delta,
                                    self.conformal_steps, self.conformal_gamma, accountant)

    def fit(self, probs, labels, epsilon, delta, accountant="rdp", seeds=(None, None),
            allow_uninformative=False, *, optimizer=None, x=None, y=None, record_ids=None,
            asserted_disjoint=None, asserted_training_records=None):
        """``(TemperatureScaling, ConformalThreshold)`` fit privately on held-out ``probs``/``labels``.

        The threshold is fit on the calibrated probabilities; ``seeds``: the two fits' noise seeds (None:
        secret noise; a seed, for tests and experiments, makes that release replayable: no guarantee). Fewer
        held-out examples than ``min_calibration_size`` are refused (``ValueError``) before either fit,
        unless ``allow_uninformative=True`` (``private_conformal_threshold``).

        ``optimizer``: the DP optimizer whose privacy statement records both releases under the plan's
        ``composition``; both are reserved before either fit queries the held-out data
        (``optimizer.reserve_release``: a per-record budget refuses them first, nothing released), with the
        held-out records as ``x``/``y`` (in the form training was given them) or ``record_ids``, the split
        asserted by ``asserted_disjoint`` (with those records), or, under "sequential", the records asserted
        to be the optimizer's training records by ``asserted_training_records="why"``
        (``optimizer.record_release``). With ``optimizer`` and neither records nor that assertion, both are
        refused (``ValueError`` naming ``x``, ``y`` and ``record_ids``) before either fit.
        """
        from tfdpbnn.record.private_release import release_relation, release_reservation
        from tfdpbnn.uncertainty.conformal import conformal_privacy, private_conformal_threshold
        from tfdpbnn.uncertainty.temperature import (
            _log_probs_and_labels,
            fit_temperature_private,
            temperature_privacy,
        )

        eps_t, eps_c = self.release_epsilons(epsilon, delta, accountant)
        if not isinstance(allow_uninformative, bool):
            raise ValueError(f"allow_uninformative must be True or False, got {allow_uninformative!r}")
        needed = self.min_calibration_size(epsilon, delta, accountant)
        if len(labels) < needed and not allow_uninformative:
            raise ValueError(
                f"labels: {len(labels)} held-out examples are too few for informative private prediction "
                f"sets at alpha={self.alpha:g}, epsilon={epsilon:g} (conformal share {eps_c:.3g}), "
                f"delta={delta:g}: they need at least {needed}; hold out more examples, raise epsilon, or "
                "pass "
                "allow_uninformative=True")
        read = len(_log_probs_and_labels(probs, labels)[1])  # bad input refused before anything is reserved
        relation = release_relation(None, optimizer)  # the optimizer's adjacency, else add/remove
        reserved = [None, None]
        if optimizer is not None:  # both reserved before either fit: all or nothing
            record = {"composition": self.composition, "x": x, "y": y, "record_ids": record_ids,
                      "asserted_disjoint": asserted_disjoint,
                      "asserted_training_records": asserted_training_records,
                      "records_read": read}
            reserved[0] = release_reservation(
                temperature_privacy(eps_t, delta, self.temperature_steps, accountant, relation, seeds[0]),
                optimizer, **record)
            try:
                reserved[1] = release_reservation(
                    conformal_privacy(self.alpha, eps_c, delta, self.conformal_steps, self.conformal_gamma,
                                      accountant, relation, seeds[1]), optimizer, **record)
            except BaseException:
                reserved[0].abandon()  # refused before either fit read the data
                raise
        else:  # record arguments without an optimizer: ValueError naming them
            release_reservation(None, x=x, y=y, record_ids=record_ids, asserted_disjoint=asserted_disjoint,
                                asserted_training_records=asserted_training_records)
        temperature = fit_temperature_private(probs, labels, eps_t, delta, steps=self.temperature_steps,
                                              accountant=accountant, neighboring=relation, seed=seeds[0],
                                              null_zone=self.temperature_null_zone, reservation=reserved[0])
        threshold = private_conformal_threshold(temperature.apply(probs), labels, self.alpha, eps_c, delta,
                                                steps=self.conformal_steps, gamma=self.conformal_gamma,
                                                accountant=accountant, neighboring=relation, seed=seeds[1],
                                                allow_uninformative=allow_uninformative,
                                                grid=self.conformal_grid, reservation=reserved[1])
        return temperature, threshold


@functools.lru_cache(maxsize=32)
def _parallel_release_epsilons(plan, epsilon, delta, accountant):
    """The two releases' epsilons, in the plan's ratio, scaled until their composition meets ``epsilon``."""
    import dp_accounting

    from tfdpbnn.privacy.registry import get_accountant

    ratio = plan.temperature_share / (plan.temperature_share + plan.conformal_share)

    def composed(scale):
        events = plan._events(ratio * scale, (1 - ratio) * scale, delta, accountant)
        return float(get_accountant(accountant).compose(dp_accounting.ComposedDpEvent(events))
                     .get_epsilon(delta))

    lo, hi = 0.5 * epsilon, epsilon
    while composed(hi) <= epsilon:
        lo, hi = hi, 2 * hi
    while composed(lo) > epsilon:
        lo /= 2
    for _ in range(20):  # bisection on the scale, to 1e-6 of it; the result always meets epsilon
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if composed(mid) <= epsilon else (lo, mid)
    return ratio * lo, (1 - ratio) * lo


__all__ = ["COMPOSITIONS", "CalibrationPlan", "split_by_record"]
