"""Where the record is kept on Keras and tf.data objects: every attribute, read and written only here.

The privacy record travels with the objects a user holds, as private attributes:

- a DP optimizer: its run record (``RunRecord``), its phase ledger as variables (``LedgerState``), the
  other releases it composes (private calibrations and the like: ``releases``, with ``parallel_basis``,
  ``release_ledger`` and ``training_records_asserted``), every DP preprocessing release found on its model
  (``preprocessing_found``), the releases no epsilon covers (``uncovered``), a private search's record
  (``search_record``) and the user's assertions tfdpbnn cannot check: a custom loop's loss keeps examples
  separate, ids given for a pipeline name its records (``loss_assertions``);
- a model: the link to the optimizer that last trained it (``ledger_link``), the optimizer its traced train
  step calls (``step_optimizer``) and a search's record;
- a preprocessing layer: its DP adapt's record (which names the state it produced), the user's public-data
  assertion and the digest of the state it was made on (``preprocessing_record``, ``public_preprocessing``,
  ``preprocessing_digest``);
- a trainable variable: the DP optimizers that trained it (``variable_trainers``), so that a model sharing
  a layer with another model, or built on another model's layers, composes their training;
- a tf.data pipeline: the keys of the records it draws from (``dataset_record_keys``) and its data
  fingerprint (``dataset_fingerprint``), found through ``prefetch``/``with_options`` wrappers.

The optimizers (the DP step) write them; the statement, the callbacks, the checks and the CLI read them.
"""

from __future__ import annotations

import typing

from tfdpbnn import _private_api

# ------------------------------------------------------------------------------------ DP optimizers
_RUN_RECORD = "_dp_record"
_LEDGER_STATE = "_dp_ledger"
_RELEASES = "_dp_releases"
_PARALLEL_BASIS = "_dp_parallel_basis"
_RELEASE_LEDGER = "_dp_release_ledger"
_PARALLEL_KEYS = "_dp_parallel_keys"
_TRAINING_RECORDS_ASSERTED = "_dp_training_records_asserted"
_PREPROCESSING_FOUND = "_dp_preprocessing"
_UNCOVERED = "_dp_uncovered"
_SEARCH_RECORD = "_dp_search_record"
_LOSS_ASSERTIONS = "_dp_loss_assertions"
# ------------------------------------------------------------------------------------ models
_LEDGER_LINK = "_tfdpbnn_ledger_link"
_STEP_OPTIMIZER = "_tfdpbnn_step_optimizer"
# ------------------------------------------------------------------------------------ preprocessing layers
_PREPROCESSING_RECORD = "_tfdpbnn_preprocessing_record"
_PUBLIC_PREPROCESSING = "_tfdpbnn_public_preprocessing"
_PREPROCESSING_DIGEST = "_tfdpbnn_preprocessing_digest"
# ------------------------------------------------------------------------------------ trainable variables
_TRAINERS = "_tfdpbnn_dp_trainers"
# ------------------------------------------------------------------------------------ tf.data pipelines
_RECORD_KEYS = "_tfdpbnn_record_keys"
_FINGERPRINT = "_tfdpbnn_data_fingerprint"


def attach_run_record(optimizer, record) -> None:
    """Give a new DP optimizer its run record (``RunRecord``) and no other releases (its constructor)."""
    setattr(optimizer, _RUN_RECORD, record)
    setattr(optimizer, _UNCOVERED, {})
    setattr(optimizer, _RELEASES, [])
    setattr(optimizer, _PARALLEL_BASIS, {})  # id(release) -> why its records are disjoint from training's
    setattr(optimizer, _RELEASE_LEDGER, {})  # id(release) -> (its per-record ledger id, on training records)
    setattr(optimizer, _PARALLEL_KEYS, {})  # id(release) -> its records' keys, checked disjoint
    setattr(optimizer, _TRAINING_RECORDS_ASSERTED, {})  # id(release) -> why it read the training records


def run_record(optimizer):
    """The ``RunRecord`` of a tfdpbnn DP optimizer; None for any other object (not a DP optimizer)."""
    return getattr(optimizer, _RUN_RECORD, None)


def set_ledger_state(optimizer, state) -> None:
    """Keep ``state`` (a ``LedgerState``: the phase ledger as optimizer variables) on ``optimizer``."""
    setattr(optimizer, _LEDGER_STATE, state)


def ledger_state(optimizer):
    """The optimizer's ``LedgerState`` (None before its constructor made one)."""
    return getattr(optimizer, _LEDGER_STATE, None)


def releases(optimizer) -> list:
    """The optimizer's other releases, ``[(release, "sequential" | "parallel"), ...]`` (mutable, in place)."""
    return getattr(optimizer, _RELEASES, [])


