"""What the per-record ledger's bound costs over a store that holds many runs on the same records.

An experiment repeated over seeds and configurations writes many training releases against the same
records, with the same few (noise multiplier, sample rate) pairs: the ledger then holds many histories,
mostly prefixes of each other. This builds such a ledger in a temporary SQLite file (``--runs`` DP-SGD
runs of 120 Poisson steps over random subsets of 1,437 records, cycling through four noise multipliers)
and times ``RecordLedger.max_epsilon`` (the largest composed epsilon over the records) by PLD and RDP
against composing every history's events one by one with the same accountant (what the ledger did before
merging repeated releases and skipping contained histories), and checks that both give the same bound.

    python benchmarks/ledger_bound_cost.py --runs 60
"""

import argparse
import os
import platform
import tempfile
import time

import dp_accounting
import numpy as np

from tfdpbnn.record.ledger import _epsilon_of
from tfdpbnn.record.record_ledger import RecordLedger, _neighboring

SIGMAS = (8.3, 4.1, 2.9, 1.4)


def build(path: str, runs: int, seed: int = 0) -> RecordLedger:
    """A ledger with ``runs`` committed training releases over subsets of 1,437 records."""
    rng = np.random.default_rng(seed)
    ledger = RecordLedger(path)
    keys = np.arange(1, 1438, dtype=np.int64)
    for run in range(runs):
        subset = np.sort(rng.choice(keys, size=int(rng.integers(1000, 1438)), replace=False))
        step = dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(SIGMAS[run % 4]))
        event = dp_accounting.SelfComposedDpEvent(step, 120)
        ledger.reserve(subset, event, phase_id=run + 1).commit(event)
    return ledger


def main() -> None:
    """Build the ledger, time the bound both ways, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--skip-brute", action="store_true", help="time only the ledger's own bound")
    args = parser.parse_args()
    print(f"Command: python benchmarks/ledger_bound_cost.py --runs {args.runs}")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs; load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        ledger = build(os.path.join(tmp, "ledger.sqlite"), args.runs)
        histories = ledger.histories()
        print(f"{args.runs} runs, {len(histories)} histories")
        print("| accountant | ledger bound | wall | CPU | every history composed | wall | CPU |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for accountant in ("pld", "rdp"):
            wall, cpu = time.perf_counter(), time.process_time()
            bound = ledger.max_epsilon(None, 1e-5, accountant)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            cells = ["-", "-", "-"]
            if not args.skip_brute:
                w, c = time.perf_counter(), time.process_time()
                brute = max(_epsilon_of(dp_accounting.ComposedDpEvent(h.composed()), 1e-5, accountant,
                                        _neighboring(h)) for h in histories)
                w, c = time.perf_counter() - w, time.process_time() - c
                cells = [f"{brute:.4f}", f"{w:.2f} s", f"{c:.2f} s"]
                assert bound <= brute * (1 + 1e-9) and bound >= 0.99 * brute, (bound, brute)
            print(f"| {accountant} | {bound:.4f} | {wall:.2f} s | {cpu:.2f} s | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
