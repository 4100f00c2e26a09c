"""Gaussian noisy bisection on held-out data, and the privacy cost it carries as a dp-accounting ``DpEvent``.

Private calibration here (temperature, conformal threshold) finds where a monotone statistic of a held-out
split changes sign, f(x) = sum_i f_i(x) with every |f_i| (or the change from adding/removing one example)
bounded by a sensitivity Delta. Each bisection step releases f(x_mid) + N(0, (sigma Delta)^2) and keeps the
half where the noisy sign says the root lies: ``queries`` adaptive Gaussian mechanisms (Dwork & Roth 2014,
Theorem A.1; their composition is accounted exactly by RDP or PLD, Mironov 2017), so the release is the
DpEvent ``SelfComposed(Gaussian(sigma / s), queries)``, the same event as ``queries`` full-batch DP-SGD
steps (``tfdpbnn.privacy.dp_sgd_event`` with ``sample_rate=1``; s = 1 under add/remove, 2 under
replace-one, as in ``tfdpbnn.privacy.budget``). sigma is calibrated to a target (epsilon, delta) by
``tfdpbnn.privacy.calibrate_noise``. A mechanism that asks fewer queries is covered by the same event.
"""

from __future__ import annotations

import dataclasses
import functools

import dp_accounting
import numpy as np

from tfdpbnn._validation import check_choice, check_open_unit, check_positive, check_positive_int
from tfdpbnn.privacy.budget import SENSITIVITY, calibrate_noise, compute_epsilon, dp_sgd_event
from tfdpbnn.record import attributes
from tfdpbnn.record.record_ledger import event_to_config


@dataclasses.dataclass(frozen=True)
class PrivacyCost:
    """What a calibration released about its held-out data: a ``DpEvent`` and its epsilon at ``delta``.

    ``dp_event`` composes with training's event (``dp_accounting.ComposedDpEvent([training, dp_event])``);
    ``epsilon`` is this release alone, by ``accountant`` under ``neighboring``. A fit on public data has
    ``dp_event = NoOpDpEvent()`` and epsilon 0 (``PrivacyCost.public()``).

    ``replayable_from``: None when the noise came from the operating system's entropy (a fresh numpy
    ``default_rng()``); else the user-given seed it is replayable from (``seed=`` of the private fits, for
    tests and experiments). Whoever knows the seed can subtract the noise, so no epsilon holds for a
    replayable release: a privacy statement that composes one says ``guarantee: false``.
    """

    mechanism: str
    dp_event: dp_accounting.DpEvent
    epsilon: float
    delta: float
    accountant: str | None = None
    neighboring: str | None = None
    noise_multiplier: float | None = None
    queries: int = 0
    replayable_from: str | None = None

    @classmethod
    def public(cls, mechanism):
        """The cost of a fit on public data: nothing."""
        return cls(mechanism=mechanism, dp_event=dp_accounting.NoOpDpEvent(), epsilon=0.0, delta=0.0)

    def as_dict(self):
        """JSON-ready record; the event as nested dicts of its class name and fields."""
        return {"mechanism": self.mechanism, "epsilon": self.epsilon, "delta": self.delta,
                "accountant": self.accountant, "neighboring": self.neighboring,
                "noise_multiplier": self.noise_multiplier, "queries": self.queries,
                "replayable_from": self.replayable_from, "dp_event": event_to_config(self.dp_event)}

    def with_noise_seed(self, seed) -> PrivacyCost:
        """This cost, marked replayable when the release's noise came from ``seed`` (None: secret noise)."""
        if seed is None:
            return self
        return dataclasses.replace(self, replayable_from=f"seed={seed!r}")


def gaussian_queries(epsilon, delta, queries, mechanism, accountant="rdp", neighboring="add_or_remove"):
    """(noise multiplier sigma, ``PrivacyCost``) for ``queries`` Gaussian queries meeting (epsilon, delta).

    The noise standard deviation of a query of sensitivity Delta is sigma * Delta (module docstring).
    """
    check_choice("neighboring", neighboring, tuple(SENSITIVITY))
    if not isinstance(accountant, str):
        raise ValueError(f"accountant must be the name of a registered accountant, got {accountant!r}")
    return _gaussian_queries(check_positive("epsilon", epsilon), check_open_unit("delta", delta),
                             check_positive_int("queries", queries), mechanism, accountant, neighboring)


