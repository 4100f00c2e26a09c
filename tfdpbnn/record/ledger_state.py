"""A DP optimizer's privacy ledger as state that every save format carries.

The ledger (``tfdpbnn.record.ledger``) is kept in non-trainable optimizer variables, so
``tf.train.Checkpoint`` restores it, and in ``get_config`` (``privacy_ledger``), so every ``model.save``
format and ``from_config`` restore it. It holds:

- the closed phases: a fixed-size float64 table, one row per phase (``MAX_PHASES`` rows);
- the open phase: the step it started at, its description (sigma, q, n, sampling source, ...) and the
  counters the DP step updates in the graph: steps taken, examples processed (sum of realized batch sizes)
  and the sum of squared deviations of the batch sizes from the expected batch size (for the Poisson test).

The open phase's steps are what its own counter holds (only the DP step increments it), or
``optimizer.iterations`` minus the step the phase started at when that is larger (a ledger saved before the
counter existed): setting ``iterations`` back (``optimizer.iterations.assign(0)``) takes no step off the
record, and setting it forward only counts more (an upper bound). A restore of the optimizer's variables
(a checkpoint) sets the counter back with the rest of the ledger: a rewind (``RunRecord.account_rewind``).

The open phase's description is set at the start of every ``fit`` from what that fit really feeds; when it
differs from the open phase's (another optimizer setting, another input, a restored checkpoint built with
other settings), the open phase is closed first. Steps already taken are never re-described.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import tensorflow as tf

from tfdpbnn._private_api import assign_now, read_numpy, read_tensors_and_views
from tfdpbnn.record.ledger import Phase, PrivacyLedger, new_phase_id

#: Phases one optimizer's table holds (a new phase beyond it raises: the record is never truncated).
MAX_PHASES = 64

_KINDS = ("poisson", "participations", "gaussian", "shuffle")
_NEIGHBORING = ("add_or_remove", "replace_one")
_SOURCES = ("poisson_batches", "keras_arrays", "asserted_by_user", "paper_gdp", "failed_poisson_test",
            "fixed_seed", "imported", "custom_loop", "failed_pass_check", "train_on_batch", "record_store",
            "rewound")
_SOURCE_TEXT = {
    "poisson_batches": "Poisson batches drawn by tfdpbnn.data.poisson_batches (secret seed; sizes tested)",
    "keras_arrays": "arrays shuffled and batched by model.fit: passes over the data, counted",
    "asserted_by_user": "sampling asserted by the user (tfdpbnn.data.assert_sampling), not verifiable",
    "paper_gdp": "SI-DPSGD paper mode: exact GDP composition of the released weights",
    "failed_poisson_test": "batches failed the Poisson test: every step accounted without amplification",
    "fixed_seed": "fixed sampling seed (debug_fixed_seed): every step accounted without amplification",
    "imported": "earlier training of this model (another optimizer object)",
    "custom_loop": "custom training loop (optimizer.begin_training, then minimize or dp_train_step): every "
                   "step accounted as one participation of every example, without amplification",
    "failed_pass_check": "a pass over the asserted dataset did not hold num_examples examples: every step "
                         "accounted as one participation, which holds when no batch holds a record twice "
                         "(asserted by the user with the pipeline)",
    "train_on_batch": "model.train_on_batch calls: every step accounted as one participation of every "
                      "example (batches given by the caller)",
    "record_store": "earlier training of these weights, found in the privacy record store by the weights' "
                    "fingerprint",
    "rewound": "steps that ran before a restore rewound the optimizer (a checkpoint, BackupAndRestore after "
               "a crash): counted as they ran, as one participation of every example in each pass they "
               "touched, never pooled with the resumed passes",
}
# Table columns.
_COLUMNS = ("phase_id", "kind", "noise_multiplier", "neighboring", "steps", "sample_rate", "participations",
            "examples", "num_examples", "source")
_COL = {name: i for i, name in enumerate(_COLUMNS)}
# Open-phase description fields.
_DESC = ("phase_id", "kind", "noise_multiplier", "neighboring", "sample_rate", "num_examples", "source",
         "batch_size")
_D = {name: i for i, name in enumerate(_DESC)}


def variable_name(variable) -> str:
    """A bookkeeping variable's own name (``dp_ledger_open_examples``), without scopes or ``:0``."""
    return str(getattr(variable, "name", variable)).split("/")[-1].split(":")[0]


