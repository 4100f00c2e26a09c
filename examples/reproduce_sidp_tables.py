"""Reproduce `sidp-tables` (Davody et al. 2020, Tables 1 and 4); same as `tfdpbnn reproduce sidp-tables`.

Usage: python examples/reproduce_sidp_tables.py [--out DIR] [--seeds N] [--smoke]
       [--dataset digits|mnist|cifar10 --data-dir DIR] [--tables table1 table1-bn-dp table4]
"""

import argparse

from tfdpbnn.reproduce import run_experiment

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/sidp-tables")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--tables", nargs="+", default=None)
    args = parser.parse_args()
    options = {"tables": args.tables} if args.tables else {}
    run_experiment("sidp-tables", args.out, seeds=args.seeds, smoke=args.smoke, data_dir=args.data_dir,
                   dataset=args.dataset, **options)
