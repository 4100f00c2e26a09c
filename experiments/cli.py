"""``python -m experiments <name>`` (also ``tfdpbnn reproduce <name>``): run one reproduction experiment."""

from __future__ import annotations

import argparse
import os
import sys

from experiments import EXPERIMENTS, run_experiment

OPTIONS = ("epsilons", "methods", "configs", "dataset", "tables", "noise_levels", "epochs")


def build_parser(prog: str = "python -m experiments") -> argparse.ArgumentParser:
    """Return the argument parser of the experiments' command line."""
    listing = "; ".join(f"{name}: {desc}" for name, (_, desc) in EXPERIMENTS.items())
    parser = argparse.ArgumentParser(
        prog=prog, description="Run one reproduction experiment and write CSV/JSON/PNG results. "
                               f"Experiments: {listing}.")
    parser.add_argument("name", choices=list(EXPERIMENTS), help="experiment to run")
    parser.add_argument("--out", default=None, help="output directory (default: runs/<name>)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs per configuration (default: the experiment's own, >= 5 for tables)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny configuration that finishes in seconds (for tests; numbers meaningless)")
    parser.add_argument("--data-dir", default=None,
                        help="TFDS data directory holding a prepared data set, never downloaded "
                             "(dpbnn-table, digits-table: run on MNIST when given; sidp-tables: see "
                             "--dataset); not needed for DIGITS")
    parser.add_argument("--dataset", default=None, choices=("digits", "mnist", "cifar10"),
                        help="data set: dpbnn-table and digits-table take digits or mnist (default: mnist "
                             "with --data-dir, else digits); sidp-tables takes digits (default), mnist or "
                             "cifar10 (the last two need --data-dir)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=None,
                        help="epsilons to run (sigma-curve, digits-table, digits-ablation; dpbnn-table: one)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="methods to run (digits-table, digits-ablation, dpbnn-table)")
    parser.add_argument("--configs", nargs="+", default=None,
                        help="digits-table: 'paper' and/or 'tuned' (default both)")
    parser.add_argument("--tables", nargs="+", default=None,
                        help="sidp-tables: any of table1, table1-bn-dp, table4 (default all)")
    parser.add_argument("--noise-levels", type=float, nargs="+", default=None,
                        help="sidp-tables: weight-noise stds of Table 1 (default 0 0.01 0.1 1 2)")
    parser.add_argument("--epochs", type=int, default=None, help="sidp-tables: training epochs (override)")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m experiments") -> int:
    """Parse ``argv``, run the experiment and print where its files went; returns the exit code."""
    args = build_parser(prog).parse_args(argv)
    out = args.out or os.path.join("runs", args.name)
    options = {k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None}
    try:
        record = run_experiment(args.name, out, seeds=args.seeds, smoke=args.smoke, data_dir=args.data_dir,
                                **options)
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(record['outputs'])} files and run.json to {out} "
          f"(wall time {record['wall_time_s']:.1f} s)")
    return 0
