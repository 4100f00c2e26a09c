"""The ``tfdpbnn`` console command's entry point, outside the package so ``--help`` stays fast.

Importing ``tfdpbnn`` imports TensorFlow (3-5 s) because the package registers its Keras layers and
optimizers on import. This module loads ``tfdpbnn/cli.py`` by path, which imports no TensorFlow itself:
``tfdpbnn --help`` lists the subcommands at once, and only a subcommand that runs imports the package.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _cli_module():
    spec = importlib.util.find_spec("tfdpbnn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tfdpbnn is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "cli.py")
    module_spec = importlib.util.spec_from_file_location("tfdpbnn_cli_impl", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    """Run ``tfdpbnn`` (see ``tfdpbnn.cli.main``); returns the process exit code."""
    return _cli_module().main(argv)


if __name__ == "__main__":
    sys.exit(main())
