"""The privacy statement of a DP optimizer: what a reader needs to check the guarantee.

``optimizer.privacy_statement()`` returns it and ``tfdpbnn.export_saved_model`` saves it as JSON beside the
model. ``epsilon`` is the optimizer's sound accountant's bound for every phase of the model's training (the
privacy ledger: what was counted, and whether the sampling was verified or asserted by the user);
``approximate_epsilon`` lists approximations beside it, which are not guarantees. ``guarantee`` is False
when the noise is replayable (``debug_noise_seed``) or state was written outside the DP step: then
``epsilon``, ``run_epsilon``, ``quote`` and ``ledger_bound`` are infinite (``ledger_bound``'s ``epsilon`` None
with ``epsilon_is_infinite`` and ``no_guarantee`` saying why), the accountant's value is kept as
``epsilon_if_noise_were_secret`` (or ``epsilon_if_state_were_untouched``, in ``ledger_bound`` too),
``guarantee_reason`` says why, and no epsilon in the statement is a guarantee.

Two numbers a reader chooses between: ``run_epsilon`` (``epsilon``: the model's own record, valid for the
weights its recorded training produced from scratch) and ``ledger_bound`` (the per-record ledger's largest
composed epsilon over the model's records, valid for any weights derived from any recorded run); ``quote``
says which one to publish.

A model whose optimizer is not a tfdpbnn DP optimizer (``load_model(compile=False)``, compiled again with
``"adam"``) gets the statement a DP optimizer gives for its weights
(``tfdpbnn.optimizers.weights_statement``), or, when nothing is known of them, a statement that no record
was found and no epsilon is claimed (``no_record_statement``).
"""

from __future__ import annotations

import math
import warnings

from tfdpbnn.record import attributes
from tfdpbnn.record.other_releases import add_other_releases, replayable_releases


def build_statement(optimizer, delta: float, model=None) -> dict:
    """The privacy statement of ``optimizer`` (a ``DPOptimizerMixin``) at ``delta`` (see the module).

    ``model`` (or else the model the optimizer last trained): its weights' record in the privacy record store
    is inherited first, and the statement's ``weights`` entry names the training behind its weights in hand.
    """
    import dp_accounting

    from tfdpbnn import privacy

    if model is not None:
        attributes.run_record(optimizer).adopt(model)
    # The accountant's values for the steps as run, replayable noise counted as if secret: a statement of
    # replayable noise says no epsilon holds (``_mark_guarantee``) and keeps these values beside it.
    replayed = optimizer.ledger
    ledger = replayed.with_secret_noise()
    by_accountant = {}
    for name in privacy.sound_accountants():
        try:
            by_accountant[name] = ledger.epsilon(delta, name)
        except dp_accounting.UnsupportedEventError:
            by_accountant[name] = None  # this accountant cannot bound this run's event
    approximate = {}
    for name in privacy.available_accountants():
        if name not in privacy.sound_accountants():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # labelled an approximation below
                    approximate[name] = ledger.approximate_epsilon(delta, name)
            except dp_accounting.UnsupportedEventError:
                approximate[name] = None
    sources = attributes.ledger_state(optimizer).closed_sources()
    current = attributes.ledger_state(optimizer).open_description()
    if current is not None and ledger.phases and len(ledger.phases) > len(sources):
        sources = sources + [current["source"]]
    asserted = [p.sampling for p, s in zip(ledger.phases, sources, strict=False)
                if s in ("asserted_by_user", "failed_pass_check")]
    asserted += list(attributes.loss_assertions(optimizer))
    epsilon = ledger.epsilon(delta, optimizer.accountant)
    weights, spent = attributes.run_record(optimizer).weights_and_spent(delta, epsilon)
    statement = {
        "method": optimizer._dp_method,
        "optimizer": type(optimizer).__name__,
        "accountant": optimizer.accountant,
        "epsilon": epsilon,
        "delta": delta,
        "noise_multiplier": optimizer.noise_multiplier,
        "l2_norm_clip": optimizer.l2_norm_clip,
        "sample_rate": optimizer.sample_rate,
        "batch_size": optimizer.batch_size,
        "num_examples": optimizer.num_examples,
        "sampling": optimizer.sampling,
        "steps": ledger.steps,
        "neighboring": ledger.neighboring if ledger.phases else optimizer.neighboring,
        "epsilon_by_accountant": by_accountant,
        "approximate_epsilon": {"values": approximate,
                                "note": "approximations (e.g. GDP's central-limit step), not guarantees"},
        "phases": [p.to_config() for p in replayed.phases],
        "asserted_by_user": asserted,
        "target_epsilon": optimizer.target_epsilon,
        "noise": {"secure_mode": optimizer._dp_static["secure_mode"],
                  "source": _noise_source(optimizer),
                  "replayable": optimizer.mechanism.noise_replayable,
                  **optimizer.mechanism.noise_bounds(optimizer.noise_multiplier),
                  "note": "float32 Gaussian noise whose radius uses up to 128 random bits; the "
                          "accountants treat it as exact"},
        "record": attributes.run_record(optimizer).statement(delta),
        "weights": weights,
        "spent": spent,
        "not_covered": {"releases": dict(attributes.uncovered(optimizer)),
                        "note": "released by these runs but covered by no epsilon above"},
        **optimizer._dp_statement_extras(),
    }
    statement = add_ledger_bound(add_other_releases(statement, optimizer, delta), optimizer, delta)
    target = model if model is not None else attributes.run_record(optimizer).model()
    return _mark_guarantee(statement, optimizer, replayed, target)


