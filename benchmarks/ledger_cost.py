"""What the per-record privacy ledger and the privacy record cost: a run over a million records, each ``fit``.

Run: ``python benchmarks/ledger_cost.py [--records 1000000] [--fits 15] [--models small,mlp] [--loop 500]
[--eager 5] [--frozen 5]``
(a few minutes on 2 cores). Prints the command, the machine and its load average, markdown tables for
docs/benchmarks.md (every time as wall time and as this process's CPU time: other load on a shared machine
inflates the first), and each target with its verdict:

1. hashing ``--records`` records (10 float32 features and an integer label, which is not part of a key)
   into canonical record keys (``tfdpbnn.record.records.content_keys``), reported apart;
2. reserving a training release for them and committing what it spent (``RecordLedger.reserve`` +
   ``Reservation.commit``) in a fresh SQLite ledger file: on new records; on the same records again as
   another process sees them (their rows read); and on the same records again in the process that placed
   them last (their rows not read); then, in another fresh file, on new records named by ``record_ids``
   with their rows (written on the twin keys of their content too, which is checked against records named
   by content), and on as many new records named by content (checked against those named by ids) (target:
   under 2 s);
3. one-epoch ``fit`` calls on arrays, medians of ``--fits`` interleaved calls: a DP ``fit`` with the
   privacy record (store and ledger), the same with the record off (``TFDPBNN_PRIVACY_STORE=off``, on a
   second model of the same shape and start), and a non-private ``fit`` (legacy SGD) of the same model,
   with their ratios; models "small" (1,437 records,
   64-32-10, batch 64) and "mlp" (6,000 records, 784-1000-10, batch 600);
4. where the DP ``fit``'s time around its steps goes: every phase of the record's work timed (the input
   and model checks, fingerprints, record keys, the store's transactions, each tfdpbnn callback, the
   per-example check at each trace of the DP step), and their sum per ``fit`` (target: under 10 ms); the
   same sum in the first ``fit`` of a new model (weights the record has not seen, a new optimizer; of the
   warm-up's architecture, whose per-example check passed, ``tfdpbnn.optimizers.known_structure``; and,
   apart, of an architecture the process has not checked).
   The same arrays are fed to every ``fit``, so after the first the data fingerprint is a quick digest
   (XXH3-128) of the data checked against that of the bytes hashed last (``tfdpbnn.record.store``), and the
   reservation finds the records where this process placed them.
   Also the SQL statements (and commits) one DP ``fit`` runs on the record's file, and, for what that check
   costs (its memory reads slow the work after it too), the whole work of DP fits interleaved with these
   whose data's bytes are not read (``_data_not_compared``: a measurement, not a mode of the library);
5. ``--loop`` one-step fits of the small model in a loop, each a run of the same phase over the same
   records: the record's whole work per fit at the loop's start and at its end (target: under 10 ms at the
   end: a run's start must not read more with every earlier run), with no budget, with a per-record budget
   and with a data-set budget (whose checks compose every earlier release or run);
6. ``--eager`` one-epoch fits of the small model that run eagerly (``run_eagerly=True``): the per-example
   checks at their steps (each step after a run's first is checked), for a known structure and for a model
   whose check runs in full (an identity ``Lambda`` added), beside an eager non-private fit;
7. ``--frozen`` one-epoch fits of a frozen 784-2000-2000 body under a trainable head (transfer learning):
   the comparison of the frozen weights before every batch (a read of each variable: a fresh read in the
   buffer held since the snapshot needs no byte comparison), the record's whole work, DP / non-private.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
import time

import dp_accounting
import numpy as np


class _Clock:
    """Wall time and this process's CPU time of a block.

    Other load on the machine does not inflate the CPU time; the difference is waiting (for the disk, or for
    other processes holding the cores).
    """

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def _run_over(records: int) -> tuple[list[str], list[float], list[float]]:
    """Rows for the million-record run; the reserve + commit times (wall, CPU) of each of its cases."""
    from tfdpbnn.record import record_ledger
    from tfdpbnn.record import records as record_ids

    rng = np.random.default_rng(0)
    x = rng.normal(size=(records, 10)).astype(np.float32)
    y = rng.integers(0, 10, records)
    with _Clock() as hashing:
        keys = record_ids.content_keys(x, y)
    ledger = record_ledger.RecordLedger(os.path.join(tempfile.mkdtemp(), "ledger.sqlite"))
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.001, dp_accounting.GaussianDpEvent(1.0)), 10000)
    rows = [f"| hash {records:,} records (10 float32 features; the label is not part of a key) | "
            f"{hashing.wall:.3f} s | {hashing.cpu:.3f} s |"]
    walls, cpus = [], []

    def timed(ledger, keys, phase_id, label):
        with _Clock() as reserved:
            reservation = ledger.reserve(keys, event, phase_id=phase_id)
        with _Clock() as committed:
            reservation.commit(event)
        walls.append(reserved.wall + committed.wall)
        cpus.append(reserved.cpu + committed.cpu)
        rows.append(f"| reserve + commit, {records:,} records, {label} | {reserved.wall:.3f} s + "
                    f"{committed.wall:.4f} s = {walls[-1]:.3f} s | {cpus[-1]:.3f} s |")

    cases = ("new records", "the same records again, as another process sees them (their rows read)",
             "the same records again, placed last by this process (their rows not read)")
    for phase_id, label in enumerate(cases, start=1):
        if phase_id == 2:
            record_ledger._PLACED.clear()  # what a process that did not place these records knows
        timed(ledger, keys, phase_id, label)
    # Records named by ids with their rows are written on their content's twin keys too, their content
    # checked against the records named by content (in a ledger of their own); then as many new records by
    # content are checked against those.
    named = record_ids.record_keys(x, y, record_ids=np.arange(records))
    ledger = record_ledger.RecordLedger(os.path.join(tempfile.mkdtemp(), "ledger.sqlite"))
    timed(ledger, named, len(cases) + 1,
          "new records named by record_ids with their rows (their content's twin keys written, naming "
          "checked)")
    timed(ledger, record_ids.content_keys(x + np.float32(1.0), y), len(cases) + 2,
          "new records by content, in a ledger holding as many named by ids (checked against them)")
    return rows, walls, cpus


#: The record's work around the steps of a DP ``fit``, timed per phase: (owner, method, label).
_PHASES = (
    ("tfdpbnn.optimizers.base:DPOptimizerMixin", "_begin_training",
     "input and model checks, noise key, phase"),
    ("tfdpbnn.record.store:", "input_fingerprint",
     "data fingerprint (SHA-256, or its quick digest checked against the bytes hashed last)"),
    ("tfdpbnn.record.records:", "input_keys", "record keys (content hash, reused for the same bytes)"),
    ("tfdpbnn.record.run_record:RunRecord", "begin",
     "store: weights' record, budgets, reservation, run row"),
    ("tfdpbnn.callbacks:DPTrainingMonitor", "on_train_begin", "monitor: train begin"),
    ("tfdpbnn.callbacks:DPTrainingMonitor", "on_epoch_begin", "monitor: epoch begin (restore check)"),
    ("tfdpbnn.callbacks:DPTrainingMonitor", "on_train_batch_end", "monitor: batch ends (all)"),
    ("tfdpbnn.callbacks:DPTrainingMonitor", "on_epoch_end", "monitor: epoch end (snapshot, epsilon)"),
    ("tfdpbnn.callbacks:DPTrainingMonitor", "on_train_end", "monitor: train end (final snapshot, commit)"),
    ("tfdpbnn.optimizers.state_checks:StateWatch", "on_train_begin", "state watch: train begin"),
    ("tfdpbnn.optimizers.state_checks:_StateWatchEnd", "on_train_begin",
     "state watch: snapshot after every callback's train begin"),
    ("tfdpbnn.optimizers.state_checks:_StateWatchEnd", "on_train_batch_begin",
     "state watch: comparisons before every batch (all)"),
    ("tfdpbnn.optimizers.state_checks:StateWatch", "on_train_batch_end", "state watch: batch ends (all)"),
    ("tfdpbnn.optimizers.state_checks:StateWatch", "on_epoch_end", "state watch: epoch end check"),
    ("tfdpbnn.optimizers.state_checks:_StateWatchEnd", "on_train_end",
     "state watch: end-of-fit check (after every callback)"),
    ("tfdpbnn.optimizers.base:DPOptimizerMixin", "_check_traced_step",
     "the per-example check at each trace of the step (a first fit's; none in a fit that traces nothing)"),
    ("tfdpbnn.optimizers.keras_integration:", "_dp_fit_arguments", "all of fit's preparation (the rows above "
                                                                    "to the run row, and the rest)"),
)
#: The phases whose sum is the record's whole work per fit (preparation, every tfdpbnn callback, and the
#: per-example check at each trace of the DP step, inside Keras's first call of its train function).
_TOTAL = ("_dp_fit_arguments", "on_train_begin", "on_epoch_begin", "on_train_batch_end", "on_epoch_end",
          "on_train_end", "on_train_batch_begin", "_check_traced_step")


#: label -> [wall, CPU] seconds spent in that phase since the last ``clear()``.
_SPENT: dict = {}


def _install_phase_timers() -> None:
    """Wrap every ``_PHASES`` method so that its wall and CPU time are added to ``_SPENT[label]``."""
    import functools
    import importlib

    for target, name, label in _PHASES:
        module, _, cls = target.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        original = getattr(owner, name)

        def timed(*args, _original=original, _label=label, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return _original(*args, **kwargs)
            finally:
                entry = _SPENT.setdefault(_label, [0.0, 0.0])
                entry[0] += time.perf_counter() - wall
                entry[1] += time.process_time() - cpu

        setattr(owner, name, functools.wraps(original)(timed))


_MODELS = {  # name: (records, features, hidden units, batch size)
    "small": (1437, 64, 32, 64),
    "mlp": (6000, 784, 1000, 600),
}


#: The phase labels whose sum is the record's whole work per fit.
_TOTAL_LABELS = [text for _, method, text in _PHASES if method in _TOTAL]


def _whole_work(spent: dict) -> tuple[float, float]:
    """(wall, CPU) seconds of the record's whole work in one fit, from its ``_SPENT`` entries."""
    return (sum(spent.get(k, (0.0, 0.0))[0] for k in _TOTAL_LABELS),
            sum(spent.get(k, (0.0, 0.0))[1] for k in _TOTAL_LABELS))


