"""Reproduce `heteroscedastic`; same as `tfdpbnn reproduce heteroscedastic`.

Usage: python examples/reproduce_heteroscedastic.py [--out DIR] [--seeds N] [--smoke]
"""

import argparse

from tfdpbnn.reproduce import run_experiment

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/heteroscedastic")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    run_experiment("heteroscedastic", args.out, seeds=args.seeds, smoke=args.smoke)
