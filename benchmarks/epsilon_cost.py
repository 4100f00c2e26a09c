"""Cost of the epsilon a DP ``fit`` writes at every epoch end, as the run grows to 10,000 steps.

A ``DPSGDOptimizer`` (sigma 1, q = 256/60000, Poisson batches from ``tfdpbnn.data.poisson_batches``) on a
tiny model opens its ledger phase as ``fit`` does; the step counter and the counted examples are then set
to ``steps`` (no training: only the record's cost is measured) and ``DPTrainingMonitor.on_epoch_end`` (the
Poisson test, the pass check, the epsilon) is timed at ``--epoch-ends`` successive epoch ends of
``steps / epoch_ends`` steps each, ending at ``steps``. For comparison it also times the optimizer's
epsilon composed from scratch by dp-accounting's ``RdpAccountant`` and by the PLD accountant ("pld": what
a PLD optimizer logs once, at the last epoch).

    python benchmarks/epsilon_cost.py                  # the run in docs/benchmarks.md
    python benchmarks/epsilon_cost.py --steps 1000     # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def measure(steps: int, epoch_ends: int, batch_size: int = 256, num_examples: int = 60000) -> dict:
    """Seconds per epoch end (median, max) at a run of ``steps`` steps, and the from-scratch costs."""
    import dp_accounting
    import numpy as np
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.callbacks import DPTrainingMonitor

    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_examples, 4)).astype(np.float32)
    y = rng.integers(0, 2, num_examples)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=num_examples, batch_size=batch_size, delta=1e-5,
                                 sampling="poisson")
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # What a DP fit opens (a custom loop's phase would count every step as a participation).
    opt.begin_training(model, tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / num_examples),
                       _fit=True)
    monitor = DPTrainingMonitor()
    monitor.set_model(model)
    monitor.set_params({"epochs": epoch_ends + 1})
    state = opt._dp_ledger
    times = []
    for k in range(1, epoch_ends + 1):
        taken = steps * k // epoch_ends
        opt.iterations.assign(taken)
        state.open_examples.assign(float(taken * batch_size))
        state.open_squared.assign(float(taken * batch_size * (1 - batch_size / num_examples)))
        monitor.on_epoch_begin(k)
        logs = {}
        start = time.perf_counter()
        monitor.on_epoch_end(k, logs)
        times.append(time.perf_counter() - start)
    event = opt.ledger.event()
    start = time.perf_counter()
    scratch_rdp = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-5)
    rdp_seconds = time.perf_counter() - start
    start = time.perf_counter()
    pld = opt.epsilon(accountant="pld")
    pld_seconds = time.perf_counter() - start
    return {"steps": steps, "epoch_ends": epoch_ends, "epsilon": logs["epsilon"],
            "epoch_end_first_s": times[0], "epoch_end_median_s": statistics.median(times[1:] or times),
            "epoch_end_max_after_first_s": max(times[1:] or times),
            "from_scratch_rdp_s": rdp_seconds, "from_scratch_rdp_epsilon": scratch_rdp,
            "pld_s": pld_seconds, "pld_epsilon": pld, "machine": f"{platform.machine()} "
            f"{os.cpu_count()} cores, {platform.python_version()}"}


def main(argv=None) -> None:
    """Print the measurement as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--epoch-ends", type=int, default=40)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.epoch_ends < 2:
        raise SystemExit("--steps must be >= 1 and --epoch-ends >= 2")
    print(json.dumps(measure(args.steps, args.epoch_ends), indent=1))


if __name__ == "__main__":
    main()
