"""Releases of the private data besides the optimizer's steps, put into its privacy statement.

Three kinds, each composed with the training ledger so that the statement's ``epsilon`` covers what really
ran (the training-only value stays beside it as ``training_epsilon``):

- private releases recorded with ``optimizer.record_release`` (a private temperature or conformal
  threshold fit on private held-out data): "sequential" ones compose like a DP preprocessing release;
  "parallel" ones (fit on records held out of training record by record) compose with each other, and the
  epsilon is the larger of theirs and the rest's (McSherry 2009);
- DP preprocessing (``tfdpbnn.preprocessing.private_adapt_normalization``): each release's ``DpEvent`` is
  composed with the ledger's by every sound accountant (``ComposedDpEvent``); layers asserted public are
  listed under ``asserted_by_user``.
- a hyperparameter search (``tfdpbnn.tuning.private_search``) that selected this model: the search's RDP
  curve (every trial, the noisy scores, the selection) replaces the selected trial's training; steps taken
  after the selection add the whole ledger's RDP curve (an upper bound: the trial's steps count twice), and
  RDP curves add (Mironov 2017, Proposition 1).
"""

from __future__ import annotations

import dataclasses

import dp_accounting
import numpy as np

from tfdpbnn.record import attributes


@dataclasses.dataclass(frozen=True)
class SearchRecord:
    """What a ``private_search`` spent (Papernot & Steinke 2022 for random stopping).

    Its statement, its RDP curve at ``tfdpbnn.tuning.bounds.ORDERS`` (the
    orders of ``tfdpbnn.privacy._rdp_conversion``), and the selected model's ledger steps
    at the selection.
    """

    statement: dict
    rdp: tuple
    steps_at_selection: int


@dataclasses.dataclass(frozen=True)
class RestoredRelease:
    """A release recorded with ``record_release``, as a saved optimizer or the per-record ledger kept it.

    ``privacy``: its privacy cost (a ``tfdpbnn.uncertainty.PrivacyCost``).

    ``record``: what the original release's ``as_dict`` said (its value, e.g. the temperature, and its cost);
    ``ledger_release``: its id in the per-record ledger, or None.
    """

    privacy: object
    record: dict
    ledger_release: int | None = None

    def as_dict(self):
        """The original release's record."""
        return dict(self.record)


def release_config(release, composition: str, basis: str | None, ledger_release: int | None,
                   on_training_records: bool, ledger_token: str | None = None, checked_at=None,
                   asserted_training_records: str | None = None) -> dict:
    """JSON-safe config of one recorded release (``get_config()["privacy_ledger"]["releases"]``).

    ``ledger_token``: the token its ledger description holds (``record_ledger.new_release_token``), or None.
    ``checked_at``: a parallel release's ``attributes.training_done`` when last checked disjoint, or None.
    ``asserted_training_records``: the user's reason that it read the training records, or None.
    """
    record = release.as_dict() if hasattr(release, "as_dict") else {"privacy": release.privacy.as_dict()}
    return {"type": type(release).__name__, "record": record, "privacy": release.privacy.as_dict(),
            "composition": composition, "basis": basis, "ledger_release": ledger_release,
            "on_training_records": bool(on_training_records), "ledger_token": ledger_token,
            **({} if checked_at is None else {"checked_at": [list(checked_at[0]), int(checked_at[1])]}),
            **({} if asserted_training_records is None
               else {"asserted_training_records": asserted_training_records})}


def release_from_config(config: dict) -> RestoredRelease:
    """The ``RestoredRelease`` of ``release_config``'s dict."""
    from tfdpbnn.record.private_release import PrivacyCost
    from tfdpbnn.record.record_ledger import event_from_config

    cost = dict(config["privacy"])
    cost["dp_event"] = event_from_config(cost["dp_event"])
    return RestoredRelease(privacy=PrivacyCost(**cost), record=dict(config["record"]),
                           ledger_release=config.get("ledger_release"))