def describe_source(source: str) -> str:
    """The privacy statement's line for a sampling source code."""
    return _SOURCE_TEXT[source]


class LedgerState:
    """The variables of one optimizer's ledger and the Python logic that opens and closes phases.

    Args:
      optimizer: the DP optimizer (its ``add_weight`` creates the variables; ``iterations`` counts steps).
      config: ``get_config()["privacy_ledger"]`` of a saved optimizer, or None.
    """

    def __init__(self, optimizer, config=None):
        self._optimizer = optimizer
        self._memo = None  # variable id -> value read, inside ``reading_once`` (None outside)
        self._kept = None  # the reads a ``reading_once(keep=True)`` block left for a ``resume=True`` one
        self._read_with: list = []  # the optimizer's variables read with the ledger's (``read_with``)
        self.closed_by = None  # why another optimizer closed the open phase (``close_open_phase``), if it did
        config = config or {}
        table = np.zeros([MAX_PHASES, len(_COLUMNS)])
        phases = [Phase(**p) for p in config.get("phases", [])]
        if len(phases) > MAX_PHASES:
            raise ValueError(f"privacy_ledger: {len(phases)} phases exceed the table's {MAX_PHASES}")
        for i, phase in enumerate(phases):
            table[i] = _row(phase, config.get("sources", {}).get(str(phase.phase_id), "imported"))
        open_config = config.get("open") or {}
        desc = np.array([float(open_config.get(k, 0.0)) for k in _DESC]) if open_config \
            else np.zeros(len(_DESC))

        def weight(name, value, shape=(), dtype=tf.float64):
            return optimizer.add_weight(
                name, shape=shape, dtype=dtype, trainable=False,
                initializer=tf.keras.initializers.Constant(value),
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        with tf.init_scope():
            self.table = weight("dp_ledger_phases", table, shape=table.shape)
            self.count = weight("dp_ledger_phase_count", float(len(phases)))
            self.open_desc = weight("dp_ledger_open_phase", desc, shape=desc.shape)
            self.open_start = weight("dp_ledger_open_start_step", float(open_config.get("start_step", 0)))
            self.open_count = weight("dp_ledger_open_steps", float(open_config.get("steps", 0)))
            self.open_examples = weight("dp_ledger_open_examples", float(open_config.get("examples", 0)))
            self.open_squared = weight("dp_ledger_open_squared_deviation",
                                       float(open_config.get("squared_deviation", 0.0)))
        # The guard (``guard_changes``): a copy of each bookkeeping variable that only tfdpbnn writes.
        self._shadows = {}
        self.guard_armed = False
        for variable in (self.table, self.count, self.open_desc, self.open_start, self.open_count,
                         self.open_examples, self.open_squared):
            self.guard_variable(variable)

    # ------------------------------------------------------------------------------------ the guard
    # Keras 3 lists these variables (and the optimizer's count of DP writes) in ``optimizer.variables``,
    # where a callback or a ``train_step`` override can write them during ``fit``: the passes counted set
    # back (4 passes stated as 1), the count of DP writes set back with a weight written from the data
    # (taken for a restore by the write watch), an optimizer checkpoint restored mid-run (the steps it took
    # off forgotten). Each has a copy that only tfdpbnn writes: the DP step adds to both (``shadow_add``),
    # tfdpbnn's own writes copy the variables after them (``guard_sync``), and a ``fit`` compares them at
    # every epoch's start and end and at its end (``DPOptimizerMixin._dp_refuse_bookkeeping_written``).
    # A restore tfdpbnn sees (Keras 3's ``load_weights``, counted as a rewind) is copied too.
    def guard_variable(self, variable) -> None:
        """Guard ``variable`` (a bookkeeping variable of the optimizer) with a copy only tfdpbnn writes."""
        with tf.init_scope():
            shadow = tf.Variable(tf.convert_to_tensor(variable), trainable=False,
                                 name="dp_guard_" + variable_name(variable),
                                 synchronization=tf.VariableSynchronization.ON_READ,
                                 aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._shadows[id(variable)] = (variable, shadow)

    def shadow_add(self, variable, delta) -> None:
        """Inside the DP step: add ``delta`` to ``variable``'s copy (the step adds it to ``variable``)."""
        held = self._shadows.get(id(variable))
        if held is not None:
            held[1].assign_add(tf.cast(delta, held[1].dtype))

    def guard_sync(self, *variables) -> None:
        """Eager: the copies of ``variables`` (default: every guarded one) take the variables' values.

        After tfdpbnn wrote them, or a restore it counted.
        """
        if not tf.executing_eagerly():
            return
        held = list(self._shadows.values()) if not variables else \
            [self._shadows[id(v)] for v in variables if id(v) in self._shadows]
        values = self._read_together()  # one operation
        for variable, shadow in held:
            assign_now(shadow, values[id(variable)])

    def guard_arm(self, sync: bool = True) -> None:
        """Eager: copy the variables (``sync``), then compare them (``guard_changes``) until disarmed.

        ``sync=False``: the copies already hold the variables (compared since and written only by tfdpbnn).
        """
        if sync:
            self.guard_sync()
        self.guard_armed = True

    def guard_disarm(self) -> None:
        """Stop comparing (between runs, a restore of the optimizer is counted by the run's start)."""
        self.guard_armed = False

    def guard_changes(self, always: bool = False) -> list:
        """Eager: names of the guarded variables written since tfdpbnn last wrote them.

        Armed only (during a ``fit``), unless ``always``.
        """
        if not (self.guard_armed or always):
            return []
        values = self._read_together()  # one operation
        return [variable_name(variable) for variable, copy in self._shadows.values()
                if not np.array_equal(values[id(variable)], values[id(copy)])]

    def guarded(self, read):
        """Eager: ``read()`` with the guarded variables as their copies hold them (then as they are again).

        The ledger as the DP steps and tfdpbnn left it, before a write or restore it did not see
        (``DPOptimizerMixin._dp_bookkeeping_written_between_runs`` counts what a restore took off).
        """
        now = [(variable, read_numpy(variable)) for variable, _ in self._shadows.values()]
        self.guard_set_back()
        try:
            return read()
        finally:
            self._forget()
            for variable, value in now:
                variable.assign(value)
            self._forget()

    def guard_set_back(self) -> None:
        """Eager: set the guarded variables back to their copies (what the steps and tfdpbnn wrote)."""
        self._forget()
        for variable, shadow in self._shadows.values():
            variable.assign(read_numpy(shadow))
        self._forget()

    # ------------------------------------------------------------------------------------ graph side
    def record_batch(self, batch_size: tf.Tensor) -> None:
        """Count one step's realized (global) batch size; runs inside the DP train step."""
        b = tf.cast(batch_size, tf.float64)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            b = context.all_reduce(tf.distribute.ReduceOp.SUM, b)
        expected = self.open_desc[_D["batch_size"]]
        one = tf.constant(1.0, tf.float64)
        self.open_count.assign_add(one)
        self.open_examples.assign_add(b)
        self.open_squared.assign_add(tf.square(b - expected))
        self.shadow_add(self.open_count, one)
        self.shadow_add(self.open_examples, b)
        self.shadow_add(self.open_squared, tf.square(b - expected))

    # ----------------------------------------------------------------------------------- python side
    @contextlib.contextmanager
    def reading_once(self, keep: bool = False, resume: bool = False):
        """Within: each variable (the ledger's, the step counter, ``read``'s) is read once; writes forget it.

        For a block that takes no training step and restores nothing (a callback's epoch end, a run's
        start): its queries all see the variables as they were when first read, or as this object wrote them.

        ``keep=True``: the block's reads are kept after it, for a later block with ``resume=True``, which
        starts from them. Only for a caller that knows that nothing but this object can write the variables
        in between (no step, no restore, no code but the record's): any write by this object, and any other
        block (``reading_once()`` without ``resume``), drops them; so does ``drop_kept``. Nested in another
        block, ``keep`` and ``resume`` change nothing (the outer block's reads serve).
        """
        outer = self._memo is not None
        if not outer:
            kept, self._kept = self._kept, None
            self._memo = kept if resume and kept is not None else {}
        try:
            yield self
        finally:
            if not outer:
                self._kept = self._memo if keep else None
                self._memo = None

    def drop_kept(self) -> None:
        """Drop the reads a ``reading_once(keep=True)`` block kept (steps may run before the next block)."""
        self._kept = None

    def read_anew(self) -> None:
        """Inside a ``reading_once`` block: the next reads see the variables anew.

        For a block around code that may write them (a model's own code run by the checks). Outside a
        block, nothing (a ``keep=True`` block's reads stay kept).
        """
        if self._memo is not None:
            self._forget()

    def read(self, variable):
        """``variable``'s value (numpy), read once inside a ``reading_once`` block.

        Any variable of the optimizer that no step and no restore can change within a block but through this
        object's writes: the ledger's, the step counter, the DP settings (noise multiplier, batch size).
        """
        return self._read(variable)

    def read_with(self, variables) -> None:
        """Variables of the optimizer that ``read`` serves with the ledger's: its DP settings.

        Inside a block, the first read of any of the ledger's variables, the step counter or these reads
        them all by one operation (``_private_api.read_tensors_and_views``): about a dozen eager reads per
        ``fit`` become a few, and after ``tf.keras.utils.set_random_seed`` (which clears TensorFlow's
        kernels) one kernel is made anew instead of one per shape and dtype.
        """
        self._read_with = list(variables)

    def _together(self) -> list:
        """The variables read together, in a fixed order (one operation of one signature: one kernel).

        The ledger's, the step counter, ``read_with``'s, the other guarded ones and the guard's copies.
        """
        own = [self.table, self.count, self.open_desc, self.open_start, self.open_count, self.open_examples,
               self.open_squared]
        mine = {id(v) for v in own}
        guarded = [v for v, _ in self._shadows.values() if id(v) not in mine]
        return [*own, self._optimizer.iterations, *self._read_with, *guarded,
                *(copy for _, copy in self._shadows.values())]

    def _read_together(self) -> dict:
        """A fresh read of ``_together``'s variables: ``{id(variable): numpy copy}``.

        A scalar as a numpy scalar, as ``read_numpy`` gives it.
        """
        together = self._together()
        return {id(v): view[()] if np.ndim(view) == 0 else np.array(view, copy=True)
                for v, (_, view) in zip(together, read_tensors_and_views(together), strict=True)}

    def _read(self, variable):
        memo = self._memo
        if memo is None:
            return read_numpy(variable)
        key = id(variable)
        if key not in memo:
            if not any(v is variable for v in self._together()):
                memo[key] = read_numpy(variable)
            else:
                for held, value in self._read_together().items():
                    memo.setdefault(held, value)
        return memo[key]

    def _forget(self) -> None:
        """Called before and after every write: the next reads see the variables anew."""
        if self._memo:
            self._memo.clear()
        self._kept = None

    def _desc(self) -> dict:
        values = self._read(self.open_desc).tolist()  # one read of the variable
        return dict(zip(_DESC, values, strict=True))

    @property
    def has_open_phase(self) -> bool:
        """Whether a phase is open (a fit described it)."""
        return self._desc()["phase_id"] != 0

    def open_phase_id(self) -> int:
        """The open phase's identifier (0 when none is open)."""
        return int(self._desc()["phase_id"])

    def open_steps(self, desc: dict | None = None) -> int:
        """Steps taken in the open phase (``desc``: ``_desc()`` when already read; module docstring)."""
        if (self._desc() if desc is None else desc)["phase_id"] == 0:
            return 0
        counted = int(round(float(self._read(self.open_count))))
        start = int(round(float(self._read(self.open_start))))
        by_iterations = int(self._read(self._optimizer.iterations)) - start
        return max(counted, by_iterations)

    def open_counters(self, desc: dict | None = None, squared: bool = True) -> tuple[int, float, float]:
        """(steps, examples, squared deviation) of the open phase (``squared=False``: 0.0 in its place)."""
        return (self.open_steps(desc), float(self._read(self.open_examples)),
                float(self._read(self.open_squared)) if squared else 0.0)

    def open_description(self, desc: dict | None = None) -> dict | None:
        """The open phase's description (decoded), or None (``desc``: ``_desc()`` when already read)."""
        d = self._desc() if desc is None else desc
        if d["phase_id"] == 0:
            return None
        return {"kind": _KINDS[int(d["kind"])], "noise_multiplier": d["noise_multiplier"],
                "neighboring": _NEIGHBORING[int(d["neighboring"])],
                "sample_rate": d["sample_rate"] or None, "num_examples": int(d["num_examples"]),
                "source": _SOURCES[int(d["source"])], "batch_size": d["batch_size"]}

    def changed_noise(self, sigma: float) -> float | None:
        """The open phase's noise multiplier where ``sigma`` (the optimizer's now) is another, else None.

        None too with no phase open. Equal within 1e-12 relative (a float64 variable read back).
        """
        description = self.open_description()
        if description is None:
            return None
        phase = description["noise_multiplier"]
        return None if abs(sigma - phase) <= 1e-12 * max(1.0, abs(sigma)) else phase

    def open_phase(self, kind, noise_multiplier, neighboring, sample_rate, num_examples, source,
                   batch_size) -> None:
        """Start a phase described so (closing the open one when its description differs)."""
        wanted = {"kind": kind, "noise_multiplier": float(noise_multiplier), "neighboring": neighboring,
                  "sample_rate": None if sample_rate is None else float(sample_rate),
                  "num_examples": int(num_examples), "source": source, "batch_size": float(batch_size)}
        current = self.open_description()
        if current is not None and _same(current, wanted):
            return
        if current is not None:  # with none open, the writes below set every variable closing would
            self.close_open_phase()
        desc = np.zeros(len(_DESC))
        desc[_D["phase_id"]] = float(new_phase_id())
        desc[_D["kind"]] = _KINDS.index(kind)
        desc[_D["noise_multiplier"]] = float(noise_multiplier)
        desc[_D["neighboring"]] = _NEIGHBORING.index(neighboring)
        desc[_D["sample_rate"]] = 0.0 if sample_rate is None else float(sample_rate)
        desc[_D["num_examples"]] = int(num_examples)
        desc[_D["source"]] = _SOURCES.index(source)
        desc[_D["batch_size"]] = float(batch_size)
        start = float(self._read(self._optimizer.iterations))
        self._forget()
        self.open_desc.assign(desc)
        self.open_start.assign(start)
        self.open_count.assign(0.0)
        self.open_examples.assign(0.0)
        self.open_squared.assign(0.0)
        self._forget()
        self.guard_sync(self.open_desc, self.open_start, self.open_count, self.open_examples,
                        self.open_squared)
        self.closed_by = None

    def finish_partial_pass(self) -> None:
        """Count the open shuffle phase's partial pass as a whole one (its next steps start a new pass).

        ``fit`` calls it at every start: each call draws its own shuffled passes, so examples of a pass an
        earlier call left partial (``steps_per_epoch`` below a pass, one-step fits in a loop) may be drawn
        again, and the two calls' partial passes must not be pooled into one pass that never happened.
        """
        d = self.open_description()
        if d is None or d["kind"] != "shuffle" or not d["num_examples"]:
            return
        n = d["num_examples"]
        examples = float(self._read(self.open_examples))
        whole = _participations(examples, n) * n
        if whole > examples:
            self._forget()
            self.open_examples.assign(float(whole))
            self._forget()
            self.guard_sync(self.open_examples)

    def extend_open_phase(self, steps: int, examples: float) -> None:
        """Count ``steps`` and ``examples`` more in the open phase.

        They are steps an earlier copy of this phase took, found in the privacy record store.
        """
        self._forget()
        if steps > 0:
            self.open_start.assign_sub(float(steps))
            self.open_count.assign_add(float(steps))
        if examples > 0:
            self.open_examples.assign_add(float(examples))
        self._forget()
        self.guard_sync(self.open_start, self.open_count, self.open_examples)

    def current_phase(self, override_source=None, steps=None, examples=None) -> Phase | None:
        """The open phase as a ``Phase`` (optionally with hypothetical ``steps``/``examples``)."""
        raw = self._desc()  # each variable is read once
        d = self.open_description(raw)
        if d is None:
            return None
        if steps is None:
            steps = self.open_steps(raw)
        examples = float(self._read(self.open_examples)) if examples is None else float(examples)
        source = override_source or d["source"]
        phase = _phase_from(d, int(steps), examples, source, int(raw["phase_id"]),
                            getattr(self._optimizer, "_dp_phase_override", lambda _d, _s: None))
        # The open phase is this optimizer's: its noise is replayable when its mechanism's is.
        if getattr(getattr(self._optimizer, "mechanism", None), "noise_replayable", False):
            phase = dataclasses.replace(phase, noise_replayable=True)
        return phase

    def close_open_phase(self, source=None, closed_by: str | None = None) -> None:
        """Move the open phase (if it took a step) into the table; no phase is open afterwards.

        ``closed_by``: what closed it when it is not this optimizer's own doing (another DP optimizer took
        the model's ledger), kept in ``closed_by`` for the refusal of this optimizer's next step.
        """
        if closed_by is not None and self.has_open_phase:
            self.closed_by = closed_by
        phase = self.current_phase(override_source=source)
        if phase is not None and phase.steps > 0:
            self.append(phase, source or self.open_description()["source"])
        self._forget()
        self.open_desc.assign(np.zeros(len(_DESC)))
        self.open_examples.assign(0.0)
        self.open_squared.assign(0.0)
        self._forget()
        self.guard_sync(self.open_desc, self.open_examples, self.open_squared)

    def append(self, phase: Phase, source: str) -> None:
        """Add a closed phase (phases already in the table, by id, are skipped)."""
        if any(p.phase_id == phase.phase_id for p in self.closed_phases()):
            return
        count = int(round(float(self._read(self.count))))
        if count >= MAX_PHASES:
            raise ValueError(
                f"privacy ledger: this optimizer already holds {MAX_PHASES} training phases; start a new "
                "optimizer (the model's ledger carries over) rather than losing the record")
        table = read_numpy(self.table)  # a copy of its own: changed below
        table[count] = _row(phase, source)
        self._forget()
        self.table.assign(table)
        self.count.assign(float(count + 1))
        self._forget()
        self.guard_sync(self.table, self.count)

    def closed_phases(self) -> list[Phase]:
        """The closed phases, oldest first (decoded once per ``reading_once`` block, as its reads are)."""
        memo = self._memo
        if memo is not None and "closed_phases" in memo:  # from this block's reads; a write empties it
            return list(memo["closed_phases"])
        count = int(round(float(self._read(self.count))))
        phases = [_phase_from_row(row) for row in self._read(self.table)[:count].tolist()] if count else []
        if memo is not None:
            memo["closed_phases"] = tuple(phases)  # Phase is frozen: the callers get their own list
        return phases

    def closed_sources(self) -> list[str]:
        """The sampling source code of each closed phase."""
        count = int(round(float(self._read(self.count))))
        return [_SOURCES[int(row[_COL["source"]])] for row in self._read(self.table)[:count]]

    def ledger(self, steps=None, examples=None) -> PrivacyLedger:
        """Closed phases plus the open one (with hypothetical ``steps``/``examples`` if given)."""
        ledger = PrivacyLedger(self.closed_phases())
        phase = self.current_phase(steps=steps, examples=examples)
        if phase is not None:
            ledger.add(phase)
        return ledger

    def to_config(self) -> dict:
        """JSON-safe ledger for ``get_config``."""
        config = {"phases": [p.to_config() for p in self.closed_phases()],
                  "sources": {str(p.phase_id): s for p, s in zip(self.closed_phases(), self.closed_sources(),
                                                                 strict=True)}}
        if self.has_open_phase:
            steps, examples, squared = self.open_counters()
            desc = self._desc()
            config["open"] = {**{k: desc[k] for k in _DESC}, "start_step": int(self._read(self.open_start)),
                              "steps": steps,
                              "examples": examples, "squared_deviation": squared}
        return config


def _same(a: dict, b: dict) -> bool:
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, float) or isinstance(y, float):
            if x is None or y is None:
                if x is not y:
                    return False
            elif not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif x != y:
            return False
    return True


def _participations(examples: float, num_examples: int) -> int:
    return int(math.ceil(examples / num_examples - 1e-9)) if examples > 0 else 0


def planned_phase(description: dict, steps: int, examples: float, override) -> Phase:
    """The phase ``steps`` steps over ``examples`` examples of a fit described by ``description`` would be.

    ``description``: as ``LedgerState.open_description`` decodes one (its ``source`` included); ``override``:
    the optimizer's ``_dp_phase_override``. For planning (the phase gets a new id; nothing is written).
    """
    return _phase_from(description, steps, examples, description["source"], new_phase_id(), override)


def _phase_from(d: dict, steps: int, examples: float, source: str, phase_id: int, override) -> Phase:
    special = override(d, steps)
    if special is not None:   # the phase's own id: the per-record ledger holds its release under it
        return dataclasses.replace(special, phase_id=phase_id)
    common = dict(noise_multiplier=d["noise_multiplier"], neighboring=d["neighboring"], steps=steps,
                  examples=int(round(examples)), num_examples=d["num_examples"],
                  sampling=describe_source(source), phase_id=phase_id)
    if d["kind"] == "poisson" and source not in ("failed_poisson_test", "fixed_seed", "custom_loop"):
        return Phase(kind="poisson", sample_rate=d["sample_rate"], **common)
    if d["kind"] == "shuffle" and source not in ("failed_pass_check", "custom_loop"):
        return Phase(kind="participations", participations=_participations(examples, d["num_examples"]),
                     **common)
    return Phase(kind="participations", participations=steps, **common)


def _row(phase: Phase, source: str) -> np.ndarray:
    row = np.zeros(len(_COLUMNS))
    row[_COL["phase_id"]] = float(phase.phase_id)
    row[_COL["kind"]] = _KINDS.index(phase.kind)
    # A phase of replayable noise keeps its sigma with a minus sign (no layout change: a sigma is >= 0).
    sigma = phase.noise_multiplier
    row[_COL["noise_multiplier"]] = -sigma if phase.noise_replayable else sigma
    row[_COL["neighboring"]] = _NEIGHBORING.index(phase.neighboring)
    row[_COL["steps"]] = phase.steps
    row[_COL["sample_rate"]] = phase.sample_rate or 0.0
    row[_COL["participations"]] = -1 if phase.participations is None else phase.participations
    row[_COL["examples"]] = phase.examples
    row[_COL["num_examples"]] = phase.num_examples or 0
    row[_COL["source"]] = _SOURCES.index(source)
    return row


def _phase_from_row(row) -> Phase:
    kind = _KINDS[int(row[_COL["kind"]])]
    participations = int(row[_COL["participations"]])
    source = _SOURCES[int(row[_COL["source"]])]
    sigma = float(row[_COL["noise_multiplier"]])
    return Phase(kind=kind, noise_multiplier=abs(sigma), noise_replayable=sigma < 0,
                 neighboring=_NEIGHBORING[int(row[_COL["neighboring"]])], steps=int(row[_COL["steps"]]),
                 sample_rate=float(row[_COL["sample_rate"]]) if kind == "poisson" else None,
                 participations=participations if participations >= 0 else None,
                 examples=int(row[_COL["examples"]]), num_examples=int(row[_COL["num_examples"]]) or None,
                 sampling=describe_source(source), phase_id=int(row[_COL["phase_id"]]))


__all__ = ["MAX_PHASES", "LedgerState", "describe_source", "planned_phase"]
