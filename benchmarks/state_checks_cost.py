"""What the state checks cost per DP ``fit`` call (docs/privacy.md, "What tfdpbnn checks").

Run: ``.venv/bin/python benchmarks/state_checks_cost.py`` (seconds). Prints the time of
``check_declared_state`` (every ``fit``/``train_on_batch`` call) and of ``StateWatch``'s snapshot and
comparison (once per ``fit``) for the 784-1000-10 MLP, and of ``check_declared_state`` for a model with ten
frozen ``BatchNormalization`` layers (compared with a fresh copy when their state changes; the copies are
cached per config). For the checks during the run it times, on the same MLP, ``StateWatch``'s work at an
epoch end and at the end of ``fit``, and ``WriteWatch``'s two checks inside a traced step (before and after
the update, per step), against the same traced step without them.
"""

from __future__ import annotations

import time

import tensorflow as tf

import tfdpbnn  # noqa: F401 - first, so that tf.keras is Keras 2
from tfdpbnn.optimizers.state_checks import VariableSnapshot, WriteWatch, check_declared_state


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
    variables = mlp.trainable_variables
    watch = WriteWatch()
    watch.new_run(variables)
    outside = VariableSnapshot(mlp, outside_dp_update=True)
    iterations = tf.Variable(0, dtype=tf.int64)

    def epoch_end():  # StateWatch.on_epoch_end: non-trainable state compared, the epoch's state kept
        outside.changed()
        watch.last_written_state()

    print(f"StateWatch at an epoch end, 784-1000-10 MLP: {_per_call_ms(epoch_end):.3f} ms")
    update = [tf.random.normal(v.shape) * 1e-3 for v in variables]

    @tf.function
    def plain():
        for v, u in zip(variables, update, strict=True):
            v.assign_sub(u)
        iterations.assign_add(1)

    @tf.function
    def watched():
        with tf.control_dependencies(watch.before_write(variables, iterations)):
            for v, u in zip(variables, update, strict=True):
                v.assign_sub(u)
            iterations.assign_add(1)
        watch.after_write(variables, iterations)

    plain_ms, watched_ms = _per_call_ms(plain, 200), _per_call_ms(watched, 200)
    print(f"WriteWatch in a traced step, 784-1000-10 MLP (795,010 weights): {watched_ms - plain_ms:.3f} ms "
          f"per step ({watched_ms:.3f} ms against {plain_ms:.3f} ms for the update alone)")

    print("StateWatch at the end of fit (WriteWatch.changed_since_write, armed), 784-1000-10 MLP: "
          f"{_per_call_ms(lambda: watch.changed_since_write(iterations)):.3f} ms")

if __name__ == "__main__":
    main()
