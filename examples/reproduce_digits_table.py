"""Reproduce `digits-table`; same as `tfdpbnn reproduce digits-table`.

Usage: python examples/reproduce_digits_table.py [--out DIR] [--seeds N] [--smoke] [--data-dir DIR]
(--data-dir: a TFDS directory with MNIST prepared; the table then runs on MNIST instead of DIGITS.)
"""

import argparse

from tfdpbnn.reproduce import run_experiment

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/digits-table")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    run_experiment("digits-table", args.out, seeds=args.seeds, smoke=args.smoke, data_dir=args.data_dir)
