"""Markdown tables (mean ± std over seeds) from one or more ``honest_runs.csv`` files of ``honest_table.py``.

python experiments/honest_summary.py runs/honest-v2-eps1/honest_runs.csv runs/honest-eps1/honest_runs.csv
"""

from __future__ import annotations

import argparse
import csv

import numpy as np

COLUMNS = ("accuracy", "ece", "nll", "auroc_noise", "auroc_rot180", "trial_epsilon", "epsilon_total",
           "trials")


def main():
    """Read the ``honest_runs.csv`` files given on the command line; print one Markdown row per group."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    groups: dict = {}
    for path in args.files:
        with open(path) as fh:
            for r in csv.DictReader(fh):
                key = (r.get("grid") or "v1", r["method"], float(r["epsilon_target"]))
                groups.setdefault(key, []).append(r)
    print("| grid | method | epsilon | seeds | " + " | ".join(COLUMNS) + " | hidden units chosen |")
    print("| --- " * (5 + len(COLUMNS)) + "|")
    for (grid, method, eps), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][2], kv[0][1])):
        cells = []
        for c in COLUMNS:
            v = np.array([float(r[c]) for r in rs if r.get(c) not in (None, "")])
            one = f"{v[0]:.3f}" if len(v) else "-"
            cells.append(f"{v.mean():.3f} ± {v.std():.3f}" if len(v) > 1 else one)
        hidden = ", ".join(r.get("hidden", "") for r in rs)
        print(f"| {grid} | {method} | {eps:g} | {len(rs)} | " + " | ".join(cells) + f" | {hidden} |")


if __name__ == "__main__":
    main()