def parallel_basis(optimizer) -> dict:
    """``id(release) -> why its records are disjoint from training's`` for parallel releases (in place)."""
    return getattr(optimizer, _PARALLEL_BASIS, {})


def parallel_keys(optimizer) -> dict:
    """``id(release) -> (training_done when checked, keys or None)`` of parallel releases checked (in place).

    Parallel releases checked disjoint in the ledger, to check them again against later training
    (``other_releases``); the keys are held in memory only (a saved optimizer keeps when they were checked).
    """
    return getattr(optimizer, _PARALLEL_KEYS, {})


def training_records_asserted(optimizer) -> dict:
    """``id(release) -> the user's reason`` for releases asserted to have read its training records.

    A release that names none of its records is written against the training records only when the user
    asserts by name that it read them (``reserve_release(asserted_training_records=...)``); the statement
    lists the assertion under ``asserted_by_user`` (in place).
    """
    return getattr(optimizer, _TRAINING_RECORDS_ASSERTED, {})


def training_done(optimizer) -> tuple:
    """``(released phase ids, steps)`` of the optimizer's training so far: what a parallel check saw."""
    ledger = optimizer.ledger
    return [int(p.phase_id) for p in ledger.phases if p.released], int(ledger.steps)


def release_ledger(optimizer) -> dict:
    """``id(release) -> (ledger id, written on the training records, its token or None)`` (in place).

    The token (``record_ledger.new_release_token``) is in the release's ledger description: the ledger
    bound composes the release once for the histories that hold it, as an extra for every other.
    """
    return getattr(optimizer, _RELEASE_LEDGER, {})


def inherit_releases(optimizer, previous) -> None:
    """Give ``optimizer`` the other releases and DP preprocessing of ``previous`` (its model's last one)."""
    held, basis, ledger = releases(optimizer), parallel_basis(optimizer), release_ledger(optimizer)
    for release, how in releases(previous):
        if all(r is not release for r, _ in held):
            held.append((release, how))
            if id(release) in parallel_basis(previous):
                basis[id(release)] = parallel_basis(previous)[id(release)]
            if id(release) in parallel_keys(previous):
                parallel_keys(optimizer)[id(release)] = parallel_keys(previous)[id(release)]
            if id(release) in release_ledger(previous):
                ledger[id(release)] = release_ledger(previous)[id(release)]
            if id(release) in training_records_asserted(previous):
                training_records_asserted(optimizer)[id(release)] = training_records_asserted(previous)[
                    id(release)]
    add_preprocessing_found(optimizer, preprocessing_found(previous) or {})


def uncovered(optimizer) -> dict:
    """``kind -> count`` of the releases no epsilon covers (in place)."""
    return getattr(optimizer, _UNCOVERED, {})


def add_preprocessing_found(optimizer, found: dict) -> None:
    """Add what ``check_preprocessing`` found on the optimizer's model (DP releases, public assertions).

    Nothing found before is dropped: weights trained on a layer's state depend on its release even after
    the layer is adapted again, so every DP release the optimizer has composed stays composed (a release
    counts once however often it is found: ``PreprocessingRecord.key``).
    """
    held = getattr(optimizer, _PREPROCESSING_FOUND, None)
    if held is None:
        setattr(optimizer, _PREPROCESSING_FOUND, {"dp": [], "asserted_public": []})
        held = getattr(optimizer, _PREPROCESSING_FOUND)  # as kept (Keras 3 keeps a tracked copy)
    keys = {record.key() for record in held["dp"]}
    for record in found.get("dp", ()):
        if record.key() not in keys:
            keys.add(record.key())
            held["dp"].append(record)
    public = held["asserted_public"]
    public.extend(a for a in found.get("asserted_public", ()) if a not in public)


def preprocessing_found(optimizer) -> dict | None:
    """Every DP preprocessing release and public assertion the optimizer found (or None before any check)."""
    return getattr(optimizer, _PREPROCESSING_FOUND, None)


def set_search_record(holder, record) -> None:
    """Keep a private search's ``SearchRecord`` on ``holder`` (the selected model or its optimizer)."""
    setattr(holder, _SEARCH_RECORD, record)


def search_record(holder):
    """The ``SearchRecord`` ``holder`` carries, or None."""
    return getattr(holder, _SEARCH_RECORD, None)


def set_loss_assertions(optimizer, assertions: list) -> None:
    """Keep the user's assertions that tfdpbnn cannot check (the statement's ``asserted_by_user``).

    That a custom loop's per-example loss keeps examples separate; that ``record_ids`` given for a pipeline
    name its records. Saved with the optimizer (``get_config``'s ``privacy_ledger["loss_assertions"]``).
    """
    setattr(optimizer, _LOSS_ASSERTIONS, assertions)


