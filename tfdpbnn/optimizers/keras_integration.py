"""The Keras integration: ``model.fit`` with a tfdpbnn DP optimizer runs the DP step and counts what it ran.

Importing tfdpbnn changes nothing in Keras. Keras 2.15's ``Model.train_step`` reduces the loss to a scalar
before the optimizer sees it, leaving nothing to clip per example, and ``compile``/``fit`` call nothing on
the optimizer before tracing the train step, so ``fit`` can only learn that its optimizer is private through
``tf.keras.Model`` itself. ``install()`` is therefore run by the constructor of the first tfdpbnn DP optimizer
(the first act of DP training in the process), once, and puts two dispatching methods on
``tf.keras.Model``:

- ``train_step``: when ``model.optimizer`` is a tfdpbnn DP optimizer, ``optimizer.dp_train_step(model,
  data)`` (``optimizer.mechanism``: per-example clipping, one noise draw, update, metrics); for any other
  optimizer, Keras's original ``train_step``, called unchanged.
- ``fit``: with a DP optimizer it takes one more argument, ``record_ids`` (the training records' ids for
  the per-record ledger, ``tfdpbnn.record.record_ledger``), and first calls ``optimizer.begin_training``
  (checks the input and the model, opens the privacy-ledger phase), warns when the planned training exceeds
  the optimizer's budget, and puts ``DPTrainingMonitor`` (budget stop, Poisson test of the realized batch
  sizes, epsilon in the logs) and any ``PrivacyCallback`` at the front of the callbacks, so that ``History``
  and ``TensorBoard`` see epsilon; for any other optimizer, Keras's original ``fit``, called unchanged.

- ``train_on_batch``: with a DP optimizer it first calls ``optimizer.begin_batch_call`` (the model checks;
  each call's step counted as one participation of every example, never pooled into passes across calls;
  refused once the budget is spent).
- ``compile``: Keras's own, then, when it replaced a DP optimizer that had released steps and no optimizer
  is linked to the model yet (a model ``load_model`` restored with its DP optimizer), the model is linked
  to the replaced one, so that its phases and releases stay the model's (``_link_replaced_optimizer``).

A DP optimizer only applies gradients its mechanism released in that step (``apply_gradients`` refuses any
others), and a DP optimizer wrapped in a ``LossScaleOptimizer`` (mixed precision) is refused.

Models that override ``train_step`` keep their own: they call ``self.optimizer.dp_train_step(self, data)``,
or ``self.optimizer.minimize(per_example_loss, vars, tape=tape)`` (a scalar raises ``ValueError``), or
``self.optimizer.mechanism`` directly; ``fit`` still runs the checks and the monitor.
"""

from __future__ import annotations

import functools
import inspect
import math

import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.record import attributes

_original_train_step = None
_original_fit = None
_original_train_on_batch = None
_original_compile = None


def dp_optimizer_of(model):
    """``model.optimizer`` when it is a tfdpbnn DP optimizer, else None.

    Raises ``ValueError`` for a DP optimizer wrapped in a ``LossScaleOptimizer`` (a mixed-precision dtype
    policy), which would apply gradients outside the DP mechanism.
    """
    from tfdpbnn.optimizers.fit_checks import check_compute_dtype

    optimizer = getattr(model, "optimizer", None)
    if attributes.run_record(optimizer) is not None:  # only a tfdpbnn DP optimizer keeps a run record
        return optimizer
    inner = getattr(optimizer, "inner_optimizer", None)
    if attributes.run_record(inner) is not None:
        check_compute_dtype(model)
        raise ValueError(f"optimizer: {type(inner).__name__} is wrapped in {type(optimizer).__name__}; "
                         "tfdpbnn DP optimizers cannot be wrapped (it would apply gradients outside the DP "
                         "mechanism)")
    return None


def _planned_steps(model, x, arguments):
    """Steps ``fit`` will run (None when the input's length is unknown)."""
    from tfdpbnn.optimizers import fit_checks

    epochs = int(arguments.get("epochs", 1)) - int(arguments.get("initial_epoch", 0))
    per_epoch = arguments.get("steps_per_epoch")
    if per_epoch is None:
        if isinstance(x, tf.data.Dataset):
            card = int(x.cardinality().numpy())
            per_epoch = card if card > 0 else None
        else:
            rows = fit_checks._num_rows(x)
            if rows is not None:
                train = int(math.floor(rows * (1.0 - float(arguments.get("validation_split") or 0.0))))
                batch = arguments.get("batch_size") or 32
                per_epoch = int(math.ceil(train / batch))
    if per_epoch is None:
        return None
    return max(0, epochs) * int(per_epoch)


