"""``assets/privacy.json`` carries a format version; readers take older files and name the fix for newer ones.

Old format: the TensorFlow 2.15 export in ``tests/fixtures`` (written before the version existed). Readers:
``tfdpbnn.read_privacy`` and the serving example (``examples/serve_savedmodel.py``, which runs without
tfdpbnn).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil

import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn.export import PRIVACY_FORMAT_KEY, PRIVACY_FORMAT_VERSION

ROOT = pathlib.Path(__file__).resolve().parents[1]
OLD = ROOT / "tests" / "fixtures" / "savedmodel_tf2.15"
OLD_RECORD = json.loads((ROOT / "tests" / "fixtures" / "savedmodel_tf2.15.json").read_text())["privacy"]


def _serve_example():
    path = ROOT / "examples" / "serve_savedmodel.py"
    spec = importlib.util.spec_from_file_location("serve_savedmodel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _export_with_version(tmp_path, version):
    """A copy of the old export's assets whose privacy.json says ``format_version: version``."""
    assets = tmp_path / "export" / "assets"
    shutil.copytree(OLD / "assets", assets)
    record = dict(OLD_RECORD, **{PRIVACY_FORMAT_KEY: version})
    (assets / "privacy.json").write_text(json.dumps(record))
    return tmp_path / "export"


def test_old_unversioned_file_reads_as_version_0_with_every_field():
    assert PRIVACY_FORMAT_KEY not in json.loads((OLD / "assets" / "privacy.json").read_text())
    record = tfdpbnn.read_privacy(OLD)
    assert record.pop(PRIVACY_FORMAT_KEY) == 0
    assert record == OLD_RECORD
    assert tfdpbnn.read_privacy(OLD / "assets" / "privacy.json")["epsilon"] == pytest.approx(
        OLD_RECORD["epsilon"], rel=1e-12)
    assert _serve_example().read_privacy(str(OLD)) == OLD_RECORD


def test_current_version_is_written_and_read(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    path = tfdpbnn.export_saved_model(model, str(tmp_path / "m"), privacy={"epsilon": 2.0})
    written = json.loads((tmp_path / "m" / "assets" / "privacy.json").read_text())
    assert written == {"epsilon": 2.0, PRIVACY_FORMAT_KEY: PRIVACY_FORMAT_VERSION}
    assert tfdpbnn.read_privacy(path) == written
    assert _serve_example().read_privacy(path) == written


@pytest.mark.parametrize("version", [PRIVACY_FORMAT_VERSION + 1, "2", 1.5, True, -1])
def test_unknown_version_names_the_fix(tmp_path, version):
    export = _export_with_version(tmp_path, version)
    with pytest.raises(ValueError, match=r"format_version .*reads versions 0 to 1.*upgrade"):
        tfdpbnn.read_privacy(export)
    with pytest.raises(SystemExit, match=r"format_version .* not one this script reads \(0, 1\)"):
        _serve_example().read_privacy(str(export))


def test_missing_record_and_reserved_key_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no privacy record"):
        tfdpbnn.read_privacy(tmp_path)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="'format_version' is reserved"):
        tfdpbnn.export_saved_model(model, str(tmp_path / "m"), privacy={"format_version": 7})
    assert not (tmp_path / "m").exists()   # refused before anything is written


def test_cli_privacy_statement_reads_an_old_record_and_names_the_fix_for_a_new_one(tmp_path, capsys):
    from tfdpbnn import cli

    assert cli.main(["privacy", "--statement", str(OLD)]) == 2   # read; too old for a ledger bound
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "written by an earlier tfdpbnn" in err[0], err
    assert cli.main(["privacy", "--statement", str(_export_with_version(tmp_path, 2))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format_version 2" in err[0] and "upgrade" in err[0], err
