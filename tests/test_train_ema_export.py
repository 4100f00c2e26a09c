"""``tfdpbnn train --ema``: the average changes the model, not epsilon; the SavedModel reads raw inputs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from _tiers import slow_on_keras2

import tfdpbnn
from tfdpbnn import cli


def _train(tmp_path, name, extra):
    key = tmp_path / "sampling-key"
    key.write_text("0000000000001eef\n")  # a fixed test key (the model's own randomness)
    out = str(tmp_path / name)
    assert cli.main(["train", "--method", "dpsgd", "--dataset", "digits", "--epsilon", "2", "--epochs", "2",
                     "--batch-size", "480", "--hidden", "8", "--verbose", "0", "--secret-key-file", str(key),
                     "--out", out] + extra) == 0
    with open(os.path.join(out, "summary.json")) as fh:
        return out, json.load(fh)


@slow_on_keras2   # a CLI training run with export; export round trips: tests/test_export.py
def test_ema_is_post_processing_and_the_export_takes_raw_inputs(tmp_path, capsys):
    _, last = _train(tmp_path, "last", [])
    out, ema = _train(tmp_path, "ema", ["--ema", "0.5"])
    assert "EMA of the iterates (decay 0.5)" in capsys.readouterr().out
    # the same plan (steps, noise): the statement is unchanged by the average
    assert ema["epsilon"] == pytest.approx(last["epsilon"], rel=1e-12)
    assert ema["epsilon_by_accountant"] == pytest.approx(last["epsilon_by_accountant"], rel=1e-12)
    assert ema["steps"] == last["steps"] == 6 and ema["noise_multiplier"] == last["noise_multiplier"]
    # the exported model, fed DIGITS as load_digits returns them (not centred), gives the printed accuracy
    _, (x_test, y_test) = tfdpbnn.data.load_digits(seed=0)
    served = tf.saved_model.load(os.path.join(out, "saved_model")).signatures
    logits = served["serving_default"](x=tf.constant(x_test, tf.float32))["output"].numpy()
    assert np.mean(logits.argmax(1) == y_test) == pytest.approx(ema["test_accuracy"], abs=1.5 / len(y_test))
    mean = served["mc_predict"](x=tf.constant(x_test, tf.float32), num_samples=tf.constant(1))["mean"].numpy()
    assert np.mean(mean.argmax(1) == y_test) == pytest.approx(ema["test_accuracy"], abs=1.5 / len(y_test))
    with open(os.path.join(out, "saved_model", "assets", "mc_predict.json")) as fh:
        assert json.load(fh)["input_transform"]["offset"] == pytest.approx(-0.5)


def test_bad_ema_is_refused(tmp_path, capsys):
    code = cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--ema", "1.0", "--out", str(tmp_path)])
    assert code == 2 and "--ema" in capsys.readouterr().err