def _named_ways(keys) -> tuple:
    """``(keys, content keys)``: records named by ids with their rows carry their content (``IdKeys``).

    The content keys are None for records named by content, or by ids without their rows.
    """
    import numpy as np

    content = getattr(keys, "content", None)
    return np.asarray(keys, np.int64), (None if content is None else np.asarray(content, np.int64))


def _planned_examples(x, arguments, planned, description, whole_passes) -> int | None:
    """An upper bound of the examples a ``fit`` on a shuffled pipeline processes (None: steps x batch_size).

    The run's reservation (the per-record and the data-set budgets) counts its planned participations from
    the examples its planned steps process. A pipeline's batches are counted as they come, not as the
    optimizer's ``batch_size``: a full-batch pipeline's step is a whole pass. Iterated whole each epoch
    (``whole_passes``), an epoch is at most one pass (a pass of more examples is refused and voids the
    guarantee): ``num_examples`` per epoch. Otherwise a step holds at most ``num_examples`` examples (each
    record at most once in a pass, as asserted), or the batch dimension of the pipeline's elements where
    it is fixed. Arrays (Keras's batches of ``batch_size``) and Poisson steps: None.
    """
    if planned is None or not isinstance(x, tf.data.Dataset) or description["kind"] != "shuffle":
        return None
    n = int(description["num_examples"])
    if whole_passes:
        epochs = int(arguments.get("epochs", 1)) - int(arguments.get("initial_epoch", 0))
        return max(0, epochs) * n
    element = x.element_spec[0] if isinstance(x.element_spec, tuple) else x.element_spec
    rows = {getattr(s, "shape", tf.TensorShape(None)) for s in tf.nest.flatten(element)}
    fixed = {int(shape[0]) for shape in rows if shape.rank and shape[0] is not None}
    per_step = min(max(fixed), n) if fixed else n
    return int(planned) * per_step


def _recorded_training_records(keys, train_keys=None) -> int:
    """How many records of ``keys`` are in ``train_keys`` or trained on by a run in the per-record ledger.

    A row is compared under every key it may have been named by: its key, its content key where it came
    with ids and rows, and that content's twin key (``content_twins``: the rows a release named by ids with
    their rows). So rows named by content are found in a training named by ids with the same rows, in this
    fit (``train_keys``) or in the ledger, and the other way round.
    """
    import numpy as np

    from tfdpbnn.record.record_ledger import content_twins, default_ledger

    keys, content = _named_ways(keys)
    if not len(keys):
        return 0
    mine = [keys] if content is None else [keys, content]
    overlap = 0
    if train_keys is not None:
        train, train_content = _named_ways(train_keys)
        theirs = train if train_content is None else np.concatenate([train, train_content])
        held = np.zeros(len(keys), bool)
        for ours in mine:
            held |= np.isin(ours, theirs)
        overlap = int(held.sum())
    ledger = default_ledger()
    if not overlap and ledger is not None:
        named = keys if content is None else np.concatenate([keys, content])
        twins = content_twins(keys if content is None else content)
        overlap = sum(h.records for h in ledger.histories(named, twins=twins)
                      if any(r.kind == "training" for r in h.releases))
    return min(overlap, len(np.unique(keys)))


