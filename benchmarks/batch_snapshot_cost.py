"""What the record's snapshot at every batch end costs, in a ``fit`` with a batch-frequency weight saver.

Run: ``.venv/bin/python benchmarks/batch_snapshot_cost.py`` (about a minute). A ``fit`` whose callbacks save
the weights every so many batches (``ModelCheckpoint`` or ``BackupAndRestore`` with an integer
``save_freq``) snapshots the weights at every batch end, so that weights saved in the middle of a pass are
known to the privacy record wherever they are loaded. Times one-epoch DP fits of the 64-32-10 and
784-1000-10 models with a ``ModelCheckpoint(save_freq=10**9)`` (snapshots at every batch, no file written)
against the same fits with another callback, alternating, median of ``--rounds`` (the first dropped).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def main() -> None:
    """Print the extra time per batch for each model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median is printed (default 7)")
    args = parser.parse_args()
    os.environ["TFDPBNN_PRIVACY_STORE"] = os.path.join(tempfile.mkdtemp(), "record.sqlite")
    import tensorflow as tf

    import tfdpbnn

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
        saver = tf.keras.callbacks.ModelCheckpoint(os.path.join(tempfile.mkdtemp(), "w.h5"),
                                                   save_weights_only=True, save_freq=10 ** 9)
        times: dict = {"saver": [], "other": []}
        for _ in range(args.rounds):
            for kind, callback in (("saver", saver), ("other", tf.keras.callbacks.LambdaCallback())):
                start = time.perf_counter()
                model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[callback])
                times[kind].append(time.perf_counter() - start)
        steps = -(-n // batch)
        with_saver, other = (statistics.median(times[k][1:]) for k in ("saver", "other"))
        print(f"{name}, {steps} steps: a fit with a batch-frequency ModelCheckpoint {with_saver * 1e3:.1f} "
              f"ms, with another callback {other * 1e3:.1f} ms: {(with_saver - other) / steps * 1e3:+.2f} ms "
              "per batch")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