def _noise_source(optimizer) -> str:
    """What the noise of ``optimizer``'s steps depends on, in words (``tfdpbnn.privacy.noise``)."""
    if optimizer.mechanism.noise_replayable:
        return f"replayable: Philox keyed by debug_noise_seed={optimizer._dp_static['debug_noise_seed']}"
    if optimizer._dp_static["secure_mode"]:
        return "os.urandom: 128 fresh bits per step (secure_mode)"
    return "Philox keyed by 128 bits of os.urandom drawn per run, and a step counter; no user-settable seed"


def _mark_guarantee(statement: dict, optimizer, ledger, model=None) -> dict:
    """``guarantee``: False for replayable noise, written or non-finite state, or unvouched preprocessing.

    Written: state written outside the DP step; non-finite: weights holding NaN or inf; unvouched
    preprocessing: state of ``model``'s preprocessing layers that no DP release or public assertion covers.

    Replayable: ``debug_noise_seed`` (this optimizer's, or a phase of ``ledger``, the optimizer's, that
    another optimizer ran so), or a release composed into the statement fit with ``seed=``. Preprocessing:
    the optimizer's ``_dp_unvouched_preprocessing`` (a layer adapted or assigned after ``fit``).
    """
    own = optimizer.mechanism.noise_replayable
    imported = [p for p in ledger.phases if p.noise_replayable and p.released] if not own else []
    replayable = own or bool(imported)
    watch = optimizer._dp_write_watch
    written, after = optimizer._dp_note_unguaranteed()
    statement["asserted_by_user"] = list(statement["asserted_by_user"]) + [
        f"weights written after DP training used no private data (post-processing): {reason}"
        for reason in watch.post_processing_assertions()]
    statement["guarantee"] = not replayable and not written
    if after and not replayable:
        _no_guarantee(
            statement, "epsilon_if_state_were_untouched",
            f"weights written outside the DP step: no guarantee. Variable(s) {after[:3]} were changed after "
            "the last DP step of the run (by code after fit, train_on_batch or a custom loop returned) to "
            "values that are neither that step's, an epoch end's, nor weights the privacy record holds; no "
            "epsilon covers what they carry. epsilon is infinite; epsilon_if_state_were_untouched is the "
            "accountant's value. If the change used no private data, say so with "
            "optimizer.assert_post_processing(reason=...).",
            "no epsilon holds: weights were written outside the DP step")
    elif written and not replayable:
        _no_guarantee(
            statement, "epsilon_if_state_were_untouched",
            f"state written outside the DP step: no guarantee. Variable(s) {written[:3]} changed during DP "
            "training outside the DP update (a callback or code between steps); what they carry is covered "
            "by no epsilon. epsilon is infinite; epsilon_if_state_were_untouched is the accountant's value.",
            "no epsilon holds: state was written outside the DP step")
    non_finite = watch.non_finite()
    if non_finite and statement["guarantee"]:
        statement["guarantee"] = False
        _no_guarantee(
            statement, "epsilon_if_values_were_finite",
            f"non-finite weights: no guarantee. Variable(s) {non_finite[:3]} hold NaN or infinite values. A "
            "record with a NaN or infinite value (a feature, a label, its loss) makes the noised sum, and so "
            "every later weight, NaN, which the same data without it does not: the weights tell the two "
            "apart. "
            "epsilon is infinite; epsilon_if_values_were_finite is the accountant's value. Drop or repair "
            "non-finite records before training.",
            "no epsilon holds: the DP-trained weights are not finite")
    changed = [] if model is None else optimizer._dp_unvouched_preprocessing(model)
    if changed and statement["guarantee"]:
        statement["guarantee"] = False
        _no_guarantee(
            statement, "epsilon_if_preprocessing_were_unchanged",
            f"preprocessing state without a release: no guarantee. The preprocessing layer(s) {changed[:3]} "
            "hold state computed from data that neither a DP release (private_adapt_normalization, "
            "private_discretization) nor a public assertion (assert_public_preprocessing) was made on: it "
            "was adapted, assigned or set (set_weights) after the release, assertion or fit, and the model "
            "carries it with no epsilon covering it. epsilon is infinite; "
            "epsilon_if_preprocessing_were_unchanged is the accountant's value.",
            "no epsilon holds: a preprocessing layer holds state no release covers")
    seeded = replayable_releases(optimizer)
    if seeded and statement["guarantee"]:
        statement["guarantee"] = False
        _no_guarantee(
            statement, "epsilon_if_noise_were_secret",
            f"noise replayable: no guarantee. {'; '.join(seeded[:3])}: whoever knows the seed can subtract "
            "that noise. epsilon is infinite; epsilon_if_noise_were_secret is the accountant's value for "
            "secret noise. Fit the release again without seed= (secret noise from the operating system).",
            "no epsilon holds: a release's noise is replayable from a seed")
    if imported:
        _no_guarantee(
            statement, "epsilon_if_noise_were_secret",
            f"noise replayable: no guarantee. {len(imported)} phase(s) of this model's training (ids "
            f"{[p.phase_id for p in imported[:3]]}, {sum(p.steps for p in imported)} steps) were run by an "
            "optimizer built with debug_noise_seed, so whoever knows the seed can subtract their noise from "
            "the weights that carry them. epsilon is infinite; epsilon_if_noise_were_secret and the "
            "per-accountant values are what the accountant gives for secret noise, not guarantees. Train "
            "from weights that never saw a replayable run.",
            "no epsilon holds: earlier training's noise is replayable from debug_noise_seed")
    if own:
        _no_guarantee(
            statement, "epsilon_if_noise_were_secret",
            "noise replayable: no guarantee. The optimizer was built with debug_noise_seed="
            f"{optimizer._dp_static['debug_noise_seed']}, so whoever knows the seed can subtract the noise. "
            "epsilon is infinite; epsilon_if_noise_were_secret and the per-accountant values are what the "
            "accountant gives for secret noise, not guarantees.",
            "no epsilon holds: the noise is replayable from debug_noise_seed")
    return statement