def search_config(record: SearchRecord | None) -> dict | None:
    """JSON-safe config of a ``SearchRecord`` (None for None)."""
    if record is None:
        return None
    import json

    def plain(value):  # numpy scalars and arrays in the search's statement, as JSON numbers and lists
        return value.tolist() if hasattr(value, "tolist") else str(value)

    statement = json.loads(json.dumps(record.statement, default=plain))
    return {"statement": statement, "rdp": [float(v) for v in record.rdp],
            "steps_at_selection": int(record.steps_at_selection)}


def search_from_config(config: dict | None) -> SearchRecord | None:
    """The ``SearchRecord`` of ``search_config``'s dict."""
    if not config:
        return None
    return SearchRecord(statement=dict(config["statement"]), rdp=tuple(float(v) for v in config["rdp"]),
                        steps_at_selection=int(config["steps_at_selection"]))


def adopt_search_record(optimizer, model) -> None:
    """Give ``optimizer`` the search record ``model`` carries (a new optimizer compiled onto it)."""
    record = attributes.search_record(model)
    if record is not None and attributes.search_record(optimizer) is None:
        attributes.set_search_record(optimizer, record)


def _rdp_curve(event, neighboring):
    from tfdpbnn.privacy._rdp_conversion import ORDERS
    from tfdpbnn.privacy.budget import NEIGHBORING

    accountant = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS),
                                                 neighboring_relation=NEIGHBORING[neighboring])
    return np.asarray(accountant.compose(event).rdp, dtype=np.float64)


def composed_epsilon(optimizer, ledger, delta: float, accountant: str) -> float:
    """Epsilon of ``ledger`` composed with the optimizer's other releases (see the module).

    Without any it is ``ledger.epsilon``. With DP preprocessing or sequential releases the events compose
    under ``accountant``; parallel releases compose with each other and the larger epsilon counts.
    With a search record the composition is by RDP whatever ``accountant`` is (the search's bound is an RDP
    curve).
    """
    from tfdpbnn.privacy._rdp_conversion import ORDERS, curve_epsilon
    from tfdpbnn.record.ledger import _epsilon_of

    found = attributes.preprocessing_found(optimizer) or {"dp": []}
    sequential, parallel = _recorded(optimizer)
    events = [r.event() for r in found["dp"]] + [r.privacy.dp_event for r in sequential]
    search = attributes.search_record(optimizer)
    if search is None:
        if not events:
            epsilon = ledger.epsilon(delta, accountant)
        else:
            epsilon = _epsilon_of(dp_accounting.ComposedDpEvent([ledger.event(), *events]), delta, accountant,
                                  ledger.neighboring)
        if parallel:  # disjoint records: the larger of the two parts' epsilons (parallel composition)
            held_out = dp_accounting.ComposedDpEvent([r.privacy.dp_event for r in parallel])
            epsilon = max(epsilon, _epsilon_of(held_out, delta, accountant, ledger.neighboring))
        return epsilon
    if parallel:
        raise ValueError("record_release: parallel releases on a model selected by private_search are not "
                         "supported; record them with composition='sequential'")
    curve = np.asarray(search.rdp, dtype=np.float64)
    if ledger.steps > search.steps_at_selection:
        curve = curve + _rdp_curve(ledger.event(), ledger.neighboring)
    for event in events:
        curve = curve + _rdp_curve(event, ledger.neighboring)
    return curve_epsilon(ORDERS, curve, delta)


def _recorded(optimizer):
    """The releases recorded with ``record_release``: (sequential ones, parallel ones).

    A parallel release checked disjoint from training (``parallel_keys``) is checked again against the
    training its optimizer has done since (the same optimizer on the held-out records): one that training
    touched becomes sequential, in place, its basis saying why (``_still_disjoint``).
    """
    recorded = attributes.releases(optimizer)
    for i, (release, how) in enumerate(recorded):
        if how == "parallel" and not _still_disjoint(optimizer, release):
            recorded[i] = (release, "sequential")
    return ([r for r, how in recorded if how == "sequential"],
            [r for r, how in recorded if how == "parallel"])