def _validation_keys(validation):
    """The record keys of ``validation_data`` (``tfdpbnn.record.records.input_keys``), or None if unknown.

    Arrays are hashed. A ``tf.data`` pipeline is read once, batch by batch (its records' keys kept, not
    its data), when TensorFlow knows it is finite (a pipeline of unknown or infinite size is not read);
    each batch's rows are records, hashed as arrays of the same rows would be. None for a pipeline with
    ragged or sparse parts, a generator, or anything else the keys cannot be made of.
    """
    import numpy as np

    from tfdpbnn.record.records import input_keys

    def keys_of(element):
        parts = tuple(element) if isinstance(element, tuple | list) else (element,)
        try:
            return input_keys(parts[0], parts[1] if len(parts) > 1 else None)
        except (ValueError, TypeError):
            return None

    if not isinstance(validation, tf.data.Dataset):
        return keys_of(validation)
    if int(validation.cardinality()) < 0 or any(
            not isinstance(spec, tf.TensorSpec) or spec.shape.rank == 0
            for spec in tf.nest.flatten(validation.element_spec)):
        return None
    found = []
    for element in validation:
        keys = keys_of(tf.nest.map_structure(lambda t: t.numpy(), element))
        if keys is None:
            return None
        found.append(keys)
    return np.concatenate(found) if found else None


def _refuse_validation_on_training_records(validation, train_keys) -> None:
    """Refuse ``validation_data`` holding records this fit or a recorded run trains on.

    Keras computes the validation loss and metrics without noise and puts them in the logs every epoch (and
    callbacks act on them: ``EarlyStopping``, ``ReduceLROnPlateau``): on training records that is an exact
    release of them, which no epsilon covers. Records are compared by their ledger keys
    (``tfdpbnn.record.records``: content, or ``record_ids`` for training) of arrays, or of a finite
    ``tf.data`` pipeline read once (``_validation_keys``); one whose keys are unknown stays listed under
    ``not_covered``.
    """
    import numpy as np

    keys = _validation_keys(validation)
    if keys is None:
        return
    overlap = _recorded_training_records(keys, train_keys)
    if overlap:
        raise ValueError(
            f"validation_data: {overlap} of its {len(np.unique(keys))} records are training records (of this "
            "fit or of a run recorded in the per-record ledger). Keras would put their loss and metrics, "
            "computed without noise, in the logs at every epoch: an exact release of training records that "
            "no epsilon covers. Validate on records held out of all DP training "
            "(tfdpbnn.uncertainty.split_by_record), or evaluate on training records with a DP mechanism.")


def _refuse_callbacks_acting_on_released_metrics(optimizer, callbacks) -> None:
    """Refuse a callback that acts on a training-batch metric released without noise.

    ``release_training_metrics`` puts the training batches' loss and metrics, computed without noise, in
    the logs: a release no epsilon covers, listed under ``not_covered``. A callback that monitors one of
    them (``EarlyStopping``, ``ReduceLROnPlateau``, ``ModelCheckpoint(save_best_only=True)``: any callback
    with a ``monitor`` that acts on it) makes the training, and so the weights, depend on that release:
    the printed epsilon would no longer cover the weights. Monitors of validation metrics (``val_...``)
    are validation's business (``_refuse_validation_on_training_records``).
    """
    released = optimizer.release_training_metrics
    if not released:
        return
    if isinstance(callbacks, tf.keras.callbacks.CallbackList):
        callbacks = list(callbacks.callbacks)
    for callback in callbacks or []:
        monitor = getattr(callback, "monitor", None)
        if not isinstance(monitor, str) or monitor.startswith("val_") or (
                isinstance(callback, tf.keras.callbacks.ModelCheckpoint)
                and not getattr(callback, "save_best_only", False)):
            continue
        if released is True or monitor in released:
            raise ValueError(
                f"callbacks: {type(callback).__name__} monitors {monitor!r}, a training-batch metric this "
                "optimizer releases without noise (release_training_metrics): acting on it (stopping, a "
                "new learning rate, the weights kept) makes the weights depend on a release that no epsilon "
                "covers. Monitor a validation metric on records held out of DP training (val_...), or do "
                "not release the training metrics.")


def _finite_cardinality(dataset) -> int | None:
    """The number of batches one iteration of ``dataset`` yields, when TensorFlow knows it (else None)."""
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality >= 0 else None