@functools.lru_cache(maxsize=64)
def _gaussian_queries(epsilon, delta, queries, mechanism, accountant, neighboring):
    """``gaussian_queries`` on checked arguments; cached (deterministic calibration, immutable results)."""
    sigma = calibrate_noise(epsilon, delta, 1.0, queries, accountant, neighboring, sampling="shuffle")
    event = dp_sgd_event(sigma / SENSITIVITY[neighboring], 1.0, queries, sampling="shuffle")
    spent = compute_epsilon(sigma, 1.0, queries, delta, accountant, neighboring, sampling="shuffle")
    return sigma, PrivacyCost(mechanism=mechanism, dp_event=event, epsilon=spent, delta=float(delta),
                              accountant=accountant, neighboring=neighboring, noise_multiplier=sigma,
                              queries=queries)


class ReleaseReservation:
    """A private release reserved for an optimizer's statement (and the per-record ledger) before it runs.

    Made by ``optimizer.reserve_release``: the composition checked, the release's records named and its
    planned ``DpEvent`` written to the per-record ledger (``RecordLedger.reserve``: a per-record budget
    refuses it there, before the release reads its data). ``commit(release)`` puts the release into the
    optimizer's statement with what it spent; ``abandon()`` commits nothing spent (only for a release that
    drew no noise and read no data). Leaving neither done keeps the planned event in the ledger (an upper
    bound), as after a crash.
    """

    def __init__(self, optimizer, cost, composition: str, basis: str | None, ledger_part, keys=None,
                 asserted_training_records: str | None = None):
        self._optimizer = optimizer
        self.cost = cost
        self.composition = composition
        self._basis = basis
        self._keys = keys  # a parallel release's record keys, checked disjoint in the ledger
        self._asserted = asserted_training_records  # why it read the training records (the user's word)
        self._ledger = ledger_part  # (Reservation, phase ids, on the training records, token) or None
        self.done = False

    def _finish(self) -> None:
        if self.done:
            raise ValueError("reservation: this release reservation was already committed or abandoned")
        self.done = True

    def commit(self, release) -> None:
        """Write what ``release`` spent and compose it into the optimizer's statement.

        ``release.privacy.dp_event`` must be the reserved event (``ValueError`` otherwise: nothing written).
        """
        spent = getattr(getattr(release, "privacy", None), "dp_event", None)
        if not isinstance(spent, dp_accounting.DpEvent) or event_to_config(spent) != event_to_config(
                self.cost.dp_event):
            raise ValueError(f"release: its privacy event ({spent!r}) is not the reserved one "
                             f"({self.cost.dp_event!r})")
        self._finish()
        if self._ledger is not None:
            reservation, phase_ids, on_training, token = self._ledger
            reservation.commit(spent, phase_ids=phase_ids)
            attributes.release_ledger(self._optimizer)[id(release)] = (reservation.release_id, on_training,
                                                                       token)
            content = release_content(release)
            if token is not None and content is not None:
                _COMMITTED_TOKENS.setdefault(content, set()).add(token)
        if self._basis is not None:
            attributes.parallel_basis(self._optimizer)[id(release)] = self._basis
        if self._keys is not None:
            attributes.parallel_keys(self._optimizer)[id(release)] = (
                attributes.training_done(self._optimizer), self._keys)
        if self._asserted is not None:
            attributes.training_records_asserted(self._optimizer)[id(release)] = self._asserted
        attributes.releases(self._optimizer).append((release, self.composition))

    def abandon(self) -> None:
        """Commit nothing spent: the release drew no noise and read none of its data (refused before)."""
        self._finish()
        if self._ledger is not None:
            self._ledger[0].commit(dp_accounting.NoOpDpEvent(), phase_ids=self._ledger[1])