def _records_of(ledger, token: str):
    """The keys of the records whose histories hold the release of ``token`` (None: none found)."""
    import numpy as np

    ids = [h.history_id for h in ledger.histories() if any(r.token == token for r in h.releases)]
    if not ids:
        return None
    keys, twins = ledger.backend.keys(ids)
    return np.concatenate([np.asarray(keys, np.int64), np.asarray(twins, np.int64)])


def _still_disjoint(optimizer, release) -> bool:
    """Whether a parallel release's records are still disjoint from its optimizer's training records.

    Asserted ones stay as the user asserted them (the statement lists the assertion). Checked ones are
    checked again in the per-record ledger (``overlap`` of the release's records with every training phase
    of the optimizer): their keys are held in memory, or found in the ledger by the release's token (an
    optimizer restored from a config). Without either, one whose optimizer has trained since the check
    (``training_done``) cannot be checked and becomes sequential.
    """
    basis = attributes.parallel_basis(optimizer)
    why = basis.get(id(release), "")
    if not why.startswith("checked"):
        return True
    from tfdpbnn.record.record_ledger import default_ledger

    done = attributes.training_done(optimizer)
    checks = attributes.parallel_keys(optimizer)
    checked_at, keys = checks.get(id(release), (None, None))
    ledger = default_ledger()
    if keys is None and ledger is not None:
        token = attributes.release_ledger(optimizer).get(id(release), (None, None, None))[2]
        keys = _records_of(ledger, token) if token else None
        if keys is not None:
            checks[id(release)] = (checked_at, keys)
    touched = None
    if keys is not None and ledger is not None:
        touched, _ = ledger.overlap(keys, done[0])
    elif checked_at is not None and list(checked_at[0]) == done[0] and int(checked_at[1]) == done[1]:
        return True  # no training since the check
    if touched == 0:
        return True
    basis[id(release)] = (f"no longer disjoint: training after the release touched {touched} of its records "
                          "(per-record ledger); composed sequentially" if touched else
                          "no longer checked: training after the release could not be checked against its "
                          "records (their keys are not held here); composed sequentially")
    checks.pop(id(release), None)
    return False


def replayable_releases(optimizer) -> list:
    """The optimizer's other releases whose noise came from a user-given seed, in words (empty: none).

    A recorded release (``PrivacyCost.replayable_from``), a DP preprocessing layer adapted with ``seed=``,
    or a private search run with ``seed=`` (its noisy scores are drawn from it): whoever knows the seed can
    subtract the noise, so the statement that composes them holds no guarantee.
    """
    found = attributes.preprocessing_found(optimizer) or {"dp": []}
    out = [f"release {type(r).__name__} ({r.privacy.mechanism}): noise replayable from "
           f"{r.privacy.replayable_from}" for r, _ in attributes.releases(optimizer)
           if getattr(r.privacy, "replayable_from", None)]
    out += [f"preprocessing layer {r.layer!r}: noise from {r.details['noise']}" for r in found["dp"]
            if r.details.get("noise", "secret") != "secret"]
    search = attributes.search_record(optimizer)
    if search is not None and search.statement.get("randomness", "secret") != "secret":
        out.append(f"private_search: scores' noise and trial draws from {search.statement['randomness']}")
    return out