def _median_ms(pairs) -> list[float]:
    """[wall, CPU] medians in ms of (wall, CPU) second pairs."""
    pairs = list(pairs)
    return [statistics.median(t[i] for t in pairs) * 1e3 for i in (0, 1)]


def _data(which: str) -> tuple[np.ndarray, np.ndarray]:
    """The training arrays of model ``which``: uniform float32 features, integer labels of 10 classes."""
    n, features, _, _ = _MODELS[which]
    rng = np.random.default_rng(0)
    return rng.uniform(size=(n, features)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def _compiled(which: str, optimizer, seed: bool = True):
    """Model ``which`` (features-hidden-10), compiled with ``optimizer`` and a per-example loss.

    ``seed``: after a new global seed, as a script that seeds before each model (TensorFlow then
    instantiates traced functions again).
    """
    import tensorflow as tf

    _, features, hidden, _ = _MODELS[which]
    if seed:
        tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((features,)),
                                 tf.keras.layers.Dense(hidden, activation="relu"), tf.keras.layers.Dense(10)])
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _dp_optimizer(which: str):
    """DP-SGD for model ``which`` (sigma 1, clip 1, its batch size; the budget may be exceeded)."""
    import tfdpbnn

    n, _, _, batch = _MODELS[which]
    return tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=n, batch_size=batch, delta=1e-5,
                                  allow_exceeding_budget=True)