def _refuse_ids_not_naming_every_record(dataset, keys, description) -> None:
    """Refuse ``record_ids`` for a pipeline that do not name as many records as it draws from.

    The ids replace the pipeline's own record keys in the per-record ledger (``tag_record_keys``, which
    ``tfdpbnn.data.poisson_batches`` sets): a record left without an id would get no release in the ledger,
    and its budget would not see this run. Compared with the tagged keys' count, else with the number of
    examples the run's sampling is accounted over (``num_examples``).
    """
    tagged = attributes.dataset_record_keys(dataset)  # one key per row
    expected = len(tagged) if tagged is not None else (
        None if description is None else description["num_examples"])
    if expected is not None and len(keys) != expected:
        source = ("its tagged records" if tagged is not None
                  else "num_examples, the examples it is accounted over")
        raise ValueError(
            f"record_ids: {len(keys)} ids for a pipeline that draws from {expected} records ({source}); "
            "give one id per record the pipeline can draw, or leave record_ids out to use the records it "
            "was tagged with.")


def _refuse_tagged_keys_not_naming_every_record(keys, description) -> None:
    """Refuse a pipeline tagged with another number of record keys than the records it is accounted over.

    ``tag_record_keys`` names the records a pipeline draws from in the per-record ledger: a run on it is
    written against those keys only, so a record without a key would get no release there, and a later run
    on it (its budget, its ledger bound) would not count this one. One key per record is required, as for
    ``record_ids`` (``_refuse_ids_not_naming_every_record``); ``num_examples`` is the n its sampling is
    accounted over, checked against the pipeline's own n (``fit_checks.input_sampling``).
    """
    expected = None if description is None else description["num_examples"]
    if expected is not None and len(keys) != expected:
        raise ValueError(
            f"tag_record_keys: the pipeline is tagged with {len(keys)} record keys, but its sampling is "
            f"accounted over num_examples={expected} records; a record without a key would get no release "
            "in the per-record ledger. Tag it with one key per record it can draw "
            "(tfdpbnn.record.records.record_keys of all its rows), or pass fit(..., record_ids=...) with one "
            "id per record.")


#: The statement's ``asserted_by_user`` entry of a ``fit`` given ``record_ids`` for a pipeline.
IDS_WITHOUT_ROWS = (
    "record_ids given to fit for a tf.data pipeline name the records it draws from, in any order: the ids "
    "came without their rows, so tfdpbnn checked only their number (one distinct id per record the "
    "pipeline can draw), not which records they name")


def _note_ids_without_rows(optimizer) -> None:
    """List the user's claim that ``record_ids`` given for a pipeline name its records (``asserted_by_user``).

    Ids given with their rows keep the rows' content keys and are checked against other namings
    (``RecordNamingError``); ids given for a pipeline replace its records' keys unchecked, so the per-record
    ledger, and the ledger bound, hold for the records the ids name only if they are the pipeline's.
    """
    held = attributes.loss_assertions(optimizer)
    if IDS_WITHOUT_ROWS not in held:
        held.append(IDS_WITHOUT_ROWS)


def refuse_non_private_training(model, x, y=None, record_ids=None, call="fit") -> None:
    """Refuse training a DP-trained ``model`` without DP on records that DP training used.

    A model a tfdpbnn DP optimizer trained (in this process, or whose weights the privacy record store
    holds) compiled with a plain optimizer (``"adam"``) and fit on the private records takes their
    gradients without clipping or noise into the weights; a later DP optimizer, or the earlier one compiled
    again, would then print an epsilon for weights that no epsilon covers. A model counts as DP-trained
    when a DP optimizer trained it or any of its variables in this process (a trained model
    wrapped in a new one, its layers under a new head), or when the record store holds its weights or any of
    its variables (``weights_record`` with the variables' keys: such layers loaded or copied elsewhere). The
    records are compared by their ledger keys (content, ``record_ids``, or a tagged pipeline's keys); data
    with unknown records (an untagged pipeline, a generator) and models never DP-trained are not checked.
    """
    from tfdpbnn.record import store as record_store
    from tfdpbnn.record.records import input_keys

    if record_store.default_path() is None:
        return
    if not _dp_trainers(model):
        store = record_store.default_store()
        weights, variables = record_store.weights_identity(model)
        if not store.weights_record(weights, variables=variables,
                                    legacy=record_store.legacy_lookup(model)):
            return
    try:
        keys = input_keys(x, y, record_ids)
    except (ValueError, TypeError):
        return
    if keys is None:
        return
    overlap = _recorded_training_records(keys)
    if overlap:
        raise ValueError(
            f"optimizer: {type(getattr(model, 'optimizer', None)).__name__} is not a tfdpbnn DP optimizer, "
            f"and {overlap} of the records given to {call} are training records of this DP-trained model's "
            "per-record ledger: their gradients would enter the weights without clipping or noise, and no "
            "epsilon printed for these weights (by any DP optimizer compiled later) would hold. Compile a "
            "tfdpbnn DP optimizer to go on training, or train a fresh model (tf.keras.models.clone_model) "
            "as a non-private baseline.")