def loss_assertions(optimizer) -> list:
    """The assertions ``set_loss_assertions`` keeps ([] if none): loss assertions, ids for a pipeline."""
    return getattr(optimizer, _LOSS_ASSERTIONS, [])


def set_ledger_link(model, link) -> None:
    """Link ``model`` to the optimizer that trained it (so a new optimizer inherits its record)."""
    setattr(model, _LEDGER_LINK, link)


def ledger_link(model):
    """The link ``set_ledger_link`` left on ``model``, or None."""
    return getattr(model, _LEDGER_LINK, None)


def set_step_optimizer(model, optimizer) -> None:
    """Note, while Keras traces ``model``'s train step, the optimizer the step calls (None: not a DP one)."""
    import weakref

    object.__setattr__(model, _STEP_OPTIMIZER, None if optimizer is None else weakref.ref(optimizer))


def step_optimizer(model):
    """``(traced, optimizer)``: whether a train step of ``model`` was traced; the DP optimizer it calls."""
    ref: typing.Any = getattr(model, _STEP_OPTIMIZER, False)
    if ref is False:
        return False, None
    return True, None if ref is None else ref()


def set_preprocessing_record(layer, record) -> None:
    """Keep a DP adapt's ``PreprocessingRecord`` on ``layer`` (it names the state it vouches for)."""
    setattr(layer, _PREPROCESSING_RECORD, record)


def set_public_preprocessing(layer, reason: str, digest: str) -> None:
    """Keep the user's assertion that ``layer`` was adapted on public data (``reason``), with its digest."""
    setattr(layer, _PUBLIC_PREPROCESSING, reason)
    setattr(layer, _PREPROCESSING_DIGEST, digest)


def preprocessing_record(layer):
    """The ``PreprocessingRecord`` of ``layer``'s last DP adapt, or None."""
    return getattr(layer, _PREPROCESSING_RECORD, None)


def public_preprocessing(layer) -> str | None:
    """The reason the user gave for ``layer``'s public adapt, or None."""
    return getattr(layer, _PUBLIC_PREPROCESSING, None)


def preprocessing_digest(layer) -> str | None:
    """``state_digest`` of ``layer`` when the user's public assertion was made, or None."""
    return getattr(layer, _PREPROCESSING_DIGEST, None)


def set_dataset_record_keys(dataset, keys) -> None:
    """Keep the keys of the records a tf.data pipeline draws from on it."""
    setattr(dataset, _RECORD_KEYS, keys)


def dataset_record_keys(dataset):
    """The record keys ``dataset`` (or a pipeline it wraps by prefetch/with_options) carries, or None."""
    return _private_api.attached_attribute(dataset, _RECORD_KEYS)


def set_dataset_fingerprint(dataset, fingerprint: str) -> None:
    """Keep a data fingerprint on a tf.data pipeline."""
    setattr(dataset, _FINGERPRINT, fingerprint)


def add_variable_trainer(variables, optimizer) -> None:
    """Note on each of ``variables`` that the DP ``optimizer`` trains it (weakly: nothing is kept alive)."""
    import weakref

    for variable in variables:
        trainers = getattr(variable, _TRAINERS, None)
        if trainers is None:
            trainers = []
            setattr(variable, _TRAINERS, trainers)
        if not any(ref() is optimizer for ref in trainers):
            trainers.append(weakref.ref(optimizer))


def variable_trainers(variables) -> list:
    """The live DP optimizers that trained any of ``variables`` (``add_variable_trainer``), each once."""
    found: dict[int, object] = {}
    for variable in variables:
        for ref in getattr(variable, _TRAINERS, ()):
            optimizer = ref()
            if optimizer is not None:
                found.setdefault(id(optimizer), optimizer)
    return list(found.values())


def dataset_fingerprint(dataset) -> str | None:
    """The data fingerprint ``dataset`` (or a pipeline it wraps by prefetch/with_options) carries, or None."""
    return _private_api.attached_attribute(dataset, _FINGERPRINT)


__all__ = [
    "add_preprocessing_found", "add_variable_trainer", "attach_run_record", "dataset_fingerprint",
    "dataset_record_keys", "inherit_releases", "ledger_link", "ledger_state",
    "parallel_basis", "preprocessing_digest", "preprocessing_found", "preprocessing_record",
    "public_preprocessing", "release_ledger", "releases", "run_record", "search_record",
    "set_dataset_fingerprint", "set_dataset_record_keys", "set_ledger_link", "set_ledger_state",
    "set_preprocessing_record", "set_public_preprocessing", "set_search_record",
    "training_records_asserted", "uncovered", "variable_trainers",
]
