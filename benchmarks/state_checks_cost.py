"""What the state checks cost per DP ``fit`` call (docs/privacy.md, "What tfdpbnn checks").

Run: ``.venv/bin/python benchmarks/state_checks_cost.py`` (seconds). Prints the time of
``check_declared_state`` (every ``fit``/``train_on_batch`` call) and of ``StateWatch``'s snapshot and
comparison (once per ``fit``) for the 784-1000-10 MLP, and of ``check_declared_state`` for a model with ten
frozen ``BatchNormalization`` layers (compared with a fresh copy when their state changes; the copies are
cached per config).
"""

from __future__ import annotations

import time

import tensorflow as tf

import tfdpbnn  # noqa: F401 - first, so that tf.keras is Keras 2
from tfdpbnn.optimizers.state_checks import VariableSnapshot, check_declared_state


def _per_call_ms(fn, repeats=20) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    """Print the three timings in milliseconds."""
    mlp = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(1000),
                               tf.keras.layers.Dense(10)])
    layers = [tf.keras.Input((64,))]
    for _ in range(10):
        layers += [tf.keras.layers.Dense(64), tf.keras.layers.BatchNormalization(trainable=False)]
    frozen_bn = tf.keras.Sequential(layers)
    print(f"check_declared_state, 784-1000-10 MLP: {_per_call_ms(lambda: check_declared_state(mlp)):.3f} ms")
    print("StateWatch snapshot + comparison, 784-1000-10 MLP: "
          f"{_per_call_ms(lambda: VariableSnapshot(mlp, outside_dp_update=True).refuse_changes('-')):.3f} ms")
    print("check_declared_state, 10 frozen BatchNormalization layers: "
          f"{_per_call_ms(lambda: check_declared_state(frozen_bn)):.2f} ms")


if __name__ == "__main__":
    main()