def _no_guarantee(statement: dict, kept_as: str, reason: str, note: str) -> None:
    """Mark ``statement`` as holding no guarantee: epsilon inf, the accountant's value kept as ``kept_as``."""
    statement["guarantee_reason"] = reason
    statement[kept_as] = statement["epsilon"]
    statement["epsilon"] = statement["run_epsilon"] = math.inf
    statement["quote"] = {"epsilon": math.inf, "which": "guarantee", "note": note}
    # The ledger bound composes the same runs: no finite number of it holds either.
    bound = statement.get("ledger_bound")
    if bound is not None and "no_guarantee" not in bound:
        bound[kept_as] = math.inf if bound.get("epsilon_is_infinite") else bound["epsilon"]
        bound.update(epsilon=None, epsilon_is_infinite=True, no_guarantee=note)


def add_ledger_bound(statement: dict, optimizer, delta: float) -> dict:
    """``statement`` with ``run_epsilon``, ``ledger_bound`` and ``quote`` (see the module)."""
    # A private search that selected the model: its trials are training releases on the training records,
    # its noisy scores a "search" release on the validation records linked to the model's phases.
    # The model's other releases compose with every history of its training records: once, from its own
    # releases, for a history that holds the release (found by the token written with it); as an extra for
    # every other history (its records may be among the release's: one asserted to have read the training
    # records, or named in another form than training gave them).
    found = attributes.preprocessing_found(optimizer) or {"dp": []}
    in_ledger = attributes.release_ledger(optimizer)
    extra = [(r.event(), r.ledger_token) for r in found["dp"]] + [
        (r.privacy.dp_event, in_ledger.get(id(r), (None, False, None))[2])
        for r, _ in attributes.releases(optimizer)]
    unavailable = None
    accountant = statement["accountant"]
    bound = attributes.run_record(optimizer).ledger_statement(delta, accountant, extra, unavailable)
    run = statement["epsilon"]
    statement["run_epsilon"] = run
    statement["ledger_bound"] = bound
    if bound["epsilon"] is None and not bound.get("epsilon_is_infinite"):
        statement["quote"] = {
            "epsilon": run, "which": "run_epsilon",
            "note": f"no ledger bound ({bound['unavailable']}): run_epsilon holds only for the weights this "
                    "model's recorded training produced, not for weights derived from other runs on the "
                    "same records"}
        return statement
    value = math.inf if bound.get("epsilon_is_infinite") else bound["epsilon"]
    if value >= run:
        statement["quote"] = {"epsilon": value, "which": "ledger_bound",
                              "note": "quote the ledger bound: it holds for these weights and for any "
                                      "weights derived from any recorded run on these records"}
    else:
        statement["quote"] = {"epsilon": run, "which": "run_epsilon",
                              "note": "run_epsilon is larger than the ledger bound (the model's record holds "
                                      "releases the ledger does not): quote run_epsilon"}
    return statement


