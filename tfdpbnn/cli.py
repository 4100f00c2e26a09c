"""The ``tfdpbnn`` console command.

Each subcommand lives in its own module under ``tfdpbnn.commands`` and exposes
``add_parser(subparsers)``, which registers its arguments and sets ``func`` to the function that runs it.
``COMMANDS`` lists them with a one-line summary, so ``tfdpbnn --help`` imports none of them (nor
TensorFlow); only the module of the subcommand that runs is imported.

TensorFlow's C++ log lines (e.g. "Unable to register cuDNN factory" on machines without a GPU) are
silenced for the command: ``TF_CPP_MIN_LOG_LEVEL`` defaults to 3 here unless it is already set.
Python errors still surface; a ``ValueError`` from a subcommand prints one ``error:`` line (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Must precede the first TensorFlow import of the process.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Subcommand -> (module, one-line summary), in the order `tfdpbnn --help` lists them.
COMMANDS = {
    "privacy": ("tfdpbnn.commands.privacy", "privacy accounting for a DP-SGD run (table, optional plot)"),
    "reproduce": ("tfdpbnn.commands.reproduce",
                  "reproduce a paper's experiment with sound privacy accounting"),
    "train": ("tfdpbnn.commands.train", "train a DP Bayesian network at a privacy budget and export it"),
    "audit": ("tfdpbnn.commands.audit", "measure a lower bound on epsilon with canaries (privacy audit)"),
}
COMMAND_MODULES = tuple(module for module, _ in COMMANDS.values())


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser.

    ``only=None``: every subcommand fully registered (imports all command modules); ``only=name``: that
    subcommand fully, the others as one-line entries for the listing.
    """
    parser = argparse.ArgumentParser(
        prog="tfdpbnn",
        description="Differentially private Bayesian neural networks for Keras. "
                    "Run `tfdpbnn COMMAND --help` for a command's options.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, (module, summary) in COMMANDS.items():
        if only is None or only == name:
            importlib.import_module(module).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def _command_in(argv) -> str:
    """The subcommand named in ``argv`` ('' if none): the first argument that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else ""
    return ""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfdpbnn`` command; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=_command_in(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as err:
        print(f"tfdpbnn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
