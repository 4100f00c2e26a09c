"""The ``tfdpbnn`` console command.

Each subcommand lives in its own module under ``tfdpbnn.commands`` and exposes
``add_parser(subparsers)``, which registers its arguments and sets ``func`` to the function that runs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order `tfdpbnn --help` lists them.
COMMAND_MODULES = ("tfdpbnn.commands.privacy", "tfdpbnn.commands.reproduce", "tfdpbnn.commands.train",
                   "tfdpbnn.commands.audit")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="tfdpbnn",
        description="Differentially private Bayesian neural networks for Keras.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfdpbnn`` command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as err:
        print(f"tfdpbnn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