def _refuse_unsupported_distribution(model) -> None:
    """Keras 3 under a ``tf.distribute`` strategy runs ``steps_per_execution`` 1 only (its loop fails)."""
    strategy = getattr(model, "distribute_strategy", None)
    if (_private_api._keras3 is None or strategy in (None, tf.distribute.get_strategy())
            or _private_api.steps_per_execution(model) <= 1):
        return
    raise ValueError(
        f"steps_per_execution: a DP fit under {type(strategy).__name__} on Keras 3 runs one step per "
        f"execution; got steps_per_execution={_private_api.steps_per_execution(model)}. Compile with "
        "steps_per_execution=1 (supported under MirroredStrategy and MultiWorkerMirroredStrategy), or use "
        "Keras 2 (tf-keras), where steps_per_execution > 1 is supported under a strategy.")


def _dp_fit_arguments(model, optimizer, arguments, record_ids=None):
    """Check and prepare one DP ``fit`` call; returns the arguments to pass on.

    ``record_ids``: the ids of the training records (``fit(..., record_ids=...)``) for the per-record ledger.
    """
    from tfdpbnn.record.store import DataDigests

    _refuse_unsupported_distribution(model)
    optimizer._check_fit_arguments(arguments)
    x = arguments.get("x")
    digests = DataDigests(x, arguments.get("y"))  # the data's one read, on another core during the checks
    # One block of reads from begin_training's phase to fit's start: no step and no restore run in it, and
    # begin_training reads the ledger anew after its checks (which run the model's own code), so its phase
    # and partial-pass reads serve the run record's start too.
    with attributes.ledger_state(optimizer).reading_once():
        from tfdpbnn.optimizers.fit_checks import carries_sample_weights

        weighted = (arguments.get("sample_weight") is not None or arguments.get("class_weight") is not None
                    or carries_sample_weights(x))
        identity = optimizer._begin_training(model, x, arguments.get("y"), arguments.get("batch_size"),
                                             arguments.get("validation_split") or 0.0,
                                             arguments.get("shuffle", True), None, True,
                                             sample_weight=weighted)
        return _prepared_fit_arguments(model, optimizer, arguments, record_ids, identity, digests)


def _sampler(x) -> tuple[str, str] | None:
    """The user-keyed sampler of ``fit``'s input (``SamplingSpec.sampler``), or None."""
    if not isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        return None
    from tfdpbnn.data.sampling import find_spec

    spec = find_spec(x)
    return None if spec is None else spec.sampler


