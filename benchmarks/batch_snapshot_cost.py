"""What the record's batch-end snapshots cost, in a ``fit`` with a batch-frequency weight saver.

Run: ``.venv/bin/python benchmarks/batch_snapshot_cost.py`` (about a minute). A ``fit`` whose callbacks save
the weights every so many batches (``ModelCheckpoint`` or ``BackupAndRestore`` with an integer
``save_freq``) snapshots the weights at each batch end where one of them will save (read from the saver's
own counters), so that weights saved in the middle of a pass are known to the privacy record wherever they
are loaded. For the 64-32-10 and 784-1000-10 models, one-epoch DP fits, alternating, median of ``--rounds``
(the first dropped):

- with a ``ModelCheckpoint(save_freq=10**9)`` (it never saves: the per-batch reading of its counters)
  against the same fit with another callback: the extra time per batch;
- with a ``ModelCheckpoint(save_freq=2)`` writing an h5 file every other batch: the time of each
  snapshot the record takes (every call timed), against the saver's own time per save.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def _timed(record, spent: list):
    """Wrap ``record.snapshot`` (on the instance) so that each call's time is appended to ``spent``."""
    snapshot = record.snapshot

    def timed(model, final=False):
        start = time.perf_counter()
        try:
            return snapshot(model, final=final)
        finally:
            if not final:
                spent.append(time.perf_counter() - start)

    record.snapshot = timed


def _timed_call(function, spent: list):
    """``function``, with each call's time appended to ``spent``."""
    def timed(*arguments, **keywords):
        start = time.perf_counter()
        try:
            return function(*arguments, **keywords)
        finally:
            spent.append(time.perf_counter() - start)

    return timed


def main() -> None:
    """Print, for each model, the extra time per batch and the time per snapshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median is printed (default 7)")
    args = parser.parse_args()
    os.environ["TFDPBNN_PRIVACY_STORE"] = os.path.join(tempfile.mkdtemp(), "record.sqlite")
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.record import attributes

    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    rng = np.random.default_rng(0)
    for name, features, hidden, n, batch in (("64-32-10", 64, 32, 1437, 64),
                                             ("784-1000-10", 784, 1000, 6000, 600)):
        x = rng.uniform(size=(n, features)).astype("float32")
        y = rng.integers(0, 10, n)
        model = tf.keras.Sequential([tf.keras.Input((features,)),
                                     tf.keras.layers.Dense(hidden, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=n, batch_size=batch,
                                           delta=1e-5, allow_exceeding_budget=True)
        loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=optimizer, loss=loss)
        folder = tempfile.mkdtemp()
        never = tf.keras.callbacks.ModelCheckpoint(os.path.join(folder, "never.weights.h5"),
                                                   save_weights_only=True, save_freq=10 ** 9)
        every_other = tf.keras.callbacks.ModelCheckpoint(os.path.join(folder, "w.weights.h5"),
                                                         save_weights_only=True, save_freq=2)
        saves: list = []
        every_other._save_model = _timed_call(every_other._save_model, saves)
        times: dict = {"never": [], "other": []}
        snapshots: list = []
        for round_ in range(args.rounds):
            for kind, callback in (("never", never), ("other", tf.keras.callbacks.LambdaCallback()),
                                   ("saver", every_other)):
                start = time.perf_counter()
                if kind == "saver":
                    spent: list = []
                    _timed(attributes.run_record(optimizer), spent)
                model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[callback])
                if kind == "saver":
                    del attributes.run_record(optimizer).snapshot  # the class's method again
                    if round_:
                        snapshots.extend(spent)
                else:
                    times[kind].append(time.perf_counter() - start)
        steps = -(-n // batch)
        never_saving, other = (statistics.median(times[k][1:]) for k in ("never", "other"))
        print(f"{name}, {steps} steps: with a ModelCheckpoint that never saves {never_saving * 1e3:.1f} ms, "
              f"with another callback {other * 1e3:.1f} ms: "
              f"{(never_saving - other) / steps * 1e3:+.2f} ms per batch")
        print(f"{name}: with a ModelCheckpoint(save_freq=2), {len(snapshots) / (args.rounds - 1):.0f} "
              f"snapshots per fit (its saves and the epoch end), {statistics.median(snapshots) * 1e3:.2f} "
              f"ms each (median); the saver's own save {statistics.median(saves) * 1e3:.2f} ms each (median)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
