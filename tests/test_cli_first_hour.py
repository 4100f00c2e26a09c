"""The console command's first contact: fast --help, one-line errors for missing data, quiet TF logs."""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

import tfdpbnn.data.tfds_loaders as tfds_loaders
from tfdpbnn import cli
from tfdpbnn.data import DatasetNotAvailableError, load_tfds

ROOT = pathlib.Path(__file__).resolve().parents[1]

# cli.py in a fresh interpreter, the ``tfdpbnn`` package replaced by an empty one: what ``tfdpbnn --help``
# costs beyond importing the package itself (the package's own ``__init__`` is timed by the lead's check).
_PROBE = textwrap.dedent("""
    import sys, time, types
    start = time.perf_counter()
    package = types.ModuleType("tfdpbnn")
    package.__path__ = [sys.argv[1]]
    sys.modules["tfdpbnn"] = package
    import tfdpbnn.cli
    try:
        tfdpbnn.cli.main(sys.argv[2:])
    except SystemExit as exit:
        assert exit.code == 0, exit.code
    heavy = sorted(m for m in ("tensorflow", "dp_accounting", "scipy", "matplotlib") if m in sys.modules)
    print("HEAVY", heavy, "SECONDS", time.perf_counter() - start)
""")


@pytest.mark.parametrize("argv", [["--help"], ["privacy", "--help"], ["reproduce", "--help"]])
def test_help_imports_no_tensorflow_and_is_fast(argv):
    out = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT / "tfdpbnn"), *argv], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "usage: tfdpbnn" in out and "HEAVY [] " in out, out
    assert float(out.rsplit("SECONDS", 1)[1]) < 1.0  # measured ~0.1 s on the 2-core CI machine


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    assert exit.value.code == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in cli.COMMANDS)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"]  # set (default "3") before TensorFlow is imported by a command


def test_missing_tfds_data_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tfds_loaders, "_offline_reason", lambda: "cannot resolve storage.googleapis.com")
    start = time.perf_counter()
    code = cli.main(["train", "--method", "dpsgd", "--dataset", "mnist", "--epsilon", "1",
                     "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and time.perf_counter() - start < 30
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfdpbnn train: error: mnist is not prepared"), err
    assert "download_and_prepare()" in lines[0] and str(tmp_path / "mnist") in lines[0]


def test_load_tfds_without_download_names_the_fix(tmp_path):
    with pytest.raises(DatasetNotAvailableError, match=r"fashion_mnist is not prepared in data_dir.*"
                                                       r"download_and_prepare\(\)"):
        load_tfds("fashion_mnist", data_dir=str(tmp_path), download=False)


def test_console_entry_point_help_imports_no_tensorflow():
    """The installed ``tfdpbnn`` command (``tfdpbnn_cli:main``) answers --help without TensorFlow."""
    import subprocess
    import sys

    code = ("import sys, tfdpbnn_cli\n"
            "try:\n    tfdpbnn_cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'tensorflow' not in sys.modules and 'tfdpbnn' not in sys.modules, sorted(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "privacy" in done.stdout and "audit" in done.stdout