def _prepared_fit_arguments(model, optimizer, arguments, record_ids, identity=None, digests=None):
    """``_dp_fit_arguments`` after ``begin_training``: the plan, the record's start, the callbacks.

    ``identity``: the weights' identity ``begin_training`` computed after its checks (nothing here writes
    the model's variables), for the record's run start; ``digests``: the data's quick digests, started
    before the checks (``tfdpbnn.record.store.DataDigests``).
    """
    from tfdpbnn.callbacks import DPTrainingMonitor, PrivacyCallback

    x = arguments.get("x")
    planned = _planned_steps(model, x, arguments)
    optimizer.warn_if_plan_exceeds_budget(planned)
    from tfdpbnn.record.records import input_keys
    from tfdpbnn.record.store import input_fingerprint

    fingerprint = input_fingerprint(x, arguments.get("y"), digests)
    keys = input_keys(x, arguments.get("y"), record_ids, fingerprint)
    # The phase ``begin_training`` opened (the record's start below may reopen it, of the same kind).
    description = attributes.ledger_state(optimizer).open_description()
    if record_ids is not None and isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        _refuse_ids_not_naming_every_record(x, keys, description)
        _note_ids_without_rows(optimizer)
    elif keys is not None and isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        _refuse_tagged_keys_not_naming_every_record(keys, description)
    if arguments.get("validation_data") is not None:
        _refuse_validation_on_training_records(arguments["validation_data"], keys)
    _refuse_callbacks_acting_on_released_metrics(optimizer, arguments.get("callbacks"))
    # Each epoch iterates the dataset whole: without steps_per_epoch, or with its own (finite) cardinality,
    # where Keras starts a new iteration at every epoch.
    steps_per_epoch = arguments.get("steps_per_epoch")
    whole_passes = (isinstance(x, tf.data.Dataset) and description["kind"] == "shuffle"
                    and (steps_per_epoch is None or steps_per_epoch == _finite_cardinality(x)))
    # The reservation's wait for the disk runs beside the first steps: the monitor (the first callback)
    # joins it at the first batch's end, before any other callback can save what the run trained, and
    # fit joins it before it returns or raises.
    attributes.run_record(optimizer).begin(model, fingerprint, planned, record_keys=keys, identity=identity,
                                           sync_on_worker=True, sampler=_sampler(x),
                                           planned_examples=_planned_examples(x, arguments, planned,
                                                                              description, whole_passes))
    optimizer.note_released_training_metrics()
    if arguments.get("validation_split"):
        optimizer.note_uncovered_release("validation_split")
    if arguments.get("validation_data") is not None:
        optimizer.note_uncovered_release("validation_data")
    callbacks = arguments.get("callbacks")
    if isinstance(callbacks, tf.keras.callbacks.CallbackList):
        callbacks = list(callbacks.callbacks)
    callbacks = list(callbacks or [])
    privacy = [c for c in callbacks if isinstance(c, PrivacyCallback)]
    others = [c for c in callbacks if not isinstance(c, PrivacyCallback | DPTrainingMonitor)]
    _private_api.exact_ema_swaps(others)  # Keras 3's SwapEMAWeights: the weights back bit for bit
    from tfdpbnn.optimizers.state_checks import StateWatch

    # Callbacks other than tfdpbnn's may restore weights or the optimizer in on_train_begin
    # (BackupAndRestore); with none (a subclass counts as another's), the monitor skips the restore check.
    foreign = others + [c for c in privacy if type(c) is not PrivacyCallback]
    if foreign:  # their on_train_begin may change the model before the step is traced
        optimizer._user_code_before_first_trace()
    # Weights saved every so many batches leave in the middle of a pass: snapshots at batch ends know them.
    batch_savers = [c for c in others if isinstance(c, tf.keras.callbacks.ModelCheckpoint
                                                    | tf.keras.callbacks.BackupAndRestore)
                    and isinstance(getattr(c, "save_freq", None), int) and not isinstance(c.save_freq, bool)]
    monitor = DPTrainingMonitor(check_passes=whole_passes, others_may_restore=bool(foreign),
                                batch_savers=batch_savers)
    watch = StateWatch(others_may_write=bool(foreign))  # its end-of-fit check last: after every on_train_end
    arguments["callbacks"] = [monitor, watch] + privacy + others + [watch.end]
    return arguments


def retrace_for(model, optimizer) -> None:
    """Drop ``model``'s traced train function when its step calls another optimizer than ``optimizer``.

    Keras keeps the train function it traced at the first ``fit``; ``model.optimizer = other`` (without a
    new ``compile``) leaves that function calling the optimizer it was traced with, whose steps the new
    optimizer's record would not see. The next ``fit`` or ``train_on_batch`` then traces a new one.
    """
    traced, stepped = attributes.step_optimizer(model)
    if traced and stepped is not optimizer and getattr(model, "train_function", None) is not None:
        model.train_function = None


def _non_private_training_done(model) -> None:
    """After a non-private ``fit`` or ``train_on_batch`` call: a DP-trained ``model``'s record knows it.

    The weights now carry gradients without clipping or noise (of records ``refuse_non_private_training``
    could not compare, a pipeline's): each DP optimizer that trained them finds them written outside its
    DP steps and records them so in the privacy record store (``_dp_note_unguaranteed``), so they give no
    guarantee in this process or another (``load_model(compile=False)``, ``load_weights``).
    """
    for trainer in _dp_trainers(model):
        trainer._dp_note_unguaranteed()


