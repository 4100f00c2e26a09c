"""What the state checks cost per DP ``fit`` call (docs/privacy.md, "What tfdpbnn checks").

Run: ``.venv/bin/python benchmarks/state_checks_cost.py`` (seconds). Prints the time of
``check_declared_state`` (every ``fit``/``train_on_batch`` call) and of ``StateWatch``'s snapshot and
comparison (once per ``fit``) for the 784-1000-10 MLP, and of ``check_declared_state`` for a model with ten
frozen ``BatchNormalization`` layers (compared with a fresh copy when their state changes; the copies are
cached per config). For the checks during the run it times, on the same MLP, ``StateWatch``'s work at an
epoch end and at the end of ``fit``, and ``WriteWatch``'s two checks inside a traced step (before and after
the update, per step), against the same traced step without them, on the MLP and a small 64-32-10 model,
for an update of the weights alone and for one that also writes a momentum per weight (optimizer state the
watch compares too):
wall and CPU time (``time.process_time``, every thread of the process) per step, the median of
``--rounds`` rounds of ``--steps`` steps each, with the load average before and after (the machine is
shared: run it under ``nice`` and read the CPU column).
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def _per_step(fn, steps: int, rounds: int) -> tuple:
    """Median wall and CPU milliseconds per call of ``fn`` over ``rounds`` rounds of ``steps`` calls."""
    fn()
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            fn()
        walls.append((time.perf_counter() - wall) / steps * 1e3)
        cpus.append((time.process_time() - cpu) / steps * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def write_watch_per_step(model, steps: int, rounds: int) -> dict:
    """Wall and CPU ms per traced step of a plain update of ``model``'s weights, with and without the watch.

    The watched step calls ``WriteWatch.before_write`` and ``after_write`` around the update, as every DP
    ``apply_gradients`` does; the two steps alternate round by round, so load changes hit both.
    """
    variables = model.trainable_variables
    watch, momentum_watch = WriteWatch(), WriteWatch()
    watch.new_run(variables)
    iterations = tf.Variable(0, dtype=tf.int64)
    update = [tf.random.normal(v.shape) * 1e-3 for v in variables]
    # A momentum per weight, as SGD with momentum keeps (the optimizer's state the watch compares too).
    slots = [tf.Variable(tf.zeros(v.shape)) for v in variables]
    momentum_watch.new_run(variables, state=slots, writes=iterations)

    def update_step(with_momentum):
        for v, u, m in zip(variables, update, slots, strict=True):
            if with_momentum:
                v.assign_sub(m.assign(0.9 * m + u))
            else:
                v.assign_sub(u)
        iterations.assign_add(1)

    def traced(with_momentum, by=None):
        """A traced step updating the weights (and a momentum), watched by ``by`` as a DP update is."""
        @tf.function
        def step():
            with tf.control_dependencies(by.before_write(variables, iterations) if by is not None else []):
                update_step(with_momentum)
            if by is not None:
                by.after_write(variables, iterations)
        return step

    steps_of = {"plain": traced(False), "watched": traced(False, watch), "plain, momentum": traced(True),
                "watched, momentum": traced(True, momentum_watch)}
    times = {name: [] for name in steps_of}
    for _ in range(rounds):
        for name, fn in steps_of.items():
            times[name].append(_per_step(fn, steps, 1))
    out = {}
    for name, pairs in times.items():
        out[name] = (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs))
    return out


def main() -> None:
    """Print the timings in milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="traced steps per round (default 200)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median is printed (default 7)")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
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
    iterations.assign(0)
    watch.after_write(variables, iterations)  # armed, as after a DP step
    print("StateWatch at the end of fit (WriteWatch.changed_since_write, armed), 784-1000-10 MLP: "
          f"{_per_call_ms(lambda: watch.changed_since_write(iterations)):.3f} ms")
    small = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(10)])
    for label, model in (("784-1000-10 MLP (795,010 weights)", mlp), ("64-32-10 (2,410 weights)", small)):
        found = write_watch_per_step(model, args.steps, args.rounds)
        for kind in ("", ", momentum"):
            plain_wall, plain_cpu = found["plain" + kind]
            watched_wall, watched_cpu = found["watched" + kind]
            what = "the weights and their momentum (optimizer state)" if kind else "the weights"
            print(f"WriteWatch per traced step, {label}, {what}: +{watched_cpu - plain_cpu:.3f} ms CPU "
                  f"({watched_cpu:.3f} against {plain_cpu:.3f} ms for the update alone), "
                  f"+{watched_wall - plain_wall:.3f} ms wall ({watched_wall:.3f} against {plain_wall:.3f})")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
