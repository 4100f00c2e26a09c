"""The console command's first contact: fast --help, one-line errors for missing data, quiet TF logs."""

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import tfdpbnn.data.tfds_loaders as tfds_loaders
from tfdpbnn import cli
from tfdpbnn.data import DatasetNotAvailableError, load_tfds

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The Keras 3 set (Python >= 3.12) installs the test extra without tensorflow-datasets (setup.cfg).
needs_tfds = pytest.mark.skipif(importlib.util.find_spec("tensorflow_datasets") is None,
                                reason="tensorflow-datasets (the tfds extra) is not installed: the Keras 3 "
                                       "set's test extra leaves it out")

# The installed ``tfdpbnn`` command (``tfdpbnn_cli:main``) in a fresh interpreter: which heavy modules a
# ``--help`` imported. Not timed (the machine's load decides that); importing none of them is what keeps it
# under a second (measured 0.03-0.06 s per subcommand against 5-6 s when it imported TensorFlow).
_PROBE = textwrap.dedent("""
    import sys, tfdpbnn_cli
    try:
        tfdpbnn_cli.main(sys.argv[1:])
    except SystemExit as exit:
        assert exit.code in (0, None), exit.code
    heavy = sorted(m for m in ("tfdpbnn", "tensorflow", "numpy", "dp_accounting", "scipy", "matplotlib")
                   if m in sys.modules)
    print("HEAVY", heavy)
""")


@pytest.mark.parametrize("command", ["", "privacy", "reproduce", "train", "audit"])
def test_help_imports_no_tensorflow_and_is_plain_text(command):
    argv = [command, "--help"] if command else ["--help"]
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60,
                         check=True, cwd=ROOT).stdout
    assert out.rstrip().endswith("HEAVY []"), out
    assert "usage:" in out and "--help" in out, out
    assert "`" not in out and ":func:" not in out and ":class:" not in out, out   # no reST markup


def test_plain_text_removes_rest_markup():
    assert cli.plain_text("``x`` and :func:`tfdpbnn.mc_predict` or `tfdpbnn train`") == (
        "x and tfdpbnn.mc_predict or 'tfdpbnn train'")


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["--help"])
    assert exit.value.code == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in cli.COMMANDS)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"]  # set (default "3") before TensorFlow is imported by a command


@needs_tfds
def test_missing_tfds_data_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tfds_loaders, "_offline_reason", lambda: "cannot resolve storage.googleapis.com")
    import tensorflow_datasets as tfds

    downloads, load = [], tfds.load

    def recording_load(*args, **kwargs):   # the download flag of every tfds.load call
        downloads.append(kwargs.get("download"))
        return load(*args, **kwargs)

    monkeypatch.setattr(tfds, "load", recording_load)
    code = cli.main(["train", "--method", "dpsgd", "--dataset", "mnist", "--epsilon", "1",
                     "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    # Offline is known before any download is tried (TFDS's downloader retries for minutes): one look for
    # prepared data, never a download (what was a wall-clock bound of 30 s, which the machine's load decides).
    assert code == 2 and downloads == [False]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfdpbnn train: error: mnist is not prepared"), err
    assert "download_and_prepare()" in lines[0] and str(tmp_path / "mnist") in lines[0]


@needs_tfds
def test_load_tfds_without_download_names_the_fix(tmp_path):
    with pytest.raises(DatasetNotAvailableError, match=r"fashion_mnist is not prepared in data_dir.*"
                                                       r"download_and_prepare\(\)"):
        load_tfds("fashion_mnist", data_dir=str(tmp_path), download=False)


def test_missing_tfds_extra_is_an_import_error_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)   # as if not installed
    with pytest.raises(ImportError, match=r"needs tensorflow-datasets.*pip install 'tfdpbnn\[tfds\]'"):
        load_tfds("mnist", data_dir=str(tmp_path))
    code = cli.main(["train", "--method", "dpsgd", "--dataset", "mnist", "--epsilon", "1",
                     "--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "tfdpbnn[tfds]" in lines[0], lines