def _dp_trainers(model) -> list:
    """The DP optimizers of ``model`` in this process: its variables' trainers and its ledger's holder.

    The holder (``_hold_ledger_of``) is a loaded model's saved optimizer, or the one a compile replaced. An
    unbuilt model's variables are those it holds so far (``_private_api.weights``).
    """
    trainers = attributes.variable_trainers(_private_api.weights(model))
    link = attributes.ledger_link(model)
    if link is not None and all(link.optimizer is not t for t in trainers):
        trainers.append(link.optimizer)
    return trainers


def _link_replaced_optimizer(model, previous) -> None:
    """Link ``model`` to ``previous``, the DP optimizer a ``compile`` replaced, when nothing links it yet.

    A model loaded with its DP optimizer (``load_model``) holds that optimizer's phases and releases, and no
    link (the link is made at a DP run's start): a ``compile`` with a new optimizer dropped them, and the
    new DP optimizer's statement started from zero where the privacy record store does not know the weights
    (store off: 4.73 printed where 7.08 holds after one more pass). Linked, the next DP run imports them
    (``_adopt_model_ledger``) and a non-DP ``fit`` sees a DP-trained model
    (``refuse_non_private_training``). An optimizer that never released a step is not linked.
    """
    if previous is None or attributes.run_record(previous) is None:  # not a tfdpbnn DP optimizer
        return
    if getattr(model, "optimizer", None) is previous or attributes.ledger_link(model) is not None:
        return
    if not any(phase.released for phase in previous.ledger.phases):
        return
    previous._hold_ledger_of(model)


def _pandas_as_arrays(value):
    """``value`` with every pandas ``DataFrame`` and ``Series`` in it as Keras's ``fit`` reads them (numpy).

    Keras converts them itself (a ``DataFrame`` to its values, a ``Series`` to a column ``[n, 1]``), after
    tfdpbnn's checks, which read arrays and tensors (a ``DataFrame`` has no single ``dtype``): given the
    arrays Keras would make, they check what Keras trains on. Anything else is returned as it is.
    """
    import sys

    import numpy as np

    pandas = sys.modules.get("pandas")  # a pandas object exists only where pandas was imported
    if pandas is None:
        return value

    def convert(item):
        if isinstance(item, pandas.DataFrame):
            return item.to_numpy()
        if isinstance(item, pandas.Series):
            return np.expand_dims(item.to_numpy(), axis=-1)
        return item

    if isinstance(value, pandas.DataFrame | pandas.Series):
        return convert(value)
    if isinstance(value, dict | list | tuple):
        return tf.nest.map_structure(convert, value)
    return value


def installed() -> bool:
    """Whether ``install()`` has run in this process."""
    return bool(getattr(tf.keras.Model.train_step, "_tfdpbnn_hook", False))