def _fit_costs(fits: int, which: str) -> tuple[list[str], list[str], dict]:
    """One-epoch fits: DP with the record, DP with the record off, non-private; and the record's phases.

    Returns the rows, the phase rows and a summary: the record's whole work per fit and the DP /
    non-private ratios (wall, CPU).
    """
    import tensorflow as tf

    n, _, _, batch = _MODELS[which]
    x, y = _data(which)

    def compiled(optimizer, seed=True):
        return _compiled(which, optimizer, seed)

    def dp_optimizer():
        return _dp_optimizer(which)

    # The record-off fits train a model of their own: weights changed with the record off are weights the
    # record has not seen, and the next recorded fit of them would pay a first fit's keys.
    dp, dp_off = compiled(dp_optimizer()), compiled(dp_optimizer())
    plain = compiled(tf.keras.optimizers.legacy.SGD(0.1))

    def fit(model):
        _SPENT.clear()
        with _Clock() as clock:
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        return clock.wall, clock.cpu, {k: tuple(v) for k, v in _SPENT.items()}

    path = os.path.join(tempfile.mkdtemp(), "record.sqlite")
    os.environ["TFDPBNN_PRIVACY_STORE"] = path
    for _ in range(3):  # warm up: traced train steps, store and ledger files created, models checked
        fit(dp), fit(dp_off), fit(plain)
    names = ("DP, record on", "DP, record off", "non-private")
    times: dict[str, list] = {name: [] for name in names}
    ablated = []  # the record's phases in a DP fit whose data's bytes are not read (_data_not_compared)
    for _ in range(fits):
        times["DP, record on"].append(fit(dp))
        with _data_not_compared():
            ablated.append(fit(dp)[2])
        os.environ["TFDPBNN_PRIVACY_STORE"] = "off"
        try:
            times["DP, record off"].append(fit(dp_off))
        finally:
            os.environ["TFDPBNN_PRIVACY_STORE"] = path
        times["non-private"].append(fit(plain))
    # The first fit of a new model (new weights, new optimizer): the record's work at a run's start on weights
    # it has not seen (their per-variable keys, the model's first checks); its traced steps are not timed.
    # Built after a new global seed, as above, and without one (a script that seeds once). Keras's own first
    # fit of a new non-private model, beyond a later fit's time (tracing its train step), for scale.
    # Models of the warm-up's structure, whose per-example check passed (tfdpbnn.optimizers.known_structure);
    # and, for what that check costs, models whose structure the process is made to forget (the check run).
    first = [fit(compiled(dp_optimizer()))[2] for _ in range(min(fits, 5))]
    first_unseeded = [fit(compiled(dp_optimizer(), seed=False))[2] for _ in range(min(fits, 5))]
    first_checked = []
    for _ in range(min(fits, 5)):
        with _structures_forgotten():
            first_checked.append(fit(compiled(dp_optimizer()))[2])
    keras_first = [fit(compiled(tf.keras.optimizers.legacy.SGD(0.1), seed=False))[:2]
                   for _ in range(min(fits, 5))]
    label = {"small": f"{n:,} records, 64-32-10", "mlp": f"{n:,} records, 784-1000-10 MLP"}[which]
    steps = -(-n // batch)
    rows = []
    from tfdpbnn.record import store as record_store

    statements: list[str] = []
    connection = record_store.kept_connection(path, 60.0)
    connection.set_trace_callback(statements.append)
    try:
        fit(dp)
    finally:
        connection.set_trace_callback(None)
    rows.append(f"| SQL statements in one DP fit ({label}), record on | {len(statements)}, "
                f"{statements.count('COMMIT')} commits | |")
    for name in names:
        wall = statistics.median(t[0] for t in times[name]) * 1e3
        cpu = statistics.median(t[1] for t in times[name]) * 1e3
        rows.append(f"| one-epoch fit ({label}, {steps} steps), {name} | {wall:.1f} ms | {cpu:.1f} ms |")
    summary = {"label": label}
    for name in names[:2]:
        ratio = [statistics.median(t[i] for t in times[name]) / statistics.median(
            t[i] for t in times["non-private"]) for i in (0, 1)]
        summary[name] = ratio
        rows.append(f"| {name} / non-private ({label}) | {ratio[0]:.2f}x | {ratio[1]:.2f}x |")
    phases = []
    with_record = [t[2] for t in times["DP, record on"]]
    for _, _method, text in _PHASES:
        wall = statistics.median(p.get(text, (0.0, 0.0))[0] for p in with_record) * 1e3
        cpu = statistics.median(p.get(text, (0.0, 0.0))[1] for p in with_record) * 1e3
        phases.append(f"| {label} | {text} | {wall:.2f} ms | {cpu:.2f} ms |")
    summary["work"] = _median_ms(_whole_work(p) for p in with_record)
    phases.append(f"| {label} | **the record's whole work per fit** (preparation + every tfdpbnn callback "
                  "+ the checks at the step's traces), "
                  f"median of {fits} | **{summary['work'][0]:.2f} ms** | **{summary['work'][1]:.2f} ms** |")
    summary["ablated"] = _median_ms(_whole_work(p) for p in ablated)
    phases.append(f"| {label} | for what the data check costs, not a mode of the library: the same "
                  f"with the data's bytes not read (the digest held taken as is), median of {fits} | "
                  f"{summary['ablated'][0]:.2f} ms | {summary['ablated'][1]:.2f} ms |")
    summary["first"] = _median_ms(_whole_work(p) for p in first)
    for runs, kind in ((first, "first fit of a new model"), (first_unseeded, "the same without a new seed")):
        for _, _method, text in _PHASES:  # where a first fit's work goes (phases over 1 ms)
            wall = statistics.median(p.get(text, (0.0, 0.0))[0] for p in runs) * 1e3
            cpu = statistics.median(p.get(text, (0.0, 0.0))[1] for p in runs) * 1e3
            if cpu >= 1.0:
                phases.append(f"| {label}, {kind} | {text} | {wall:.2f} ms | {cpu:.2f} ms |")
    phases.append(f"| {label} | the record's whole work in the first fit of a new model (new weights and "
                  f"optimizer), median of {len(first)} | {summary['first'][0]:.2f} ms | "
                  f"{summary['first'][1]:.2f} ms |")
    summary["first_unseeded"] = _median_ms(_whole_work(p) for p in first_unseeded)
    phases.append(f"| {label} | the same, the model built without a new global seed, median of "
                  f"{len(first_unseeded)} | {summary['first_unseeded'][0]:.2f} ms | "
                  f"{summary['first_unseeded'][1]:.2f} ms |")
    summary["first_checked"] = _median_ms(_whole_work(p) for p in first_checked)
    phases.append(f"| {label} | the same as the first, the structure not checked before in the process (the "
                  f"per-example check run on the model), median of {len(first_checked)} | "
                  f"{summary['first_checked'][0]:.2f} ms | {summary['first_checked'][1]:.2f} ms |")
    later = [statistics.median(t[i] for t in times["non-private"]) for i in (0, 1)]
    summary["keras_first"] = [(statistics.median(t[i] for t in keras_first) - later[i]) * 1e3 for i in (0, 1)]
    phases.append(f"| {label} | for scale, not the record's: Keras's own first fit of a new non-private "
                  f"model beyond a later fit's time, median of {len(keras_first)} | "
                  f"{summary['keras_first'][0]:.1f} ms | {summary['keras_first'][1]:.1f} ms |")
    return rows, phases, summary


@contextlib.contextmanager
def _structures_forgotten():
    """Within the block, no model structure has passed its per-example check in this process.

    A measurement only: the first ``fit`` of a model then runs the check on it (as for a structure the process
    has not seen, or a model not known from its structure), and what was kept before is back afterwards.
    """
    from tfdpbnn.optimizers import known_structure

    kept = set(known_structure._PASSED)
    known_structure._PASSED.clear()
    try:
        yield
    finally:
        known_structure._PASSED.clear()
        known_structure._PASSED.update(kept)


@contextlib.contextmanager
def _data_not_compared():
    """Within the block, the data fingerprint is the digest held for the arrays, their bytes not read.

    A measurement only (the library checks the data's quick digest against that of the bytes hashed last at
    every ``fit``): the whole work per fit without it shows what the check costs, including what its memory
    reads (the data's bytes) slow down in the work after it. Valid only because the benchmark feeds the same,
    unchanged arrays to every fit.
    """
    from tfdpbnn.record import store as record_store

    original, started = record_store._held_digest, record_store.DataDigests

    def held(kind, arrays, quick=None):
        entry = record_store._HELD.get(kind)
        return entry[1] if entry is not None else original(kind, arrays, quick)

    class NotStarted:  # no digest computed ahead
        def __init__(self, *args):
            pass

        def of(self, arrays):
            return None

    record_store._held_digest, record_store.DataDigests = held, NotStarted
    try:
        yield
    finally:
        record_store._held_digest, record_store.DataDigests = original, started


def _loop_costs(loop: int) -> tuple[list[str], list[dict]]:
    """The record's whole work per fit at the start and the end of ``loop`` one-step fits of one model.

    ``steps_per_epoch=1`` fits in a loop, in a store of its own; medians of 20 fits at each end. Three
    loops: no budget; a per-record budget (``RecordLedger.set_budget``: each run start composes every
    release on its records); a data-set budget (``RunStore.set_budget``: each run start composes every run
    on the data set).
    """
    from tfdpbnn.record import record_ledger
    from tfdpbnn.record import store as record_store

    n, _, _, batch = _MODELS["small"]
    x, y = _data("small")
    rows, summaries = [], []
    for budget in ("no budget", "a per-record budget", "a data-set budget"):
        path = os.path.join(tempfile.mkdtemp(), "record.sqlite")
        os.environ["TFDPBNN_PRIVACY_STORE"] = path
        if budget == "a per-record budget":
            record_ledger.RecordLedger(path).set_budget(1e9, 1e-5)  # never reached; checked at every fit
        elif budget == "a data-set budget":
            record_store.RunStore(path).set_budget(record_store.data_fingerprint(x, y), 1e9, 1e-5)
        model = _compiled("small", _dp_optimizer("small"))
        work = []
        for _ in range(loop + 3):  # 3 to warm up
            _SPENT.clear()
            model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=1, verbose=0)
            work.append(_whole_work(_SPENT))
        work = work[3:]
        window = min(20, loop)
        start, end = _median_ms(work[:window]), _median_ms(work[-window:])
        label = f"{n:,} records, 64-32-10, one-step fits in a loop, {budget}"
        rows += [f"| {label} | the record's whole work per fit, fits 1-{window} | {start[0]:.2f} ms | "
                 f"{start[1]:.2f} ms |",
                 f"| {label} | the same, fits {loop - window + 1}-{loop} | {end[0]:.2f} ms | "
                 f"{end[1]:.2f} ms |"]
        summaries.append({"label": label, "start": start, "end": end, "loop": loop})
    return rows, summaries