def no_dp_optimizer(model) -> str:
    """``model`` has no tfdpbnn DP optimizer, in words naming the one it has."""
    optimizer = getattr(model, "optimizer", None)
    return ("the model has no optimizer" if optimizer is None else
            f"the model's optimizer ({type(optimizer).__name__}) is not a tfdpbnn DP optimizer")


def no_record_statement(model, delta: float | None) -> dict:
    """The statement of weights nothing is known of: no record found, no epsilon claimed (infinite)."""
    from tfdpbnn.record import store as record_store

    path = record_store.default_path()
    where = (f"the privacy record store is off ({record_store.ENV_VAR}=off)" if path is None else
             f"the privacy record store ({path}) holds no run that wrote these weights or any of their "
             "variables")
    reason = (f"no privacy record was found for these weights: {where}, and no tfdpbnn DP optimizer trained "
              "them in this process (never DP-trained with tfdpbnn, changed since, e.g. trained without DP, "
              "quantized or pruned, or trained where this store did not record it)")
    note = "no epsilon is claimed: no privacy record was found for these weights"
    return {"no_record": reason, "guarantee": False, "guarantee_reason": reason,
            "optimizer": None, "statement_source": no_dp_optimizer(model),
            "epsilon": math.inf, "run_epsilon": math.inf, "delta": delta, "accountant": None,
            "ledger_bound": {"epsilon": None, "epsilon_is_infinite": True, "records": 0, "store": path,
                             "no_guarantee": note},
            "quote": {"epsilon": math.inf, "which": "no_record", "note": note}}


__all__ = ["add_ledger_bound", "build_statement", "no_dp_optimizer", "no_record_statement"]
