"""One optimizer's link to the privacy record store (``tfdpbnn.privacy.store``): runs, inheritance, budget.

Before a DP ``fit`` (or a ``train_on_batch`` call) takes its first step, ``RunRecord.begin``:

1. finds the runs whose snapshots hold the model's weights (``weights_fingerprint``) and appends their ledger
   to the optimizer's (the record travels with the weights, whatever path carried them: ``set_weights``,
   ``clone_model``, ``load_model(compile=False)``, ``load_weights``, a checkpoint, another process);
2. refuses the run when the data set's budget (``RunStore.set_budget``) would be exceeded by its planned
   phase composed with every earlier run on the same data (``tfdpbnn.privacy.store.input_fingerprint``);
3. writes the run's row (one transaction).

The DP ``fit``'s monitor writes a snapshot at every epoch end and a final one at the end (one transaction
each). Budget scheduling over shared private data follows Luo et al. (2021).
"""

from __future__ import annotations

import dataclasses
import weakref

from tfdpbnn.privacy import store as record_store
from tfdpbnn.privacy.ledger import Phase, PrivacyLedger, new_phase_id


def _size(phase: Phase) -> tuple:
    return (phase.steps, phase.participations or 0, phase.examples)


class RunRecord:
    """The store side of one optimizer's ledger (module docstring)."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self.store = None
        self.run_id = None
        self.dataset = None
        self.phase_id = None
        self._model = None  # weak reference to the model this optimizer last trained or was shown

    def inherit(self, phases) -> int:
        """Append the store's phases that this ledger lacks; returns how many were added.

        A phase already here (by id) is skipped unless the store's version is larger (the weights' earlier
        run went on after the copy this optimizer restored, e.g. from a checkpoint): the open phase then
        takes the store's step and example counts (it is the same phase going on); a closed one is added
        again under a new id, which counts its first steps twice (an upper bound).
        """
        state = self._optimizer._dp_ledger
        mine = {p.phase_id: p for p in state.closed_phases()}
        current = state.current_phase()
        added = 0
        for phase in phases:
            if current is not None and phase.phase_id == current.phase_id:
                if _size(phase) > _size(current):
                    state.extend_open_phase(phase.steps - current.steps, phase.examples - current.examples)
                continue
            held = mine.get(phase.phase_id)
            if held is not None:
                if _size(phase) <= _size(held):
                    continue
                phase = dataclasses.replace(phase, phase_id=new_phase_id())
            state.append(phase, "record_store")
            added += 1
        return added

    def begin(self, model, dataset: str | None, planned_steps: int | None) -> None:
        """Inherit the weights' record, check the data set's budget, write the run (see the module)."""
        optimizer = self._optimizer
        self._model = weakref.ref(model)
        self.store = record_store.default_store()
        self.run_id = None
        if self.store is None:
            return
        self.dataset = dataset or "data:unidentified"
        self.inherit(self.store.weights_record(record_store.weights_fingerprint(model)))
        state = optimizer._dp_ledger
        steps, examples, _ = state.open_counters()
        extra = 0 if planned_steps is None else int(planned_steps)
        planned = state.current_phase(steps=steps + extra, examples=examples + extra * optimizer.batch_size)
        self.phase_id = planned.phase_id
        budget = self.store.budget(self.dataset) if dataset is not None else None
        if budget is not None:
            if planned_steps is None:
                raise ValueError(
                    "steps_per_epoch: the data set has a privacy budget in the record store "
                    f"({self.store.path}), and the number of steps this fit will take is unknown; pass "
                    "steps_per_epoch (or a dataset of known cardinality) so the budget can be checked before "
                    "the first step")
            spent = self.store.dataset_epsilon(self.dataset, budget["delta"], budget["accountant"])
            after = self.store.dataset_epsilon(self.dataset, budget["delta"], budget["accountant"],
                                               extra=planned)
            if after > budget["epsilon"] * (1 + 1e-9):
                self.store = None
                raise ValueError(
                    f"dataset budget: this data set has spent epsilon {spent:.4g} (delta "
                    f"{budget['delta']:g}, {budget['accountant']}) over the runs recorded in "
                    f"{self.store_path}, and the planned {extra} steps would bring it to {after:.4g} > its "
                    f"budget {budget['epsilon']:g}. Nothing was run. Train fewer steps or with more noise, "
                    "or raise the budget with RunStore.set_budget.")
        self.run_id = self.store.begin_run(self.dataset, record_store.weights_fingerprint(model), planned)

    def adopt(self, model) -> None:
        """Remember ``model`` as this optimizer's and inherit its weights' record from the store (``begin``).

        The privacy statement of a model whose weights an earlier run produced (loaded, set, restored) then
        counts that run before this optimizer takes its first step.
        """
        self._model = weakref.ref(model)
        store = record_store.default_store()
        if store is not None:
            self.inherit(store.weights_record(record_store.weights_fingerprint(model)))

    def model(self):
        """The model this optimizer last trained or was shown (None if unknown or gone)."""
        return None if self._model is None else self._model()

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
                phases = store.weights_ledger(fingerprint)
        if phases is None:
            why = ("the model is unknown to this optimizer (no fit yet; pass model= to privacy_statement)"
                   if model is None else "the record store does not hold these weights"
                   if record_store.default_path() is not None else "the record store is off")
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
        """Append the run's phase as counted, the model's whole ledger and its weights' fingerprint."""
        if self.store is None or self.run_id is None:
            return
        ledger = self._optimizer.ledger
        phase = next((p for p in ledger.phases if p.phase_id == self.phase_id), None)
        self.store.snapshot(self.run_id, record_store.weights_fingerprint(model), phase, ledger, final=final)
        if final:
            self.run_id = None

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
