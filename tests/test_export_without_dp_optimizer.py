"""``export_saved_model`` of a model without a tfdpbnn DP optimizer writes an honest privacy.json.

A DP-trained model loaded with ``load_model(compile=False)`` or compiled again with ``"adam"``: the
statement a DP optimizer gives for its weights (the record store's record), composed with a private
calibration; weights nothing is known of: a statement that no record was found (no epsilon claimed); the
CLI and the serving example read both.
Epsilons are compared (rel. 1%) with independent dp-accounting computations (64 records, sigma 1, shuffled
batches of 8: each pass is one Gaussian mechanism per record).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, rdp_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn import cli
from tfdpbnn.uncertainty import fit_temperature_private


def _dp_trained_and_saved(tmp_path, epochs=2):
    """A D -> 3 model DP-trained ``epochs`` passes (sigma 1), saved as .keras; returns it and the path."""
    x, y = small_data()
    model = small_model()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
    path = str(tmp_path / "trained.keras")
    model.save(path)
    return model, path


def _serve_example():
    """examples/serve_savedmodel.py, which reads privacy.json without tfdpbnn."""
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "serve_savedmodel.py"
    spec = importlib.util.spec_from_file_location("serve_savedmodel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _privacy(path):
    with open(os.path.join(path, "assets", "privacy.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _cli(path, capsys):
    code = cli.main(["privacy", "--statement", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_loaded_or_recompiled_model_exports_the_record_of_its_weights(tmp_path, capsys):
    _, saved = _dp_trained_and_saved(tmp_path)
    truth = gaussians_epsilon(1.0, 2)   # two passes: 7.08 at delta 1e-5
    for how in ("compile=False", "adam"):
        loaded = tf.keras.models.load_model(saved, compile=False)
        if how == "adam":
            loaded.compile(optimizer="adam", loss=LOSS)
        path = tfdpbnn.export_saved_model(loaded, str(tmp_path / how), num_samples=2, delta=DELTA)
        privacy = _privacy(path)
        assert privacy["epsilon"] == pytest.approx(truth, rel=0.01), how
        assert privacy["quote"]["epsilon"] == pytest.approx(truth, rel=0.01)
        assert privacy["ledger_bound"]["epsilon"] == pytest.approx(truth, rel=0.01)
        assert privacy["ledger_bound"]["records"] == N
        assert privacy["weights"]["steps"] == 16 and privacy["guarantee"] is True
        assert privacy["optimizer"] is None and privacy["noise_multiplier"] is None   # no optimizer to name
        assert [p["noise_multiplier"] for p in privacy["phases"]] == [1.0]
        code, out, err = _cli(path, capsys)
        assert code == 0, err
        assert f"quote: ledger_bound = {truth:.4g}" in out
        served = _serve_example()
        assert f"epsilon {truth:.4f} at delta 1e-05" in served.describe_privacy(served.read_privacy(path))
    # No delta is known without a DP optimizer: refused by name before anything is written.
    loaded = tf.keras.models.load_model(saved, compile=False)
    with pytest.raises(ValueError, match=r"^delta: the model has no optimizer.*16 DP steps.*pass delta="):
        tfdpbnn.export_saved_model(loaded, str(tmp_path / "no_delta"), num_samples=2)
    assert not (tmp_path / "no_delta").exists()


def test_private_calibration_is_composed_with_the_record_not_stated_alone(tmp_path, capsys):
    _, saved = _dp_trained_and_saved(tmp_path)
    loaded = tf.keras.models.load_model(saved, compile=False)
    rng = np.random.default_rng(3)
    held = rng.normal(size=(300, 4)).astype("float32")
    labels = rng.integers(0, 3, 300)
    probs = tf.nn.softmax(loaded(held)).numpy()
    # Recorded nowhere: the export has no DP optimizer to record it on and cannot name the held-out records
    # it read (it was charged to the weights' training records; the 300 it read went uncharged).
    unrecorded = fit_temperature_private(probs, labels, epsilon=1.0, delta=DELTA)
    with pytest.raises(ValueError, match=r"^calibration: a private release .* for a model without a DP "
                                         r"optimizer to record it on: .*Compile the model with a DP "):
        tfdpbnn.export_saved_model(loaded, str(tmp_path / "unrecorded"), num_samples=2,
                                   calibration=unrecorded, delta=DELTA)
    assert not (tmp_path / "unrecorded").exists()
    # A DP optimizer compiled on the loaded weights takes their record; the fit reserves its release there,
    # charged to the records it read.
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    loaded.compile(optimizer=optimizer, loss=LOSS)
    temperature = fit_temperature_private(probs, labels, epsilon=1.0, delta=DELTA, optimizer=optimizer,
                                          x=held, y=labels)
    path = tfdpbnn.export_saved_model(loaded, str(tmp_path / "m"), num_samples=2, calibration=temperature,
                                      delta=DELTA)
    privacy = _privacy(path)
    training = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 2)
    total = rdp_epsilon(dp_accounting.ComposedDpEvent([training, temperature.privacy.dp_event]))
    assert privacy["training_epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)
    assert privacy["epsilon"] == pytest.approx(total, rel=0.01)
    assert privacy["epsilon"] > temperature.privacy.epsilon + 4.0   # not the calibration's 1.0 alone
    assert privacy["quote"]["epsilon"] >= privacy["epsilon"] * (1 - 1e-9)
    assert privacy["calibration"][0]["privacy"]["epsilon"] == pytest.approx(temperature.privacy.epsilon)
    code, out, err = _cli(path, capsys)
    assert code == 0, err
    assert f"run epsilon:  {privacy['epsilon']:.4g}" in out and "earlier tfdpbnn" not in out + err
    charged = tfdpbnn.record.record_ledger.default_ledger().max_epsilon(
        tfdpbnn.record.records.content_keys(held), DELTA)
    assert charged == pytest.approx(rdp_epsilon(temperature.privacy.dp_event), rel=0.01)


def test_weights_nothing_is_known_of_export_no_record_and_no_epsilon(tmp_path, capsys, monkeypatch):
    # Never DP-trained, with a private calibration: the calibration's epsilon is not the model's.
    model = small_model(seed=4)
    model.compile(optimizer="adam", loss=LOSS)
    rng = np.random.default_rng(5)
    held = rng.normal(size=(300, 4)).astype("float32")
    temperature = fit_temperature_private(tf.nn.softmax(model(held)).numpy(), rng.integers(0, 3, 300),
                                          epsilon=1.0, delta=DELTA)
    path = tfdpbnn.export_saved_model(model, str(tmp_path / "fresh"), num_samples=2, calibration=temperature)
    privacy = _privacy(path)
    assert privacy["guarantee"] is False and "no privacy record was found" in privacy["no_record"]
    assert privacy["epsilon"] is None and privacy["epsilon_is_infinite"] is True
    assert privacy["quote"]["epsilon"] is None and privacy["quote"]["epsilon_is_infinite"] is True
    assert privacy["calibration"][0]["privacy"]["epsilon"] == pytest.approx(temperature.privacy.epsilon)
    assert math.isinf(tfdpbnn.read_privacy(path)["epsilon"] or math.inf)
    code, out, err = _cli(path, capsys)
    assert code == 0, err
    assert "no epsilon is claimed" in out and "covers the calibration alone" in out
    served = _serve_example()
    described = served.describe_privacy(served.read_privacy(path))
    assert described.startswith("no privacy guarantee: no privacy record")
    # A DP-trained model with the record store off: nothing vouches for it either.
    _, saved = _dp_trained_and_saved(tmp_path, epochs=1)
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", "off")
    loaded = tf.keras.models.load_model(saved, compile=False)
    privacy = _privacy(tfdpbnn.export_saved_model(loaded, str(tmp_path / "off"), num_samples=2))
    assert "store is off" in privacy["no_record"] and privacy["epsilon_is_infinite"] is True


def test_recompiled_model_trained_on_by_adam_states_no_guarantee(tmp_path):
    # In this process the DP optimizer that trained the model states it: Adam's writes after its last
    # DP step are covered by no epsilon (other records than the DP ones, so the fit is not refused).
    model, _ = _dp_trained_and_saved(tmp_path, epochs=1)
    model.compile(optimizer="adam", loss=LOSS)
    x, y = small_data(seed=9)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    privacy = _privacy(tfdpbnn.export_saved_model(model, str(tmp_path / "m"), num_samples=2))
    assert privacy["guarantee"] is False and "written outside the DP step" in privacy["guarantee_reason"]
    assert privacy["epsilon"] is None and privacy["epsilon_is_infinite"] is True
    assert privacy["epsilon_if_state_were_untouched"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)


def test_cli_names_a_calibration_only_file_for_what_it_is(tmp_path, capsys):
    # What an earlier tfdpbnn wrote for a model without a DP optimizer: the calibration's cost alone.
    path = tmp_path / "privacy.json"
    path.write_text(json.dumps({"format_version": 1, "calibration": [
        {"method": "temperature_scaling", "privacy": {"epsilon": 1.0, "delta": DELTA}}]}))
    code, out, err = _cli(path, capsys)
    assert code == 2 and "states no epsilon of the weights" in err and "export the model again" in err, err
    assert "no ledger_bound" not in err
