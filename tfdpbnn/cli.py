"""The ``tfdpbnn`` console command.

Each subcommand lives in its own module under ``tfdpbnn.commands`` and exposes
``add_parser(subparsers)``, which registers its arguments and sets ``func`` to the function that runs it.
``COMMANDS`` lists them with a one-line summary, so ``tfdpbnn --help`` loads none of them; only the module of
the subcommand named is loaded. Importing anything under ``tfdpbnn.`` runs the package's ``__init__``, which
imports TensorFlow (seconds), so the command modules are loaded by file path (``command_module``) and import
only the standard library at their top level: ``tfdpbnn COMMAND --help`` answers without TensorFlow, and a
command imports what it needs when it runs. Help text is plain text: reST literals and roles in the
modules' docstrings are printed without their markup.

TensorFlow's C++ log lines (e.g. "Unable to register cuDNN factory" on machines without a GPU) are
silenced for the command: ``TF_CPP_MIN_LOG_LEVEL`` defaults to 3 here unless it is already set.
Python errors still surface; a ``ValueError`` (bad input) or ``ImportError`` (an optional extra not installed)
from a subcommand prints one ``error:`` line (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
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

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")   # :func:`name` -> name
_LITERAL = re.compile(r"``([^`]+)``")         # ``text`` -> text
_QUOTED = re.compile(r"(?<![`\w])`([^`]+)`(?![`\w])")   # `text` -> 'text'


def plain_text(text: str) -> str:
    """``text`` without reST markup: roles and double-backquoted literals bare, single backquotes quotes."""
    return _QUOTED.sub(r"'\1'", _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text)))


class PlainTextParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose description, epilog and argument help are plain text (``plain_text``).

    Converted before argparse wraps them; subparsers are created with the parent's class, so they are too.
    """

    def __init__(self, *args, **kwargs):
        for key in ("description", "epilog"):
            if kwargs.get(key):
                kwargs[key] = plain_text(kwargs[key])
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        """``ArgumentParser.add_argument`` with ``help`` made plain text."""
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain_text(kwargs["help"])
        return super().add_argument(*args, **kwargs)


def command_module(name: str):
    """The module of subcommand ``name``, loaded by file path without importing the ``tfdpbnn`` package.

    Loaded once per process (kept in ``sys.modules`` as ``tfdpbnn_cli_<name>``); its top level imports only
    the standard library, and its functions import tfdpbnn when they run.
    """
    key = f"tfdpbnn_cli_{name}"
    if key not in sys.modules:
        filename = COMMANDS[name][0].rsplit(".", 1)[1] + ".py"
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "commands", filename)
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser.

    ``only=None``: every subcommand fully registered (loads all command modules); ``only=name``: that
    subcommand fully, the others as one-line entries for the listing. Neither imports TensorFlow.
    """
    parser = PlainTextParser(
        prog="tfdpbnn",
        description="Differentially private Bayesian neural networks for Keras. "
                    "Run 'tfdpbnn COMMAND --help' for a command's options.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, (_, summary) in COMMANDS.items():
        if only is None or only == name:
            command_module(name).add_parser(subparsers)
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
    except (ValueError, ImportError) as err:   # bad input, or an optional extra not installed
        print(f"tfdpbnn {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
