"""One optimizer's link to the privacy record store (``tfdpbnn.record.store``): runs, inheritance, budget.

Before a DP ``fit`` (or a ``train_on_batch`` call) takes its first step, ``RunRecord.begin``:

1. finds the runs whose snapshots hold the model's weights (``weights_fingerprint``), or any one variable of
   them (``variable_fingerprints``: one layer's weights copied by value), and appends their ledger to the
   optimizer's (the record travels with the weights, whatever path carried them: ``set_weights``,
   ``clone_model``, ``load_model(compile=False)``, ``load_weights``, a checkpoint, another process);
2. refuses the run when the data set's budget (``RunStore.set_budget``) would be exceeded by its planned
   phase composed with every earlier run on the same data (``tfdpbnn.record.store.input_fingerprint``);
3. reserves the run's planned phase for its records in the per-record ledger
   (``tfdpbnn.record.record_ledger``: refused when a record would exceed the ledger's per-record budget);
4. writes the run's row (one transaction).

The DP ``fit``'s monitor writes a snapshot at every epoch end and a final one at the end (one transaction
each); the final one also commits to the ledger what the run really spent. Budget scheduling over shared
private data follows Luo et al. (2021).

A custom loop (``begin_training``, then ``dp_train_step`` or ``minimize`` steps) takes steps no one counts
ahead: ``RunRecord.begin(..., loop=True)`` reserves for the records of ``begin_training``'s input a release
of unknown size (infinite epsilon; refused under a per-record budget, as a ``fit`` of unknown steps is) and
registers the loop in this process (``_OPEN_LOOPS``). ``settle_open_loops`` commits what each open loop
spent (its phase as the optimizer counts it: every step one Gaussian on every record, so a cut between
steps is exact) and, while its phase is still open, reserves again for its further steps; it runs before
any run's reservation in the process, when a statement reads the ledger bound (which leaves out the open
loops' reservations for steps not taken yet: none of their steps is uncommitted then), and at interpreter
exit. The loop's phase ends with the optimizer's next run (``begin``): its final commit. A killed process
leaves the infinite reservation (an over-count).
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import weakref

import numpy as np

from tfdpbnn.record import attributes, record_ledger
from tfdpbnn.record import store as record_store
from tfdpbnn.record.ledger import (
    Phase,
    PrivacyLedger,
    derived_phase_id,
    is_written_outside_dp,
    written_outside_dp_phase,
)


def _size(phase: Phase) -> tuple:
    return (phase.steps, phase.participations or 0, phase.examples)


def _lost_part(ran: Phase, restored: Phase | None) -> Phase:
    """The part of phase ``ran`` that a restore to ``restored`` (the same phase, or None) took off."""
    from tfdpbnn.record.ledger_state import describe_source

    steps = ran.steps - (restored.steps if restored is not None else 0)
    examples = max(0, ran.examples - (restored.examples if restored is not None else 0))
    # By phase and steps only: a fit start counts a partial pass as whole (finish_partial_pass), so the
    # store's copy of the same phase may hold fewer examples for the same steps (and the same passes).
    common = dict(steps=steps, examples=examples, sampling=describe_source("rewound"),
                  phase_id=derived_phase_id(f"rewound:{ran.phase_id}:{ran.steps}"))
    if ran.kind != "participations":
        return dataclasses.replace(ran, **common)
    participations = steps
    n = ran.num_examples
    if n and (ran.participations or 0) < ran.steps:  # counted in passes over the data
        before = restored.examples if restored is not None else 0
        passes = math.ceil(ran.examples / n - 1e-9) - math.floor(before / n + 1e-9)
        participations = max(0, min(steps, passes))
    return dataclasses.replace(ran, participations=participations, **common)


#: The custom loops of this process whose reservation is open: ``RunRecord`` -> None (insertion order). A
#: loop's record is held until its phase ends (a later run of its optimizer) or the process exits, where its
#: final segment is committed; one whose optimizer is gone stays held (its commit needs the ledger).
_OPEN_LOOPS: dict = {}


def settle_open_loops() -> set:
    """Commit what each open custom loop of this process on the store in use spent (``settle_loop``).

    Returns the ledger ids of the open loops' reservations that now cover only steps not taken yet (every
    step taken is committed): a statement read now leaves them out of its ledger bound. Loops on another
    store file (``TFDPBNN_PRIVACY_STORE`` changed since) are settled at exit: their ids name that file's rows.
    """
    pending: set = set()
    if not _OPEN_LOOPS:
        return pending
    path = record_store.default_path()
    for record in list(_OPEN_LOOPS):
        if record._loop is None or record._loop["path"] != path:
            continue
        try:
            release = record.settle_loop()
        except ValueError:  # a budget set since the loop began refuses its new reservation: the old one stays
            release = None
        except Exception:  # noqa: BLE001 - its state unreadable (gone): its open reservation over-counts
            _OPEN_LOOPS.pop(record, None)
            release = None
        if release is not None:
            pending.add(release)
    return pending


@atexit.register
def _settle_loops_at_exit() -> None:
    """At interpreter exit: commit each open custom loop's final segment (no reservation left open)."""
    for record in list(_OPEN_LOOPS):
        try:
            record.settle_loop(final=True)
        except Exception:  # noqa: BLE001 - nothing may fail at exit; the open reservation over-counts
            _OPEN_LOOPS.pop(record, None)


