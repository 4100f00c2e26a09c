"""What the per-record privacy ledger costs: a run over a million records, and each ``fit`` call.

Run: ``python benchmarks/ledger_cost.py [--records 1000000] [--fits 15]`` (about a minute on 2 cores).
Prints markdown rows for docs/benchmarks.md:

1. hashing ``--records`` records (10 float32 features and an integer label) into canonical record keys
   (``tfdpbnn.record.records.content_keys``), reported apart;
2. reserving a training release for them and committing what it spent (``RecordLedger.reserve`` +
   ``Reservation.commit``), on new records and again on the same records (a second run), in a fresh
   SQLite ledger file (target: under 2 s);
3. a small DP ``fit`` (64 examples, 4 features, one pass of 8 steps) with the ledger and without it (the
   records' keys withheld, so nothing is reserved or committed), median of ``--fits`` interleaved calls
   (target: the ledger adds under 10 ms per ``fit``); and with the whole privacy record off
   (``TFDPBNN_PRIVACY_STORE=off``), for reference.
"""

from __future__ import annotations

import argparse
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


def _run_over(records: int) -> list[str]:
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
    rows = [f"| hash {records:,} records (10 float32 features + label) | {hashing.wall:.3f} s | "
            f"{hashing.cpu:.3f} s |"]
    for phase_id, label in enumerate(("new records", "the same records again"), start=1):
        with _Clock() as reserved:
            reservation = ledger.reserve(keys, event, phase_id=phase_id)
        with _Clock() as committed:
            reservation.commit(event)
        rows.append(f"| reserve + commit, {records:,} records, {label} | {reserved.wall:.3f} s + "
                    f"{committed.wall:.4f} s = {reserved.wall + committed.wall:.3f} s | "
                    f"{reserved.cpu + committed.cpu:.3f} s |")
    return rows


def _fit_costs(fits: int) -> list[str]:
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.record import records as record_ids

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, 64)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, delta=1e-5,
                                       allow_exceeding_budget=True)
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    original = record_ids.input_keys

    def fit():
        with _Clock() as clock:
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        return clock.wall, clock.cpu

    os.environ["TFDPBNN_PRIVACY_STORE"] = os.path.join(tempfile.mkdtemp(), "record.sqlite")
    for _ in range(3):
        fit()  # warm up: traced train step, store and ledger files created
    times: dict[str, list[tuple]] = {"with the ledger": [], "without the ledger": [], "record off": []}
    for _ in range(fits):
        times["with the ledger"].append(fit())
        record_ids.input_keys = lambda *args, **kwargs: None  # no keys: nothing reserved or committed
        try:
            times["without the ledger"].append(fit())
        finally:
            record_ids.input_keys = original
        path = os.environ["TFDPBNN_PRIVACY_STORE"]
        os.environ["TFDPBNN_PRIVACY_STORE"] = "off"
        try:
            times["record off"].append(fit())
        finally:
            os.environ["TFDPBNN_PRIVACY_STORE"] = path
    wall = {k: statistics.median(t[0] for t in v) * 1000 for k, v in times.items()}
    cpu = {k: statistics.median(t[1] for t in v) * 1000 for k, v in times.items()}
    rows = [f"| small DP fit (8 steps), {k}, median of {fits} | {wall[k]:.1f} ms | {cpu[k]:.1f} ms |"
            for k in times]
    added = {k: v["with the ledger"] - v["without the ledger"] for k, v in (("wall", wall), ("cpu", cpu))}
    rows.append(f"| the ledger's added cost per fit | {added['wall']:.1f} ms | {added['cpu']:.1f} ms |")
    return rows


def main(argv=None) -> None:
    """Print the measured rows (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--fits", type=int, default=15)
    args = parser.parse_args(argv)
    if args.records < 1 or args.fits < 1:
        parser.error("--records and --fits must be >= 1")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    rows = _run_over(args.records) + _fit_costs(args.fits)
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"1-minute load average at the start {load:.2f}; wall time {time.perf_counter() - start:.0f} s")
    print("| what | wall time | CPU time |\n| --- | ---: | ---: |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
