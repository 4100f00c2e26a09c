"""``tfdpbnn reproduce <name>``: run one of the papers' experiments (``tfdpbnn.reproduce``)."""

from __future__ import annotations

import argparse
import os


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``reproduce`` on ``subparsers`` (see ``tfdpbnn.cli``)."""
    from tfdpbnn.reproduce import EXPERIMENTS

    listing = "; ".join(f"{name}: {desc}" for name, (_, desc) in EXPERIMENTS.items())
    parser = subparsers.add_parser(
        "reproduce", help="reproduce a paper's experiment with sound privacy accounting",
        description="Run one reproduction experiment and write CSV/JSON/PNG results. "
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
    parser.set_defaults(func=_run)
    return parser


def _run(args) -> int:
    from tfdpbnn.reproduce import run_experiment

    out = args.out or os.path.join("runs", args.name)
    options = {k: getattr(args, k) for k in ("epsilons", "methods", "configs", "dataset", "tables",
                                             "noise_levels", "epochs")
               if getattr(args, k) is not None}
    record = run_experiment(args.name, out, seeds=args.seeds, smoke=args.smoke, data_dir=args.data_dir,
                            **options)
    print(f"wrote {len(record['outputs'])} files and run.json to {out} "
          f"(wall time {record['wall_time_s']:.1f} s)")
    return 0