def install() -> None:
    """Put the dispatching ``train_step`` and ``fit`` on ``tf.keras.Model`` (idempotent; see the module)."""
    global _original_train_step
    if installed():
        return
    current = tf.keras.Model.train_step
    _original_train_step = current

    @functools.wraps(current)
    def train_step(self, data):
        optimizer = dp_optimizer_of(self)
        if optimizer is not None:
            return optimizer.dp_train_step(self, data)
        attributes.set_step_optimizer(self, None)
        return _original_train_step(self, data)

    train_step._tfdpbnn_hook = True
    tf.keras.Model.train_step = train_step

    global _original_fit
    _original_fit = tf.keras.Model.fit
    signature = inspect.signature(_original_fit)

    @functools.wraps(_original_fit)
    def fit(self, *args, **kwargs):
        optimizer = dp_optimizer_of(self)
        if optimizer is None:
            bound = signature.bind(self, *args, **kwargs)
            refuse_non_private_training(self, bound.arguments.get("x"), bound.arguments.get("y"))
            try:
                return _original_fit(self, *args, **kwargs)
            finally:
                _non_private_training_done(self)
        if optimizer._dp_in_fit:
            raise ValueError(
                f"optimizer: {type(optimizer).__name__} is running another fit (this fit was started while "
                "it ran, e.g. from a callback): the two fits' steps would mix in one ledger phase, counted "
                "against the records of either fit. Start the second fit after the first returns, or give "
                "it its own DP optimizer.")
        record_ids = kwargs.pop("record_ids", None)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        extra = arguments.pop("kwargs", {}) or {}
        for name in ("x", "y", "sample_weight", "validation_data"):
            arguments[name] = _pandas_as_arrays(arguments.get(name))
        from tfdpbnn.record.store import wait_durable

        try:
            arguments = _dp_fit_arguments(self, optimizer, arguments, record_ids)
            retrace_for(self, optimizer)
            _private_api.note_fit_steps_per_execution(self)
            optimizer._dp_in_fit += 1  # steps outside a fit may not count in its phase (_require_open_phase)
            try:
                with _private_api.fit_build_context(self):
                    return _original_fit(self, **arguments, **extra)
            except BaseException:
                # Keras calls no on_train_end on an error: what ran up to it (a crash mid-epoch) is recorded,
                # with the privacy bookkeeping set back first if code other than tfdpbnn's wrote it.
                optimizer._dp_bookkeeping_written("found when fit raised")
                attributes.run_record(optimizer).snapshot(self, final=True)
                raise
            finally:
                optimizer._dp_in_fit -= 1
                attributes.ledger_state(optimizer).guard_disarm()  # between runs: a restore is the start's
        finally:
            wait_durable()  # the run's reservation is on the disk before fit returns or raises

    tf.keras.Model.fit = fit

    global _original_train_on_batch
    _original_train_on_batch = tf.keras.Model.train_on_batch
    batch_signature = inspect.signature(_original_train_on_batch)

    @functools.wraps(_original_train_on_batch)
    def train_on_batch(self, *args, **kwargs):
        optimizer = dp_optimizer_of(self)
        if optimizer is not None:
            record_ids = kwargs.pop("record_ids", None)
            bound = batch_signature.bind(self, *args, **kwargs)
            for name in ("x", "y", "sample_weight"):
                if name in bound.arguments:
                    bound.arguments[name] = _pandas_as_arrays(bound.arguments[name])
            args, kwargs = bound.args[1:], bound.kwargs
            optimizer.begin_batch_call(self, bound.arguments.get("x"), bound.arguments.get("y"),
                                       record_ids=record_ids, sample_weight=any(
                                           bound.arguments.get(k) is not None
                                           for k in ("sample_weight", "class_weight")))
            retrace_for(self, optimizer)
            from tfdpbnn.callbacks import NO_RELEASED_METRICS

            return_dict = bool(bound.arguments.get("return_dict", False))
            if _private_api.train_step_needs_output(self):
                # the step's constant output for a train function that needs one is not a metric: dropped
                arguments = {**bound.arguments, "return_dict": True}
                result = dict(_original_train_on_batch(**arguments))
                result.pop(NO_RELEASED_METRICS, None)
                if not return_dict:
                    result = _private_api.flatten_logs(self, result)
            else:
                result = _original_train_on_batch(self, *args, **kwargs)
            attributes.run_record(optimizer).snapshot(self, final=True)
            if getattr(self, "jit_compile", False) is True:  # XLA dropped the step's failing assertion
                optimizer._dp_write_watch.refuse_written("when train_on_batch returned")
            return result
        bound = batch_signature.bind(self, *args, **kwargs)
        refuse_non_private_training(self, bound.arguments.get("x"), bound.arguments.get("y"),
                                    call="train_on_batch")
        try:
            return _original_train_on_batch(self, *args, **kwargs)
        finally:
            _non_private_training_done(self)

    tf.keras.Model.train_on_batch = train_on_batch

    global _original_compile
    # On the class that defines it (Keras 3's loading compiles a model only when its class's compile is
    # that class's: one set on tf.keras.Model would read as a user's override, and loading would skip it).
    owner = next(c for c in type.mro(tf.keras.Model) if "compile" in vars(c))
    _original_compile = vars(owner)["compile"]

    @functools.wraps(_original_compile)
    def compile(self, *args, **kwargs):
        previous = getattr(self, "optimizer", None)
        result = _original_compile(self, *args, **kwargs)
        _link_replaced_optimizer(self, previous)
        compiled = getattr(self, "optimizer", None)
        if compiled is not previous and attributes.run_record(compiled) is not None:  # a tfdpbnn DP optimizer
            compiled._note_compiled_model(self)
        return result

    owner.compile = compile