def release_relation(neighboring, optimizer=None) -> str:
    """The adjacency a private fit calibrates its noise to: ``neighboring``, else ``optimizer``'s relation.

    None with no optimizer: "add_or_remove". A fit recorded by an optimizer must use its relation
    (``optimizer.reserve_release`` refuses another: replace-one doubles a sum's sensitivity).
    """
    if neighboring is not None:
        return neighboring
    return getattr(optimizer, "neighboring", None) or "add_or_remove"


def release_reservation(cost, optimizer=None, reservation=None, composition="sequential", x=None, y=None,
                        record_ids=None, asserted_disjoint=None, asserted_training_records=None,
                        records_read=None):
    """The ``ReleaseReservation`` a private fit of ``cost`` commits its result to, or None.

    ``optimizer``: the DP optimizer whose statement records the release; it is reserved now
    (``optimizer.reserve_release``, with the record arguments ``composition``, ``x``, ``y``, ``record_ids``,
    ``asserted_disjoint`` and ``asserted_training_records`` as ``record_release`` takes them), so a
    per-record budget refuses the release before the fit reads its data. The release must name the records
    it read (``x``/``y`` or ``record_ids``), or the user must assert by name that they are the optimizer's
    training records (``asserted_training_records``): otherwise ``ValueError`` naming ``x``, ``y`` and
    ``record_ids``, before the fit reads its data. ``reservation``: one made before with this ``cost``
    (``CalibrationPlan.fit`` reserves both of its releases before either runs). Neither: None (the fit
    records nothing; ``optimizer.record_release`` can record its result later, after it ran). Record
    arguments without ``optimizer``, or both ``optimizer`` and ``reservation``: ``ValueError`` naming them.
    ``records_read``: the number of rows the fit reads (``len(labels)``); records named in another number
    are refused (``ValueError`` naming ``x`` or ``record_ids``; ``optimizer.reserve_release``).
    """
    given = [name for name, value in (("composition", composition != "sequential"), ("x", x is not None),
                                      ("y", y is not None), ("record_ids", record_ids is not None),
                                      ("asserted_disjoint", asserted_disjoint is not None),
                                      ("asserted_training_records", asserted_training_records is not None))
             if value]
    if optimizer is None:
        if given:
            raise ValueError(f"{given[0]}: says how the release is recorded, so it needs optimizer= (the DP "
                             "optimizer whose privacy statement records the release)")
        if reservation is None:
            return None
        if not isinstance(reservation, ReleaseReservation) or reservation.done:
            raise ValueError("reservation: a ReleaseReservation from optimizer.reserve_release not yet "
                             f"committed, got {reservation!r}")
        if event_to_config(reservation.cost.dp_event) != event_to_config(cost.dp_event):
            raise ValueError(f"reservation: reserved for {reservation.cost.dp_event!r}, but this fit "
                             f"releases {cost.dp_event!r}")
        return reservation
    if reservation is not None:
        raise ValueError("reservation: give optimizer= (reserved now) or a reservation made before, not both")
    if not callable(getattr(optimizer, "reserve_release", None)):
        raise ValueError("optimizer: the tfdpbnn DP optimizer whose privacy statement records the release, "
                         f"got {type(optimizer).__name__}")
    return optimizer.reserve_release(cost, composition, x=x, y=y, record_ids=record_ids,
                                     asserted_disjoint=asserted_disjoint,
                                     asserted_training_records=asserted_training_records,
                                     records_read=records_read)


#: Ledger tokens of the releases committed in this process, by their content (``release_content``): a
#: release that a later optimizer imported from the per-record ledger (``_import_linked_releases``: no
#: record of its value) is matched with the object that was committed so.
_COMMITTED_TOKENS: dict[str, set[str]] = {}


def release_content(release) -> str | None:
    """The content of ``release`` as JSON, or None for a release without ``as_dict``.

    Its ``as_dict()``: what ``release_config`` stores under "record", a ``RestoredRelease``'s record.
    """
    import json

    as_dict = getattr(release, "as_dict", None)
    if not callable(as_dict):
        return None
    try:
        return json.dumps(as_dict(), sort_keys=True, default=repr)
    except (TypeError, ValueError):
        return None


