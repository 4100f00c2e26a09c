"""``python -m experiments <name> [options]``: see ``experiments.cli``."""

import sys

from experiments.cli import main

sys.exit(main())
