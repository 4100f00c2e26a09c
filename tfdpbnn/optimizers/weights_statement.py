"""The privacy statement of a model's weights when its optimizer is not a tfdpbnn DP optimizer.

A model loaded with ``load_model(compile=False)`` or compiled again with ``"adam"`` has no DP optimizer to
state its privacy; the statement is the one a DP optimizer compiled on its weights would give (the record
the privacy record store holds for them, and the DP optimizers of this process that trained them), or,
when nothing is known, ``tfdpbnn.record.statement.no_record_statement``. ``export_saved_model`` writes it.
"""

from __future__ import annotations

from tfdpbnn.record import attributes
from tfdpbnn.record.statement import no_dp_optimizer

#: The statement's entries that describe the optimizer itself, which a model without a DP optimizer lacks.
_OPTIMIZER_ENTRIES = ("method", "optimizer", "noise_multiplier", "l2_norm_clip", "sample_rate", "batch_size",
                      "num_examples", "sampling", "target_epsilon")


def weights_statement(model, delta: float | None, releases=()) -> dict | None:
    """The privacy statement of ``model``'s weights when its optimizer is not a tfdpbnn DP optimizer.

    The statement of the DP optimizer that last trained ``model`` in this process, if any; else the one a
    new DP optimizer compiled on these weights gives before its first step (``privacy_statement(model=)``:
    the record the privacy record store holds for the weights or any of their variables, and the training of
    every DP optimizer in this process that updated them), with the entries that describe an optimizer set
    to None. ``releases`` (private calibrations) are recorded on it first (``record_release``), so its
    ``epsilon`` composes them: on the DP optimizer that trained ``model``, only those it recorded before with
    the records they read (or without privacy cost); with none, only those without privacy cost (a private
    one is refused: ``ValueError``, ``private_release.refuse_unrecorded_releases``). ``delta``: the
    statement's delta (None: the training optimizer's; required when there is none). Returns None when
    nothing is known of these weights (``no_record_statement``).
    """
    from tfdpbnn.record import store as record_store
    from tfdpbnn.record.private_release import refuse_unrecorded_releases

    link = attributes.ledger_link(model)
    if link is not None and attributes.run_record(getattr(link, "optimizer", None)) is not None:
        trainer = link.optimizer
        refuse_unrecorded_releases(trainer, releases, f"the DP optimizer that trained the model in this "
                                                      f"process ({type(trainer).__name__})")
        for release in releases:
            trainer.record_release(release)
        statement = trainer.privacy_statement(delta=delta, model=model)
        statement["statement_source"] = (
            f"{no_dp_optimizer(model)}: this is the statement of the DP optimizer that last trained the "
            f"model in this process ({type(trainer).__name__})")
        return statement
    from tfdpbnn.optimizers.dpsgd import DPSGDOptimizer

    # Its own settings describe nothing that ran (set to None below); what it states is what it inherits.
    reader = DPSGDOptimizer(1.0, 0.0, num_examples=1, batch_size=1, delta=delta, name="record_reader")
    trainers = attributes.variable_trainers(model.trainable_variables)
    if trainers:
        reader._import_shared_training(model)
    else:  # the store's record alone (a reader that adopts nothing is not noted as a trainer)
        attributes.run_record(reader).adopt(model)
        if not any(p.released for p in reader.ledger.phases):
            return None
    if delta is None:
        deltas = {t.delta for t in trainers} - {None}
        if len(deltas) != 1:
            phases = reader.ledger.phases
            raise ValueError(
                f"delta: {no_dp_optimizer(model)}, and the training of these "
                f"weights is known ({len(phases)} phase(s), {sum(p.steps for p in phases)} DP steps, in the "
                f"privacy record store {record_store.default_path()} or from this process's DP optimizers); "
                "pass delta= (the delta of their privacy statement) to state their epsilon")
        delta = deltas.pop()
    refuse_unrecorded_releases(reader, releases)  # none recorded on a reader: private ones are refused
    for release in releases:
        reader.record_release(release)
    statement = reader.privacy_statement(delta=delta, model=model)
    statement.update({key: None for key in _OPTIMIZER_ENTRIES})
    statement["noise"] = {
        "note": "as each recorded run's optimizer drew it (phases list the noise multipliers); a run whose "
                "noise was replayable (debug_noise_seed) is a non-private release in the per-record ledger, "
                "so the ledger bound and the quote are infinite then"}
    statement["not_covered"]["note"] = (
        "released by these runs but covered by no epsilon above; those that the training's optimizer noted "
        "(training metrics, validation) travel with that optimizer (model.save with it, load_model with "
        "compile) and are unknown here unless it trained these weights in this process")
    if statement["record"].get("store") is not None:
        statement["record"]["note"] = "no DP fit by this model's optimizer: the store's runs hold the rest"
    statement["statement_source"] = (
        f"{no_dp_optimizer(model)}: this is the statement a tfdpbnn DP optimizer compiled on these weights "
        "gives (the record "
        "the privacy record store holds for them, and DP optimizers of this process that trained their "
        "variables)")
    return statement


__all__ = ["weights_statement"]