def held_release(optimizer, release):
    """The release ``optimizer`` holds that is ``release``, or None.

    Held: recorded, restored from a saved config, or imported from the per-record ledger.

    Matched by identity, else by content: a release restored from a saved optimizer (``RestoredRelease``)
    whose record is ``release.as_dict()``, or one imported from the per-record ledger under a token this
    process committed ``release``'s content as. A loaded model's optimizer holds the calibration a user
    fit before saving under another object; matching by ``id`` alone refused it, and recording it again
    counted it twice.
    """
    held = attributes.releases(optimizer)
    for r, _ in held:
        if r is release:
            return r
    content = release_content(release)
    if content is None:
        return None
    tokens = _COMMITTED_TOKENS.get(content, set())
    in_ledger = attributes.release_ledger(optimizer)
    for r, _ in held:
        if release_content(r) == content or in_ledger.get(id(r), (None, False, None))[2] in tokens:
            return r
    return None


#: The argument of ``export_saved_model`` each release type is given as.
_EXPORT_ARGUMENT = {"TemperatureScaling": "calibration", "ConformalThreshold": "prediction_sets"}


def refuse_unrecorded_releases(optimizer, releases, holder: str | None = None) -> None:
    """Refuse (``ValueError``) a private release among ``releases`` that ``optimizer`` has not recorded.

    ``export_saved_model`` records its ``calibration`` and ``prediction_sets`` on the DP optimizer whose
    statement it writes (``record_release``), and it cannot name the records they read: the per-record ledger
    could not charge them. A release with a privacy cost must be recorded before, with its records (or the
    assertion that they are the training records); one without (a ``NoOpDpEvent``: public data) needs
    nothing. ``holder``: the optimizer in words; None: there is none (``optimizer`` is a reader made for the
    statement, which the user cannot reach). A release counts as recorded when the optimizer holds it by
    identity or by content (``held_release``: e.g. restored with a model loaded from ``.keras``).
    """
    bring_up_to_date = getattr(optimizer, "_import_weights_record", None)
    if callable(bring_up_to_date):  # the releases a loaded model's weights carry (per-record ledger)
        bring_up_to_date(adopt=True)
    for release in releases:
        cost = getattr(release, "privacy", None)
        if held_release(optimizer, release) is not None or isinstance(getattr(cost, "dp_event", None),
                                                                       dp_accounting.NoOpDpEvent):
            continue
        name = _EXPORT_ARGUMENT.get(type(release).__name__, "release")
        what = f"{name}: a private release ({type(release).__name__}, epsilon {cost.epsilon:.3g})"
        how = ("the export cannot name the records it read, and the per-record ledger must charge them (a "
               "later run on them would quote an epsilon without it)")
        if holder is None:
            raise ValueError(
                f"{what} for a model without a DP optimizer to record it on: {how}. Compile the model with a "
                "DP optimizer (it takes these weights' record from the privacy record store) and give it to "
                "the private fit with the release's records (optimizer=, x=/y= or record_ids=), or pass "
                "privacy= (the statement written as given)")
        raise ValueError(
            f"{what} that {holder} has not recorded: {how}. Record it first with its records: give the "
            "private fit optimizer= and x=/y= or record_ids= (or optimizer.record_release(release, x=..., "
            "y=...)); if it read only records that optimizer trained on, assert it by name with "
            "asserted_training_records='why'; or pass privacy= (the statement written as given)")


def noisy_bisection(query, lo, hi, queries, noise_std, margin=0.0, rng=None):
    """Bisection of [lo, hi] on the noisy sign of ``query(mid) + N(0, noise_std^2) - margin``.

    ``query`` is nondecreasing; where the noisy value is >= 0 the root is taken to be left of ``mid``
    (``hi = mid``), else right (``lo = mid``). Exactly ``queries`` steps; returns the final (lo, hi).
    """
    check_positive("noise_std", noise_std)
    rng = np.random.default_rng(rng)
    for _ in range(check_positive_int("queries", queries)):
        mid = 0.5 * (lo + hi)
        if query(mid) + rng.normal(0.0, noise_std) - margin >= 0.0:
            hi = mid
        else:
            lo = mid
    return lo, hi
