"""The exported MC signature serves calibrated probabilities and prediction sets; privacy.json: the cost."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfdpbnn.export import export_saved_model
from tfdpbnn.layers import MCDropout
from tfdpbnn.uncertainty import conformal_threshold, fit_temperature_private, scale_probabilities

RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 4)).astype("float32")


def test_calibration_is_served_and_its_cost_recorded(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((4,)), MCDropout(0.3), tf.keras.layers.Dense(3)])
    held_out = RNG.normal(size=(200, 4)).astype("float32")
    probs = tf.nn.softmax(model(held_out)).numpy()
    labels = RNG.integers(0, 3, size=200)
    temperature = fit_temperature_private(probs, labels, epsilon=0.5, delta=1e-5, seed=0)
    sets = conformal_threshold(temperature.apply(probs), labels, alpha=0.2)
    path = export_saved_model(model, str(tmp_path / "m"), privacy={"epsilon": 1.0, "delta": 1e-5},
                              calibration=temperature, prediction_sets=sets)
    out = tf.saved_model.load(path).signatures["mc_predict"](x=tf.constant(X), num_samples=tf.constant(4))
    mean = out["mean"].numpy()
    calibrated = out["calibrated_mean"].numpy()
    np.testing.assert_allclose(calibrated, scale_probabilities(mean, temperature.temperature), rtol=1e-6)
    np.testing.assert_array_equal(out["prediction_set"].numpy(), 1.0 - calibrated <= sets.threshold)
    with open(os.path.join(path, "assets", "privacy.json")) as fh:
        privacy = json.load(fh)
    assert privacy["epsilon"] == 1.0  # the training statement is kept
    spent = privacy["calibration"][0]
    assert spent["temperature"] == pytest.approx(temperature.temperature)
    assert spent["privacy"]["epsilon"] == pytest.approx(temperature.privacy.epsilon) and spent["privacy"][
        "epsilon"] > 0.4
    assert spent["privacy"]["dp_event"]["name"] == "SelfComposedDpEvent"
    assert privacy["calibration"][1]["privacy"]["epsilon"] == 0.0  # public threshold: no cost
    with open(os.path.join(path, "assets", "mc_predict.json")) as fh:
        assert json.load(fh)["temperature"] == pytest.approx(temperature.temperature)
    # a model nothing is known of: privacy.json lists what calibration spent and claims no epsilon for the
    # weights (the calibration's is not theirs)
    bare = export_saved_model(model, str(tmp_path / "bare"), calibration=temperature)
    with open(os.path.join(bare, "assets", "privacy.json")) as fh:
        bare_privacy = json.load(fh)
    assert bare_privacy["guarantee"] is False and bare_privacy["epsilon_is_infinite"] is True
    assert "no privacy record was found" in bare_privacy["no_record"]
    assert bare_privacy["calibration"][0]["privacy"]["epsilon"] == pytest.approx(temperature.privacy.epsilon)
    with pytest.raises(ValueError, match="calibration must be None or a TemperatureScaling"):
        export_saved_model(model, str(tmp_path / "bad"), calibration=1.5)


def test_private_calibration_is_composed_into_the_trained_models_epsilon(tmp_path):
    # A DP-trained model, then a private temperature and a private threshold on held-out private data: the
    # export's statement composes both with training (RDP, the optimizer's accountant), checked against an
    # independent dp-accounting composition; training_epsilon keeps the training alone.
    import dp_accounting

    import tfdpbnn
    from tfdpbnn.uncertainty import private_conformal_threshold

    x = RNG.normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 2.0, num_examples=64, batch_size=16, delta=1e-5)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    held = RNG.normal(size=(300, 4)).astype("float32")
    held_y = (held[:, 0] > 0).astype("int64")
    probs = tf.nn.softmax(model(held)).numpy()
    # A private release the optimizer has not recorded: the export cannot name the records it read (it was
    # charged to the training records; the held-out ones it read went uncharged in the per-record ledger).
    unrecorded = fit_temperature_private(probs, held_y, epsilon=0.5, delta=1e-5)
    with pytest.raises(ValueError, match=r"^calibration: a private release \(TemperatureScaling, epsilon "
                                         r"[0-9.]+\) that the model's DP optimizer has not recorded"):
        export_saved_model(model, str(tmp_path / "unrecorded"), calibration=unrecorded)
    assert not (tmp_path / "unrecorded").exists() and optimizer.privacy_statement().get("releases") is None
    recorded = {"optimizer": optimizer, "x": held, "y": held_y}   # reserved, then recorded with its records
    temperature = fit_temperature_private(probs, held_y, epsilon=0.5, delta=1e-5, **recorded)  # secret noise
    sets = private_conformal_threshold(temperature.apply(probs), held_y, 0.1, epsilon=0.5, delta=1e-5,
                                       allow_uninformative=True,  # 300 < 1226: the accounting is tested here
                                       **recorded)
    path = export_saved_model(model, str(tmp_path / "m"), calibration=temperature, prediction_sets=sets)
    with open(os.path.join(path, "assets", "privacy.json")) as fh:
        privacy = json.load(fh)
    training = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 2)  # 2 passes, shuffle
    alone = dp_accounting.rdp.RdpAccountant().compose(training).get_epsilon(1e-5)
    total = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent(
        [training, temperature.privacy.dp_event, sets.privacy.dp_event])).get_epsilon(1e-5)
    assert privacy["training_epsilon"] == pytest.approx(alone, rel=1e-3)
    assert privacy["epsilon"] == pytest.approx(total, rel=1e-3)
    assert privacy["epsilon"] > privacy["training_epsilon"] + 0.1
    assert [r["privacy"]["epsilon"] for r in privacy["releases"]] == pytest.approx(
        [temperature.privacy.epsilon, sets.privacy.epsilon])
    assert optimizer.privacy_statement()["epsilon"] == pytest.approx(total, rel=1e-3)  # recorded on it too
    with pytest.raises(ValueError, match="release"):
        optimizer.record_release(0.5)
