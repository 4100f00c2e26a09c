"""``tfdpbnn reproduce <name> [options]``: run one of the papers' experiments from a source checkout.

The experiments are not part of the installed library: they live in the repository's top-level
``experiments/`` folder and use only tfdpbnn's public API. This command finds that folder (beside the
imported ``tfdpbnn`` package, as in an editable install, or in the current directory) and hands its
arguments to ``python -m experiments``; without a checkout it stops with an error saying so.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

PROG = "tfdpbnn reproduce"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``reproduce`` on ``subparsers`` (see ``tfdpbnn.cli``)."""
    parser = subparsers.add_parser(
        "reproduce", add_help=False, help="reproduce a paper's experiment (needs a source checkout)",
        description="Run one experiment of the repository's experiments/ folder; "
                    "`tfdpbnn reproduce --help` lists them (from a source checkout).")
    parser.add_argument("-h", "--help", action="store_true", help="list the experiments and their options")
    parser.add_argument("name", nargs="?", help="experiment to run")
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="the experiment's options")
    parser.set_defaults(func=_run)
    return parser


def experiments_root() -> str:
    """The source checkout holding ``experiments/``: beside the imported package, else the current directory.

    Raises ``ValueError`` when neither holds it (tfdpbnn installed from a wheel, run outside a checkout).
    """
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (os.path.dirname(package_dir), os.getcwd()):
        if os.path.isfile(os.path.join(root, "experiments", "__init__.py")):
            return root
    raise ValueError("experiments: the reproduction experiments are not part of the installed package; "
                     "they live in the experiments/ folder of the tfdpbnn source repository. Run this "
                     "command (or `python -m experiments`) from a checkout of the repository")


def _run(args) -> int:
    root = experiments_root()
    if root not in sys.path:
        sys.path.insert(0, root)
    cli = importlib.import_module("experiments.cli")
    found = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    if os.path.realpath(found) != os.path.realpath(root):
        raise ValueError(f"experiments: imported {cli.__file__}, not the checkout's {root}/experiments; "
                         "another module named 'experiments' shadows it")
    argv = ([args.name] if args.name is not None else []) + list(args.argv)
    return cli.main(argv + ["--help"] if args.help else argv, prog=PROG)