def _eager_costs(fits: int) -> list[str]:
    """One-epoch fits of the small model that run eagerly (``run_eagerly=True``): the checks at its steps.

    A step that runs eagerly runs the model's Python code as it is then, so each one after a run's first is
    checked (``DPOptimizerMixin._check_traced_step``). Medians of ``fits`` interleaved fits: the DP ``fit``'s
    checks at its steps and its whole time, for a known structure (each check is the structure's key) and
    for the same model with an identity ``Lambda`` (the full check at every step); and an eager non-private
    ``fit`` of the first, for scale.
    """
    import tensorflow as tf

    n, features, hidden, batch = _MODELS["small"]
    x, y = _data("small")
    steps = -(-n // batch)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def eager(optimizer, own_layer=False):
        layers = [tf.keras.Input((features,)), tf.keras.layers.Dense(hidden, activation="relu")]
        if own_layer:  # a Lambda: not a known structure, so the check runs at each step
            layers.append(tf.keras.layers.Lambda(lambda t: t))
        model = tf.keras.Sequential([*layers, tf.keras.layers.Dense(10)])
        model.compile(optimizer=optimizer, loss=loss, run_eagerly=True)
        return model

    models = {"known": eager(_dp_optimizer("small")), "a Lambda": eager(_dp_optimizer("small"), True),
              "non-private": eager(tf.keras.optimizers.legacy.SGD(0.1))}
    spent: dict = {name: [] for name in models}
    whole: dict = {name: [] for name in models}
    label = next(text for _, method, text in _PHASES if method == "_check_traced_step")

    def fit(model):
        _SPENT.clear()
        with _Clock() as clock:
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        return clock.wall, _SPENT.get(label, (0.0, 0.0))[0]

    for _ in range(2):  # warm up
        for model in models.values():
            fit(model)
    for _ in range(fits):
        for name, model in models.items():
            wall, checks = fit(model)
            whole[name].append(wall)
            spent[name].append(checks)
    ms = {k: statistics.median(v) * 1e3 for k, v in whole.items()}
    checks = {k: statistics.median(v) * 1e3 for k, v in spent.items()}
    where = f"{n:,} records, 64-32-10, run_eagerly, {steps} steps"
    return [f"| {where} | the checks at the steps of a DP fit, known structure, median of {fits} | "
            f"{checks['known']:.1f} ms | {ms['known']:.0f} ms for the whole fit |",
            f"| {where} | the same, an identity Lambda after the hidden layer (a full check at each step) | "
            f"{checks['a Lambda']:.1f} ms | {ms['a Lambda']:.0f} ms for the whole fit |",
            f"| {where} | for scale: the same model's eager non-private fit | | {ms['non-private']:.0f} ms |"]


def _frozen_costs(fits: int) -> list[str]:
    """One-epoch fits of a frozen 784-2000-2000 body under a trainable 10-way head (transfer learning).

    The body's 5.6M weights are state no DP step may change: ``StateWatch`` compares them before every
    batch (``_StateWatchEnd.on_train_batch_begin``). Medians of ``fits`` interleaved fits: that comparison
    per fit, the record's whole work per fit, and the DP and non-private fits' times.
    """
    import tensorflow as tf

    n, batch = _MODELS["mlp"][0], 250
    x, y = _data("mlp")
    steps = -(-n // batch)

    def frozen(optimizer):
        tf.keras.utils.set_random_seed(2)
        body = tf.keras.Sequential([tf.keras.Input((x.shape[1],)),
                                    tf.keras.layers.Dense(2000, activation="relu"),
                                    tf.keras.layers.Dense(2000, activation="relu")])
        body.trainable = False
        model = tf.keras.Sequential([body, tf.keras.layers.Dense(10)])
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    import tfdpbnn

    dp = frozen(tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=n, batch_size=batch,
                                       delta=1e-5, allow_exceeding_budget=True))
    plain = frozen(tf.keras.optimizers.legacy.SGD(0.1))
    label = next(text for _, method, text in _PHASES if method == "on_train_batch_begin")
    compared, work, whole = [], [], {"DP": [], "non-private": []}

    def fit(model):
        _SPENT.clear()
        with _Clock() as clock:
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        return clock.wall, dict(_SPENT)

    for _ in range(2):  # warm up
        fit(dp), fit(plain)
    for _ in range(fits):
        wall, spent = fit(dp)
        whole["DP"].append(wall)
        compared.append(spent.get(label, (0.0, 0.0))[0])
        work.append(_whole_work(spent)[0])
        whole["non-private"].append(fit(plain)[0])
    ms = {k: statistics.median(v) * 1e3 for k, v in whole.items()}
    where = f"{n:,} records, frozen 784-2000-2000 body + Dense(10) head, {steps} steps of {batch}"
    return [f"| {where} | the comparisons of the frozen body before every batch, median of {fits} | "
            f"{statistics.median(compared) * 1e3:.2f} ms | |",
            f"| {where} | the record's whole work per fit | {statistics.median(work) * 1e3:.2f} ms | |",
            f"| {where} | the DP fit / the non-private fit | {ms['DP']:.0f} ms / {ms['non-private']:.0f} "
            f"ms | {ms['DP'] / ms['non-private']:.2f}x |"]


def main(argv=None) -> None:
    """Print the measured rows (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fits", type=int, default=15)
    parser.add_argument("--models", default="small,mlp",
                        help=f"comma-separated, of {sorted(_MODELS)} (empty: no fits)")
    parser.add_argument("--loop", type=int, default=500,
                        help="one-step fits of the small model in a loop (0: none)")
    parser.add_argument("--eager", type=int, default=5,
                        help="one-epoch fits of the small model run eagerly, for each case (0: none)")
    parser.add_argument("--frozen", type=int, default=5,
                        help="one-epoch fits of a frozen body under a trainable head, each kind (0: none)")
    args = parser.parse_args(argv)
    if args.records < 1 or args.fits < 1:
        parser.error("--records and --fits must be >= 1")
    if args.loop < 0:
        parser.error(f"--loop must be >= 0, got {args.loop}")
    if args.eager < 0:
        parser.error(f"--eager must be >= 0, got {args.eager}")
    if args.frozen < 0:
        parser.error(f"--frozen must be >= 0, got {args.frozen}")
    models = [m for m in args.models.split(",") if m]
    if any(m not in _MODELS for m in models):
        parser.error(f"--models: each of {sorted(_MODELS)}, got {args.models!r}")
    load = os.getloadavg()
    start = time.perf_counter()
    if models or args.loop or args.eager or args.frozen:
        _install_phase_timers()
    rows, walls, cpus = _run_over(args.records)
    phases: list[str] = []
    summaries = []
    for model in models:
        more, parts, summary = _fit_costs(args.fits, model)
        rows += more
        phases += parts
        summaries.append(summary)
    loops: list[dict] = []
    if args.loop:
        parts, loops = _loop_costs(args.loop)
        phases += parts
    eager = _eager_costs(args.eager) if args.eager else []
    frozen = _frozen_costs(args.frozen) if args.frozen else []
    end_load = os.getloadavg()[0]
    models_arg = ",".join(models) or "''"
    print(f"Command: python benchmarks/ledger_cost.py --records {args.records} --fits {args.fits} --models "
          f"{models_arg} --loop {args.loop} --eager {args.eager} --frozen {args.frozen}")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"TensorFlow {_tf_version()}; load average (1, 5, 15 minutes) {load[0]:.2f}, {load[1]:.2f}, "
          f"{load[2]:.2f} at the start, {end_load:.2f} at the end; wall time "
          f"{time.perf_counter() - start:.0f} s.")
    if max(load[0], end_load) > 0.5 * (os.cpu_count() or 1):
        print("The machine was loaded: wall times include waiting for the cores and the disk; the CPU "
              "times (this process's, every thread) are the numbers to compare, inflated less by contention.")
    print("\n| what | wall time | CPU time |\n| --- | ---: | ---: |")
    for row in rows:
        print(row)
    if phases:
        print("\n| fit | phase | wall time | CPU time |\n| --- | --- | ---: | ---: |")
        for row in phases:
            print(row)
    if eager:
        print("\n| run | what | the checks | the fit |\n| --- | --- | ---: | ---: |")
        for row in eager:
            print(row)
    if frozen:
        print("\n| run | what | wall time | ratio |\n| --- | --- | ---: | ---: |")
        for row in frozen:
            print(row)
    print("\nAgainst the targets:")
    cases = ("new records", "the same records, rows read", "the same records, rows not read",
             "new records named by ids, naming checked", "new records by content, naming checked")
    for label, wall, cpu in zip(cases, walls, cpus, strict=True):
        print(f"- reserve + commit of {args.records:,} records ({label}) under 2 s: "
              f"{_verdict(wall, cpu, 2.0)} ({wall:.2f} s wall, {cpu:.2f} s CPU)")
    for summary in summaries:
        wall, cpu = summary["work"]
        print(f"- the record's work per fit ({summary['label']}) under 10 ms: {_verdict(wall, cpu, 10.0)} "
              f"({wall:.2f} ms wall, {cpu:.2f} ms CPU)")
        wall, cpu = summary["first"]
        print(f"- the record's work in a new model's first fit ({summary['label']}) under 10 ms: "
              f"{_verdict(wall, cpu, 10.0)} ({wall:.2f} ms wall, {cpu:.2f} ms CPU; "
              f"{summary['first_unseeded'][0]:.2f} ms wall without a new global seed; "
              f"{summary['first_checked'][0]:.2f} ms wall for a structure not checked before; Keras's own "
              f"first fit takes {summary['keras_first'][0]:.0f} ms more than a later one)")
        on, off = summary["DP, record on"], summary["DP, record off"]
        print(f"- one-epoch DP fit / non-private fit ({summary['label']}): {on[0]:.2f}x wall, "
              f"{on[1]:.2f}x CPU with the record; {off[0]:.2f}x wall, {off[1]:.2f}x CPU with it off")


    for loop in loops:
        wall, cpu = loop["end"]
        print(f"- the record's work per fit after {loop['loop']} earlier fits ({loop['label']}) under 10 ms: "
              f"{_verdict(wall, cpu, 10.0)} ({wall:.2f} ms wall, {cpu:.2f} ms CPU; {loop['start'][0]:.2f} ms "
              "wall at the loop's start)")


def _verdict(wall: float, cpu: float, limit: float) -> str:
    if wall < limit:
        return "met"
    return "met in CPU time, not in wall time" if cpu < limit else "not met"


def _tf_version() -> str:
    import tensorflow as tf

    return tf.__version__

if __name__ == "__main__":
    main()