def add_other_releases(statement: dict, optimizer, delta: float) -> dict:
    """``statement`` with the preprocessing and search releases added and composed (see the module)."""
    from tfdpbnn import privacy

    found = attributes.preprocessing_found(optimizer) or {"dp": [], "asserted_public": []}
    search = attributes.search_record(optimizer)
    if found["dp"] or found["asserted_public"]:
        statement["preprocessing"] = {
            "dp": [dict(r.to_config(), event=repr(r.event())) for r in found["dp"]],
            "asserted_public": list(found["asserted_public"]),
            "note": "preprocessing layers whose state came from data: DP releases (composed into epsilon) "
                    "and layers the user asserted were adapted on public data"}
        statement["asserted_by_user"] = list(statement["asserted_by_user"]) + [
            f"layer {a['layer']!r} ({a['type']}): its state (adapted or set, not trained) comes from public "
            f"data only: {a['reason']}"
            for a in found["asserted_public"]]
    recorded = list(attributes.releases(optimizer))
    if recorded:
        basis = attributes.parallel_basis(optimizer)
        on_training = attributes.training_records_asserted(optimizer)
        statement["releases"] = [
            dict(r.as_dict() if hasattr(r, "as_dict") else {"privacy": r.privacy.as_dict()}, composition=how,
                 **({"disjoint_from_training": basis[id(r)]} if id(r) in basis else {}),
                 **({"asserted_training_records": on_training[id(r)]} if id(r) in on_training else {}))
            for r, how in recorded]
        statement["asserted_by_user"] = list(statement["asserted_by_user"]) + [
            f"release {i} ({type(r).__name__}, parallel composition): its records are disjoint from the "
            f"training records, {basis[id(r)]}" for i, (r, how) in enumerate(recorded)
            if how == "parallel" and basis[id(r)].startswith("asserted")] + [
            f"release {i} ({type(r).__name__}, {how} composition): it read only records this optimizer's "
            f"training used, so it is charged to those records (asserted_training_records): "
            f"{on_training[id(r)]}" for i, (r, how) in enumerate(recorded) if id(r) in on_training]
    if not found["dp"] and not recorded and search is None:
        return statement
    ledger = optimizer.ledger
    statement["training_epsilon"] = statement["epsilon"]
    statement["training_epsilon_by_accountant"] = statement["epsilon_by_accountant"]
    if search is None:
        by_accountant = {}
        for name in privacy.sound_accountants():
            try:
                by_accountant[name] = composed_epsilon(optimizer, ledger, delta, name)
            except dp_accounting.UnsupportedEventError:
                by_accountant[name] = None
        statement["epsilon"] = composed_epsilon(optimizer, ledger, delta, optimizer.accountant)
        statement["epsilon_by_accountant"] = by_accountant
        sequential, parallel = _recorded(optimizer)
        statement["epsilon_covers"] = ", ".join(
            ["the training ledger"] + (["the DP preprocessing releases"] if found["dp"] else [])
            + (["the recorded private releases"] if sequential else [])) + ", composed" + (
            "; with the releases fit on records held out of training (split record by record) by parallel "
            "composition: the larger of their composed epsilon and the above" if parallel else "")
        return statement
    epsilon = composed_epsilon(optimizer, ledger, delta, "rdp")
    after = ledger.steps > search.steps_at_selection
    statement["search"] = dict(search.statement)
    statement["asserted_by_user"] = list(statement["asserted_by_user"]) + [
        f"the search that selected this model: {a}" for a in search.statement.get("asserted_by_user", ())]
    statement["training_accountant"] = statement["accountant"]
    statement["accountant"] = "rdp"
    statement["epsilon"] = epsilon
    statement["epsilon_by_accountant"] = {name: (epsilon if name == "rdp" else None)
                                          for name in privacy.sound_accountants()}
    statement["epsilon_covers"] = (
        "the hyperparameter search that selected this model (every trial, the noisy scores, the selection; "
        "RDP)" + (", the training after the selection (the whole ledger again, an upper bound)" if after
                  else "") + (", the DP preprocessing releases" if found["dp"] else "")
        + (", the recorded private releases" if recorded else ""))
    return statement


__all__ = ["RestoredRelease", "SearchRecord", "add_other_releases", "adopt_search_record",
           "composed_epsilon", "release_config", "release_from_config", "replayable_releases",
           "search_config", "search_from_config"]