class RunRecord:
    """The store side of one optimizer's ledger (module docstring)."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self.store = None
        self.run_id = None
        self.dataset = None
        self.phase_id = None
        self._model = None  # weak reference to the model this optimizer last trained or was shown
        self.reservation = None  # the run's release in the per-record ledger, until committed
        self._loop = None  # a custom loop's keys and steps settled, while it is open (``settle_loop``)
        self.final_weights = None  # the weights' fingerprint in the last final snapshot, until a run begins
        self._begin_variables: set = set()  # the variables' keys at the run's start (``weights_identity``)
        self._final_variables: set = set()  # the variables' keys in the last final snapshot
        self._written_phases: dict = {}  # names written outside the DP step -> their phase (``_written``)
        self._written_recorded: set = set()  # weights recorded as written after a run (``record_written``)
        self._uncovered_runs: dict = {}  # training run id -> the run recording its uncovered weights

    def inherit(self, phases) -> int:
        """Append the store's phases that this ledger lacks; returns how many were added.

        A phase already here (by id) is skipped unless the store's version is larger (the weights' earlier
        run went on after the copy this optimizer restored, e.g. from a checkpoint): that is a rewind
        (``account_rewind``).
        """
        state = attributes.ledger_state(self._optimizer)
        mine = {p.phase_id: p for p in state.closed_phases()}
        current = state.current_phase()
        own_ids = set(mine) | ({current.phase_id} if current is not None else set())
        added = 0
        rewound = {}
        for phase in phases:
            held = current if current is not None and phase.phase_id == current.phase_id else \
                mine.get(phase.phase_id)
            if held is not None:
                if _size(phase) > _size(held):
                    rewound[phase.phase_id] = phase
                continue
            if is_written_outside_dp(phase):  # weights of the record were written outside a DP step: no
                # guarantee (a marker, not DP steps: kept out of the ledger); this optimizer's own is its own
                if phase.phase_id not in {p.phase_id for p in self._written_phases.values()} \
                        and not self._optimizer._dp_continues_uncovered(phase, own_ids):
                    self._optimizer._dp_write_watch.taint([f"{phase.sampling} (in the privacy record store)"])
                continue
            state.append(phase, "record_store")
            added += 1
        if rewound:
            added += self.account_rewind(rewound)
        return added

    def account_rewind(self, before: dict) -> int:
        """Count again the steps a restore took off this ledger; returns how many phases were added.

        ``before`` maps phase ids to phases as they ran (this optimizer's ledger before the restore, or the
        store's record). A restore (``BackupAndRestore`` after a crash, a checkpoint of the optimizer) sets
        the ledger's counters back, but the steps after the restore point ran and their releases happened.
        Each phase that shrank or vanished gets its lost part back as a closed phase ("rewound"): for passes
        over the data, one participation of every example in each pass the lost steps touched
        (``ceil(e0 / n) - floor(e1 / n)`` for examples counted e1 after the restore and e0 before); else
        the lost steps. When the open phase was restored, it is closed where it was restored and the run
        goes on in a new phase, so the resumed passes (a fresh shuffle) are never pooled with a partial pass
        before them. A lost part's id derives from the phase and its size, so a rewind found twice (here
        and in the store) is counted once.
        """
        state = attributes.ledger_state(self._optimizer)
        now = {p.phase_id: p for p in self._optimizer.ledger.phases}
        shrunk = {phase_id for phase_id, old in before.items()
                  if phase_id not in now or _size(now[phase_id]) < _size(old)}
        held = {p.phase_id for p in state.closed_phases()}
        lost = [_lost_part(before[phase_id], now.get(phase_id)) for phase_id in shrunk]
        lost = [p for p in lost if p.steps > 0 and p.phase_id not in held]
        if not lost:
            return 0
        description = state.open_description()
        if description is not None and state.open_phase_id() in shrunk:
            state.close_open_phase()
            state.open_phase(**{k: description[k] for k in (
                "kind", "noise_multiplier", "neighboring", "sample_rate", "num_examples", "source",
                "batch_size")})
            self.phase_id = state.open_phase_id()
        for phase in lost:
            state.append(phase, "rewound")
        return len(lost)

    def ledger_now(self) -> dict:
        """This optimizer's ledger by phase id (what ``account_rewind`` compares after a restore)."""
        return {p.phase_id: p for p in self._optimizer.ledger.phases}

    def begin(self, model, dataset: str | None, planned_steps: int | None, record_keys=None,
              identity=None, sync_on_worker: bool = False, sampler: tuple[str, str] | None = None,
              planned_examples: int | None = None, loop: bool = False) -> None:
        """Inherit the weights' record, check the budgets, reserve in the ledger, write the run (module).

        ``record_keys``: the keys of the run's records (``tfdpbnn.record.records.input_keys``), or None when
        they are unknown (a pipeline without keys). ``identity``: ``(variables, weights' identity, keys)``
        as ``record_store.weights_identity`` gave them for the model's variables as they are now (the
        run's start computed them after its checks); used when ``variables`` are still ``model.weights``.
        ``sync_on_worker``: the transaction's wait for the disk runs on the worker thread, beside the first
        steps (``record_store.transaction``); the caller joins it (``record_store.wait_durable``) before
        anything trained in the run can leave the process. ``sampler``: the input's ``SamplingSpec.sampler``
        (batches drawn from a user's ``secret_seed``), written with the run's ledger reservation, which is
        refused where the records were trained on from the same key by another dataset object
        (``RecordLedger.reserve``). ``planned_examples``: an upper bound of the examples the planned steps
        process, where batches of the optimizer's ``batch_size`` would not bound them (a pipeline's
        batches, counted as they come); else ``planned_steps`` times ``batch_size``.

        ``loop``: a custom loop's start (``begin_training``): its steps are unknown, so its release is
        reserved as unbounded (refused under a per-record budget) and settled as it goes
        (``settle_open_loops``); no run row is written (``dataset`` and ``planned_steps`` are not used).
        """
        with attributes.ledger_state(self._optimizer).reading_once():  # no step, no restore in between
            self._begin(model, dataset, planned_steps, record_keys, identity, sync_on_worker, sampler,
                        planned_examples, loop)

    def _begin(self, model, dataset, planned_steps, record_keys, identity=None, sync_on_worker=False,
               sampler=None, planned_examples=None, loop=False) -> None:
        self._model = weakref.ref(model)
        self.store = record_store.default_store()
        self.run_id = None
        if not loop:  # a custom loop writes no snapshot: the last run's final weights stay what it wrote
            self.final_weights = None
        self.before_restore = None
        _OPEN_LOOPS.pop(self, None)  # this optimizer's custom loop, if any, ends here: its final commit
        self.commit_reservation()  # a run that ended without its final snapshot
        self.reservation = None
        self.unbounded_batches = None
        self._loop = None
        if self.store is None:
            self.before_restore = self.ledger_now()
            return
        # Other custom loops of this process on common records: what they spent is in the ledger first.
        settle_open_loops()
        if not loop:  # a custom loop writes no run row: the statement's data set stays the last fit's
            self.dataset = dataset or "data:unidentified"
        # Outside the write transaction: the weights' identity and the keys of the model's variables (one
        # layer copied by value), in one call; inherit changes the ledger, not the weights.
        if identity is not None and len(identity[0]) == len(model.weights) and all(
                a is b for a, b in zip(identity[0], model.weights, strict=True)):
            weights, variables = identity[1], identity[2]
        else:
            weights, variables = record_store.weights_identity(model)
        self._begin_variables = set(variables)
        # One write transaction (one commit) for the weights' record, the releases linked to it, the data
        # set's budget check, the ledger's reservation and the run's row: two runs started together on the
        # same data or weights are serialized, and share no stale read.
        with record_store.transaction(self.store.path, sync_on_worker=sync_on_worker):
            self._begin_in_transaction(weights, None if loop else dataset, None if loop else planned_steps,
                                       record_keys, variables, legacy=record_store.legacy_lookup(model),
                                       sampler=sampler, planned_examples=planned_examples, loop=loop)

    def _begin_in_transaction(self, weights, dataset, planned_steps, record_keys, variables=(),
                              legacy=None, sampler=None, planned_examples=None, loop=False) -> None:
        optimizer = self._optimizer
        opened: list = []

        def ledger() -> record_ledger.RecordLedger:
            """The per-record ledger in the store's file, opened (its layout checked) once per run start."""
            if not opened:
                opened.append(record_ledger.RecordLedger(self.store.path))
            return opened[0]

        # A variable with a recorded run's values (one layer copied by value) brings that run's phases.
        self.inherit(self.store.weights_record(weights, variables=variables, legacy=legacy))
        optimizer._import_linked_releases(ledger)
        state = attributes.ledger_state(optimizer)
        steps, examples, _ = state.open_counters(squared=False)
        extra = 0 if planned_steps is None else int(planned_steps)
        more = extra * optimizer.batch_size if planned_examples is None else int(planned_examples)
        planned = state.current_phase(steps=steps + extra, examples=examples + more)
        self.phase_id = planned.phase_id
        self._begin_weights = weights
        # The ledger as it stands now (nothing below changes it): the sizes the reservation's commit compares
        # with, and what check_rewind compares a restore with.
        now = self.ledger_now()
        self._sizes_at_begin = {phase_id: _size(p) for phase_id, p in now.items()}
        budget = self.store.budget(self.dataset) if dataset is not None else None
        if budget is not None:
            if planned_steps is None:
                raise ValueError(
                    "steps_per_epoch: the data set has a privacy budget in the record store "
                    f"({self.store.path}), and the number of steps this fit will take is unknown; "
                    "pass steps_per_epoch (or a dataset of known cardinality) so the budget can be "
                    "checked before the first step")
            spent = self.store.dataset_epsilon(self.dataset, budget["delta"], budget["accountant"])
            after = self.store.dataset_epsilon(self.dataset, budget["delta"], budget["accountant"],
                                               extra=planned)
            if after > budget["epsilon"] * (1 + 1e-9):
                self.store = None
                raise ValueError(
                    f"dataset budget: this data set has spent epsilon {spent:.4g} (delta "
                    f"{budget['delta']:g}, {budget['accountant']}) over the runs recorded in "
                    f"{self.store_path}, and the planned {extra} steps would bring it to {after:.4g} > "
                    f"its budget {budget['epsilon']:g}. Nothing was run. Train fewer steps or with more "
                    "noise, or raise the budget with RunStore.set_budget.")
        if record_keys is not None:
            self._reserve(record_keys, planned, planned_steps, ledger(), sampler, loop=loop)
        elif ledger().budget() is not None:
            self.store = None
            raise ValueError(
                "record_ids: the record ledger has a per-record privacy budget, and the records of this "
                "input are unknown (a tf.data pipeline neither made by tfdpbnn.data.poisson_batches nor "
                "tagged with tfdpbnn.record.records.tag_record_keys, a generator, or ragged or sparse rows), "
                "so the budget cannot be checked for them. Nothing was run. Tag the pipeline with its "
                "records' keys, or pass record_ids.")
        if loop:  # no run row: the loop's steps are settled in the per-record ledger as they go
            if self.reservation is not None:
                self._loop = {"keys": record_keys, "settled": planned.steps,
                              "path": record_store.default_path()}
                _OPEN_LOOPS[self] = None
            return
        self.run_id = self.store.begin_run(self.dataset, self._begin_weights, planned)
        self.before_restore = now

    def _reserve(self, keys, planned: Phase, planned_steps: int | None,
                 ledger: record_ledger.RecordLedger, sampler: tuple[str, str] | None = None,
                 loop: bool = False) -> None:
        """Reserve the run's planned phase for its records in the per-record ``ledger`` (one transaction).

        ``sampler``: as ``begin``'s; left out for replayable noise (the release is non-private: nothing
        composed with it understates). ``loop``: a custom loop's (``begin``).
        """
        import dp_accounting

        if loop and ledger.budget() is not None:
            self.store = None
            raise ValueError(
                "begin_training: the record ledger has a per-record privacy budget, and a custom loop's "
                "number of steps is unknown (its code picks them), so the budget cannot be checked before "
                "its first step. Nothing was run. Train with model.fit (with a known number of steps) or "
                "model.train_on_batch (each call reserves its step), or train these records without a "
                "per-record budget.")
        if planned_steps is None and ledger.budget() is not None:
            self.store = None
            raise ValueError(
                "steps_per_epoch: the record ledger has a per-record privacy budget, and the number of steps "
                "this fit will take is unknown; pass steps_per_epoch (or a dataset of known cardinality) so "
                "the budget can be checked before the first step")
        # Steps unknown: reserved as unbounded (infinite epsilon) until the run commits what it spent.
        # Replayable noise (debug_noise_seed) protects nothing: the run is a non-private release.
        event = (planned.event() if planned_steps is not None and not self._replayable()
                 else dp_accounting.NonPrivateDpEvent())
        # The model's DP preprocessing that named no records: written against the records of the first run
        # it feeds; for these records, when they are others, the budget composes it too. One named by ids
        # alone: written against these records where their histories lack it (rows named otherwise).
        found = attributes.preprocessing_found(self._optimizer) or {}
        unnamed = [r for r in found.get("dp", ()) if not r.details.get("ledger_token")]
        by_ids_alone = [r for r in found.get("dp", ()) if r.details.get("ledger_token")
                        and r.details.get("ledger_ids_without_rows")]
        carried = [(r.event(), r.unnamed_token) for r in unnamed]
        try:
            self._write_unnamed_preprocessing(keys, ledger, unnamed)
            self._write_preprocessing_named_by_ids_alone(keys, ledger, by_ids_alone)
            self.reservation = ledger.reserve(
                keys, event, kind="training", neighboring=planned.neighboring, phase_id=planned.phase_id,
                description=f"{type(self._optimizer).__name__}: "
                            f"{'a custom loop, steps unknown' if loop else f'{planned_steps} planned steps'}",
                extra=carried,
                sampler=None if self._replayable() else sampler)
        except ValueError:
            self.store = None
            raise

    @staticmethod
    def _write_unnamed_preprocessing(keys, ledger: record_ledger.RecordLedger, unnamed) -> None:
        """Write DP preprocessing releases that name no records (``unnamed``) against this run's records.

        A layer adapted without ``labels``/``record_ids`` is in no history of the ledger: weights trained on
        its outputs and then taken out of the model (``set_weights`` into one without the layer) left it
        behind (4.73 quoted where the adapt and the pass hold 5.29). Taken to have read the records it first
        feeds in DP training, it is written once against them (an over-count for those it did not read; the
        records it read that no such run trains on are not charged), before
        the run's reservation (a per-record budget sees both), under the token of its state
        (``PreprocessingRecord.unnamed_token``: one per release wherever its layer goes, saved, loaded or
        cloned).
        """
        if not unnamed:
            return
        written = {r.token for r in ledger.backend.releases() if r.kind == "preprocessing"}
        for record in unnamed:
            if record.unnamed_token not in written:
                ledger.record(keys, record.event(), kind="preprocessing", neighboring=record.neighboring,
                              description=f"{record.mechanism} of layer {record.layer!r}: its records "
                                          "unnamed, written against the records of the first DP run it fed",
                              token=record.unnamed_token)
                written.add(record.unnamed_token)

    @staticmethod
    def _write_preprocessing_named_by_ids_alone(keys, ledger: record_ledger.RecordLedger, releases) -> None:
        """Write DP preprocessing releases named by ids without their rows against this run's records.

        ``private_discretization(..., record_ids=ids)`` names its records by ids alone (one column of values
        is no record's content): a run that names the same people by their rows' content, or by other ids,
        meets that release in no history, and a later model trained on those rows without the layer
        composed none of it (7.08 quoted where the release and two passes hold 7.52). The release is
        written, under its own token, against this run's records whose histories lack it (an over-count
        where they are other people; people it read that no run of a model holding it trains on are not
        charged), before the run's reservation: each record holds it once, and a per-record budget sees it.
        """
        for record in releases:
            token = record.ledger_token
            histories = ledger.histories(keys)
            lacking = [h.history_id for h in histories if token not in {r.token for r in h.releases}]
            if not lacking:
                continue
            if len(lacking) < len(histories):  # some records hold it: write on the others only
                held, _ = ledger.backend.keys(lacking)
                lacking_keys = np.intersect1d(np.asarray(keys, np.int64), held)
            else:
                lacking_keys = keys
            ledger.record(lacking_keys, record.event(), kind="preprocessing", neighboring=record.neighboring,
                          description=f"{record.mechanism} of layer {record.layer!r}: its records named by "
                                      "ids without their rows, written against a DP run's records",
                          token=token)

    def settle_loop(self, final: bool = False) -> int | None:
        """Commit what this optimizer's open custom loop spent (``settle_open_loops``); returns a release id.

        While the loop's phase is open (and not ``final``), what it spent is committed and its further steps
        are reserved again as unbounded, in one transaction, under the same phase (a history composes only
        its largest version, so each step counts once): the new reservation's id is returned, which covers
        only steps not taken yet. Nothing is written while no step was taken since the last settle. A phase
        ended (another run of the optimizer, another optimizer took the model) or ``final``: the last commit,
        and the loop is no longer open (None).
        """
        import dp_accounting

        loop, reservation = getattr(self, "_loop", None), self.reservation
        if loop is None or reservation is None or reservation.committed:
            _OPEN_LOOPS.pop(self, None)
            return None
        state = attributes.ledger_state(self._optimizer)
        with state.reading_once():
            phase = state.current_phase() if state.open_phase_id() == reservation.phase_id else None
        if final or phase is None:
            _OPEN_LOOPS.pop(self, None)
            self._loop = None
            self.commit_reservation()
            return None
        if phase.steps == loop["settled"]:
            return reservation.release_id
        ledger = reservation.ledger
        with record_store.transaction(ledger.backend.path):
            self.commit_reservation()
            try:
                self.reservation = ledger.reserve(
                    loop["keys"], dp_accounting.NonPrivateDpEvent(), kind="training",
                    neighboring=phase.neighboring, phase_id=reservation.phase_id,
                    description=f"{type(self._optimizer).__name__}: a custom loop, further steps unknown")
            except ValueError:  # the transaction is rolled back: the open reservation stays
                self.reservation = reservation
                reservation.committed = False
                raise
        loop["settled"] = phase.steps
        return self.reservation.release_id

    def mark_unbounded_batches(self, reason: str) -> None:
        """The run's batches were found not to be the sampler's: a record's share of one is not bounded.

        The run then commits a non-private release for its records (``commit_reservation``), as for
        replayable noise: ``reason`` says what was found (a pass of an asserted pipeline holding more
        examples than records, DP updates beyond the steps of ``fit``).
        """
        self.unbounded_batches = reason

    def _replayable(self) -> bool:
        """Whether the optimizer's noise is replayable from a seed (``debug_noise_seed``): no guarantee."""
        return bool(getattr(self._optimizer.mechanism, "noise_replayable", False))

    def commit_reservation(self, ledger: PrivacyLedger | None = None) -> None:
        """Commit to the ledger what the run spent: the phases it took steps in (a restore may open more).

        ``ledger``: the optimizer's ledger when the caller has just read it.
        """
        import dp_accounting

        from tfdpbnn.record.ledger_state import describe_source

        reservation, self.reservation = self.reservation, None
        if reservation is None or reservation.committed:
            return
        begin = getattr(self, "_sizes_at_begin", {})
        inherited = describe_source("record_store")
        ran = [p for p in (self._optimizer.ledger if ledger is None else ledger).phases
               if p.sampling != inherited
               and (p.phase_id not in begin or _size(p) > begin[p.phase_id])]
        if not ran:
            reservation.commit(dp_accounting.NoOpDpEvent())
        elif self._replayable() or getattr(self, "unbounded_batches", None):
            reservation.commit(dp_accounting.NonPrivateDpEvent(), phase_ids=[p.phase_id for p in ran])
        elif [p.phase_id for p in ran] == [reservation.phase_id]:
            reservation.commit(ran[0].event())
        else:
            reservation.commit(dp_accounting.ComposedDpEvent([p.event() for p in ran]),
                               phase_ids=[p.phase_id for p in ran])

    def ledger_statement(self, delta: float, accountant: str, extra=(),
                         unavailable: str | None = None) -> dict:
        """The statement's ``ledger_bound``: the largest composed epsilon over the model's training records.

        ``extra``: events of the model's other releases (DP preprocessing, private calibration), composed
        with every history; ``unavailable``: why there is no bound (else computed).
        """
        path = record_store.default_path()
        entry = {"epsilon": None, "delta": delta, "accountant": accountant, "records": 0, "store": path,
                 "covers": "every DP release recorded against any record this model was trained on, "
                           "composed per record with this model's other releases (DP preprocessing, private "
                           "calibration); the largest over those records. It holds for any weights derived "
                           "from the recorded runs: checkpoints, new heads, rounded or copied weights"}
        if path is None:
            entry["unavailable"] = f"the privacy record store is off ({record_store.ENV_VAR}=off)"
            return entry
        if unavailable:
            entry["unavailable"] = unavailable
            return entry
        # The custom loops of this process: what they spent is committed, their steps to come left out.
        pending = settle_open_loops()
        if not any(p.released for p in self._optimizer.ledger.phases):
            entry["unavailable"] = "this model has no DP training step yet: it was trained on no record"
            return entry
        ledger = record_ledger.RecordLedger(path)
        bound, records = ledger.bound_for(self._optimizer.ledger.phases, delta, accountant, extra,
                                          exclude=pending)
        if bound is None:
            entry["unavailable"] = (
                "the per-record ledger holds no release of this model's training (its records were unknown: "
                "a tf.data pipeline without record keys, or ragged or sparse inputs; tag the pipeline with "
                "tfdpbnn.record.records.tag_record_keys or pass record_ids)")
            return entry
        entry.update(epsilon=None if math.isinf(bound) else bound, epsilon_is_infinite=math.isinf(bound),
                     records=records)
        return entry

    def check_rewind(self, restore_possible: bool = True) -> int:
        """After the callbacks' ``on_train_begin`` (where ``BackupAndRestore`` restores): count a restore.

        Steps the restore took off this optimizer's ledger are counted again (``account_rewind``), and when
        it changed the weights (a new model and optimizer resuming from an earlier run's backup), their
        record is inherited from the store as ``begin`` does. Returns how many phases were added.
        ``restore_possible=False``: the ``fit`` runs no callback that could have restored anything (only
        tfdpbnn's); nothing is read or compared.
        """
        before, self.before_restore = getattr(self, "before_restore", None), None
        begin_weights, self._begin_weights = getattr(self, "_begin_weights", None), None
        if not restore_possible:
            return 0
        added = 0 if not before else self.account_rewind(before)
        if before is not None:
            # The restore may have set the open pass back to the partial count the run's start finished
            # (Keras 2 resumes an epoch mid-way on a fresh shuffle): this call's steps start a pass anew.
            attributes.ledger_state(self._optimizer).finish_partial_pass()
        model = self.model()
        if self.store is not None and model is not None and begin_weights is not None:
            weights, variables = record_store.weights_identity(model)
            if weights != begin_weights:
                added += self.inherit(self.store.weights_record(
                    weights, exclude_run=self.run_id, variables=variables,
                    legacy=record_store.legacy_lookup(model)))
                self._begin_variables = set(variables)
        return added

    def adopt(self, model) -> None:
        """Remember ``model`` as this optimizer's and inherit its weights' record from the store (``begin``).

        The privacy statement of a model whose weights an earlier run produced (loaded, set, restored) then
        counts that run before this optimizer takes its first step.
        """
        self._model = weakref.ref(model)
        store = record_store.default_store()
        if store is not None:
            weights, variables = record_store.weights_identity(model)
            self.inherit(store.weights_record(weights, variables=variables,
                                              legacy=record_store.legacy_lookup(model)))
            self._optimizer._import_linked_releases()

    def model(self):
        """The model this optimizer last trained or was shown (None if unknown or gone)."""
        return None if self._model is None else self._model()

    def recognises_weights(self) -> bool:
        """Whether the record store holds a snapshot of the model's weights as they are now (any DP run's)."""
        model, store = self.model(), record_store.default_store()
        if model is None or store is None:
            return False
        ledger = store.weights_ledger(record_store.weights_fingerprint(model),
                                      legacy=record_store.legacy_lookup(model))
        # Weights recorded as written outside the DP step (``record_written``) are known, not DP weights.
        return ledger is not None and not any(is_written_outside_dp(p) for p in ledger)

    def weights_and_spent(self, delta: float, epsilon: float) -> tuple[dict, dict]:
        """The statement's ``weights`` (the training behind the weights in hand) and ``spent`` (everything).

        ``spent`` is this optimizer's whole ledger (``epsilon``): the record is append-only, so steps taken
        after the weights in hand (whose releases happened: logs, saved files) stay in it. ``weights`` is the
        ledger the record store holds for the model's current weights (by their fingerprint, as written at the
        epoch end or run end that produced them); when the store does not hold them (or the model is unknown,
        or the store is off), the weights are counted as everything spent (an upper bound).
        """
        optimizer = self._optimizer
        ledger = optimizer.ledger
        spent = {"steps": ledger.steps, "epsilon": epsilon, "phase_ids": [p.phase_id for p in ledger.phases],
                 "note": "every step this model's record holds, including steps after the weights in hand"}
        model = self.model()
        phases = None
        fingerprint = None
        if model is not None:
            fingerprint = record_store.weights_fingerprint(model)
            store = record_store.default_store()
            if store is not None:
                phases = store.weights_ledger(fingerprint, legacy=record_store.legacy_lookup(model))
        written = phases is not None and any(is_written_outside_dp(p) for p in phases)
        if phases is None or written:
            why = ("the model is unknown to this optimizer (no fit yet; pass model= to privacy_statement)"
                   if model is None else "the record store does not hold these weights as a DP run's (they "
                   "were written outside the DP step)" if written else "the record store does not hold these "
                   "weights" if record_store.default_path() is not None else "the record store is off")
            weights = {"fingerprint": fingerprint, "steps": ledger.steps, "epsilon": epsilon,
                       "phase_ids": spent["phase_ids"], "phases": [p.to_config() for p in ledger.phases],
                       "note": f"{why}: the weights in hand are counted as everything spent (an upper bound)"}
            return weights, spent
        behind = PrivacyLedger(phases)
        value = behind.epsilon(delta, optimizer.accountant) if phases else 0.0
        weights = {"fingerprint": fingerprint, "steps": behind.steps, "epsilon": value,
                   "phase_ids": [p.phase_id for p in phases], "phases": [p.to_config() for p in phases],
                   "note": "the training that produced the weights in hand, as the record store holds it"}
        return weights, spent

    @property
    def store_path(self) -> str | None:
        """The store file in use (None when the record is off)."""
        return record_store.default_path()

    def snapshot(self, model, final: bool = False) -> None:
        """Append the run's phase as counted, the model's whole ledger and its weights' fingerprint.

        ``final``: the run ended; what it spent is committed to the per-record ledger.
        """
        if self.store is None or self.run_id is None:
            if final:
                self.commit_reservation()
            return
        weights, keys = record_store.weights_identity(model)
        # The variables the run wrote (their keys differ from the run's start): found by one layer's copy.
        variables = [v for v in keys if v not in self._begin_variables]
        ledger = self._optimizer.ledger
        phase = next((p for p in ledger.phases if p.phase_id == self.phase_id), None)
        written = self._optimizer._dp_write_watch.written()
        if written:  # state written outside the DP step during the run (or inherited): no epsilon holds
            ledger = PrivacyLedger([*ledger.phases, self._written(written)])
        uncovered = self._optimizer._dp_uncovered_weights(self.phase_id)
        # One transaction (one wait for the disk) for the commit to the per-record ledger and the snapshot.
        with record_store.transaction(self.store.path):
            if final:
                self.commit_reservation(ledger)
            self.store.snapshot(self.run_id, weights, phase, ledger, final=final, variables=variables)
            if uncovered is not None:
                self._record_uncovered(weights, ledger, *uncovered)
        if final:
            self.run_id = None
            self.final_weights = weights
            self._final_variables = set(keys)

    def _record_uncovered(self, weights, ledger, phase, variables) -> None:
        """Record ``weights`` and ``variables``' values as covered by no epsilon, ``phase`` ending the ledger.

        Under a run of their own (``RunStore.written_outside_dp``), apart from the training run's snapshot,
        so weights found through another variable of that run (a later sample of the same layers) do not
        inherit ``phase``.
        """
        keys = record_store.variable_keys(variables)
        marked = PrivacyLedger([*ledger.phases, phase])
        run = self._uncovered_runs.get(self.run_id)
        if run is None:
            self._uncovered_runs[self.run_id] = self.store.written_outside_dp(weights, weights, phase, marked,
                                                                              variables=keys)
        else:
            self.store.snapshot(run, weights, phase, marked, final=True, variables=keys)

    def _written(self, names) -> Phase:
        """The phase standing for ``names`` written outside the DP step (one per set of names)."""
        key = tuple(names)
        if key not in self._written_phases:
            self._written_phases[key] = written_outside_dp_phase(names, self._optimizer.neighboring)
        return self._written_phases[key]

    def record_written(self, names) -> None:
        """Record the model's weights as they are now, written outside the DP step after the last run.

        ``names``: the variables written. The weights (and the keys of the variables that differ from the
        last final snapshot's) go to the store under a run of their own whose ledger is this optimizer's
        and a release without noise (``RunStore.written_outside_dp``), so another process that finds them
        (``load_model(compile=False)``, ``set_weights`` into a fresh model) gives no guarantee either.
        Nothing when the store is off, no run ended, or these weights are that run's or recorded already.
        """
        model = self.model()
        if self.store is None or self.final_weights is None or model is None or not names:
            return
        weights, keys = record_store.weights_identity(model)
        if weights == self.final_weights or weights in self._written_recorded:
            return
        phase = self._written(names)
        ledger = PrivacyLedger([*self._optimizer.ledger.phases, phase])
        with record_store.transaction(self.store.path):
            self.store.written_outside_dp(self.final_weights, weights, phase, ledger,
                                          variables=[k for k in keys if k not in self._final_variables])
        self._written_recorded.add(weights)

    def statement(self, delta: float) -> dict:
        """The privacy statement's ``record`` entry: the store, the data set's spending and budget."""
        path = record_store.default_path()
        if path is None:
            return {"store": None, "note": f"no privacy record store ({record_store.ENV_VAR}=off): the data "
                                           "set's spending across runs is not tracked"}
        if self.dataset is None:
            return {"store": path, "note": "no DP fit recorded yet by this optimizer"}
        summary = record_store.RunStore(path).summary(self.dataset, delta, self._optimizer.accountant)
        summary["note"] = ("epsilon of every recorded run on this data set, composed (runs that never ended "
                           "count their planned steps)")
        return summary


__all__ = ["RunRecord"]
