"""Cost of where the DP noise's seed comes from: the run's key and step counter against the alternatives.

Times one fused Box-Muller draw (``tfdpbnn.privacy.noise``) of ``--size`` numbers (default 795,010: the
784-1000-10 MLP) in a bare ``tf.function``, seeded three ways: the run's ``os.urandom`` key and a step
counter (``NoiseKey.next_seed``, the default), secure mode (16 bytes of ``os.urandom`` per step through a
``tf.py_function``) and, for comparison, a stateful ``tf.random`` draw (replayable under
``tf.keras.utils.set_random_seed``; what the optimizers used before the run owned its noise). Calls are
interleaved; medians in milliseconds.

    python benchmarks/noise_seed.py            # the numbers in docs/benchmarks.md ("The noise alone")
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def measure(size: int = 795_010, repeats: int = 40) -> dict:
    """Median milliseconds per draw of ``size`` numbers, by seed source."""
    import tensorflow as tf

    from tfdpbnn.privacy import noise

    key = noise.NoiseKey()
    stddev = tf.Variable(0.01)

    @tf.function
    def run_key():
        return noise._flat_noise(size, stddev, noise.step_seed(False, key))

    @tf.function
    def secure():
        return noise._flat_noise(size, stddev, noise.step_seed(True))

    @tf.function
    def stateful():
        seed = tf.random.uniform([2], minval=tf.int64.min, maxval=tf.int64.max, dtype=tf.int64)
        return noise._flat_noise(size, stddev, seed)

    draws = {"run key + counter": run_key, "secure mode": secure, "stateful tf.random seed": stateful}
    times = {name: [] for name in draws}
    for f in draws.values():
        f()
        f()
    for _ in range(repeats):
        for name, f in draws.items():
            start = time.perf_counter()
            f().numpy()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
    """Print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=795_010, help="numbers per draw")
    parser.add_argument("--repeats", type=int, default=40, help="interleaved calls of each draw")
    args = parser.parse_args(argv)
    for name, ms in measure(args.size, args.repeats).items():
        print(f"{name:>24}: {ms:.2f} ms per draw of {args.size:,} numbers (median of {args.repeats})")


if __name__ == "__main__":
    main()
