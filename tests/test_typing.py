"""mypy is clean on ``tfdpbnn/privacy``, the record's ledgers and store, ``_validation.py`` and the mechanism.

Configuration: ``[tool.mypy]`` in pyproject.toml, which lists the checked files.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

# Not in the fast tier (./scripts/test --fast): mypy over the typed modules (a lint, not a behaviour check).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mypy_clean_on_the_privacy_package():
    # checked for the running Python (numpy 2's stubs, on the Keras 3 set, need Python >= 3.12 syntax)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             "--python-version", version], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
