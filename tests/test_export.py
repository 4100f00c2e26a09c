"""SavedModel export: serving_default and mc_predict signatures, Keras reload, privacy.json hook."""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32

import tfdpbnn.layers as L
from tfdpbnn import _keras_version
from tfdpbnn.export import export_saved_model
from tfdpbnn.uncertainty import HeteroscedasticGaussianNLL, HeteroscedasticHead, mc_predict

RNG = np.random.default_rng(0)
PUB = RNG.normal(size=(6, 6, 6, 1)).astype("float32")
X = RNG.normal(size=(5, 6, 6, 1)).astype("float32")
MC = 300  # samples per MC estimate below
# Keras 3 has no legacy optimizers; the Keras 2 path keeps the legacy SGD these tests were written with.
SGD = tf.keras.optimizers.legacy.SGD if _keras_version.KERAS_MAJOR == 2 else tf.keras.optimizers.SGD


class PrivateStatementSGD(SGD):
    """Stand-in for a DP optimizer: exposes privacy_statement() like tfdpbnn's DP optimizers."""

    def privacy_statement(self):
        return {"epsilon": 1.25, "delta": 1e-5, "accountant": "rdp"}


def _all_layers_model():
    inp = tf.keras.Input((6, 6, 1))
    h = L.AppendPublicBatch(public_batch=PUB)(inp)
    h = L.PublicBatchNormalization(public_batch=PUB)(h)          # stored mode
    h = L.Conv2DVariational(3, 3, num_examples=100)(h)
    h = L.PublicBatchNormalization(num_public=6, carried=True)(h)  # carried mode
    h = L.NoisyConv2D(2, 2, noise_stddev=0.1)(h)
    h = tf.keras.layers.Flatten()(h)
    h = L.MCDropout(0.2)(h)
    h = L.DenseBayesByBackprop(8, num_examples=100, activation="relu")(h)
    h = L.MCDropout(0.1, gaussian=True)(h)
    h = L.DenseVariational(6, num_examples=100, activation="relu",
                           log_sigma2_initializer=tf.keras.initializers.Constant(-3.0))(h)
    h = L.NoisyDense(3, noise_stddev=0.1)(h)
    out = tf.keras.layers.Softmax()(L.DropPublicBatch(6)(h))
    return tf.keras.Model(inp, out)


def test_export_round_trip_all_layers(tmp_path):
    tf.random.set_seed(0)
    model = _all_layers_model()
    model.compile(PrivateStatementSGD(0.01), "sparse_categorical_crossentropy")
    model.fit(X, np.array([0, 1, 2, 0, 1]), epochs=1, verbose=0)
    path = export_saved_model(model, str(tmp_path / "m"), num_samples=7)
    det = model(X).numpy()
    ref = mc_predict(model, X, num_samples=MC)

    # privacy statement from the optimizer hook, and the MC defaults
    with open(os.path.join(path, "assets", "privacy.json")) as fh:
        assert json.load(fh) == {"accountant": "rdp", "delta": 1e-5, "epsilon": 1.25, "format_version": 1}
    with open(os.path.join(path, "assets", "mc_predict.json")) as fh:
        assert json.load(fh)["default_num_samples"] == 7

    # as a serving process would: tf.saved_model.load and the signatures
    served = tf.saved_model.load(path)
    assert set(served.signatures) == {"serving_default", "mc_predict"}
    out1 = served.signatures["serving_default"](x=tf.constant(X))["output"].numpy()
    out2 = served.signatures["serving_default"](x=tf.constant(X))["output"].numpy()
    np.testing.assert_allclose(out1, out2, **F32)
    # identical to the model's own graph; eager op order may differ in the last bit
    graph_out = tf.function(lambda x: model(x, training=False))(tf.constant(X)).numpy()
    np.testing.assert_allclose(out1, graph_out, **F32)
    np.testing.assert_allclose(out1, det, rtol=1e-5, atol=1e-6)
    mc_fn = served.signatures["mc_predict"]
    a = mc_fn(x=tf.constant(X), num_samples=tf.constant(MC))
    b = mc_fn(x=tf.constant(X), num_samples=tf.constant(2))
    assert set(a) == {"mean", "predictive_entropy", "mutual_information", "expected_entropy"}
    assert not np.allclose(a["mean"].numpy(), b["mean"].numpy())  # sampling is on in the signature
    # matching moments: independent MC estimates of the same predictive mean; tolerance 0.05 (each entry's
    # std over samples is below 0.3 here, so the difference of two 300-sample means has s.e. below 0.025).
    # Entropies vary more per sample (up to log 3 = 1.1; std below 0.6, s.e. of the difference below 0.05):
    # tolerance 0.15 (3 s.e.). The draw order inside the graph while_loop is not fixed, so no seed pins it.
    np.testing.assert_allclose(a["mean"].numpy(), ref.mean, atol=0.05)
    np.testing.assert_allclose(a["expected_entropy"].numpy(), ref.expected_entropy, atol=0.15)
    np.testing.assert_allclose(a["mutual_information"].numpy(), ref.mutual_information, atol=0.15)
    assert np.all(a["mutual_information"].numpy() > 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_samples"):
        mc_fn(x=tf.constant(X), num_samples=tf.constant(0))

    # Keras reload (same files as model.save): identical deterministic outputs, MC through python. Keras 2
    # only: Keras 3's load_model reads no SavedModel (the .keras round trip below covers it there).
    if _keras_version.KERAS_MAJOR == 2:
        reloaded = tf.keras.models.load_model(path)
        np.testing.assert_allclose(reloaded(X).numpy(), det, **F32)
        np.testing.assert_allclose(mc_predict(reloaded, X, num_samples=MC).mean, ref.mean, atol=0.05)
        noisy = [layer for layer in reloaded.layers if isinstance(layer, L.NoisyDense)][0]
        assert noisy.noise_stddev.numpy() == pytest.approx(0.1)

    # plain model.save, Keras v3 format, keeps working for every layer
    keras_path = str(tmp_path / "m.keras")
    model.save(keras_path)
    reloaded = tf.keras.models.load_model(keras_path,
                                          custom_objects={"PrivateStatementSGD": PrivateStatementSGD})
    np.testing.assert_allclose(reloaded(X).numpy(), det, **F32)


def test_export_regression_with_explicit_privacy(tmp_path):
    tf.random.set_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((4,)),
                                 L.DenseBayesByBackprop(8, num_examples=50, activation="tanh",
                                                        kernel_rho_initializer=tf.keras.initializers.Constant(-1.0)),
                                 HeteroscedasticHead(2)])
    model.compile("sgd", HeteroscedasticGaussianNLL())
    x = RNG.normal(size=(5, 4)).astype("float32")
    path = export_saved_model(model, str(tmp_path / "r"), task="regression",
                              privacy={"epsilon": 3.0, "method": "DP-BBP"})
    with open(os.path.join(path, "assets", "privacy.json")) as fh:
        assert json.load(fh) == {"epsilon": 3.0, "method": "DP-BBP", "format_version": 1}
    served = tf.saved_model.load(path)
    np.testing.assert_allclose(served.signatures["serving_default"](x=tf.constant(x))["output"].numpy(),
                               model(x).numpy(), rtol=1e-5, atol=1e-6)
    out = served.signatures["mc_predict"](x=tf.constant(x), num_samples=tf.constant(MC))
    assert set(out) == {"mean", "epistemic_variance", "aleatoric_variance", "variance"}
    ref = mc_predict(model, x, num_samples=MC, task="regression")
    assert out["mean"].shape == (5, 2) and np.all(out["epistemic_variance"].numpy() > 0)
    np.testing.assert_allclose(out["mean"].numpy(), ref.mean, atol=0.1)
    np.testing.assert_allclose(out["aleatoric_variance"].numpy(), ref.aleatoric_variance, rtol=0.2)
    np.testing.assert_allclose(out["epistemic_variance"].numpy(), ref.epistemic_variance, rtol=0.4)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_samples": 0}, "num_samples"),
    ({"privacy": [("epsilon", 1.0)]}, "privacy must be a dict"),
    ({"privacy": {"epsilon": object()}}, "JSON"),
    ({"task": "ranking"}, "task"),
])
def test_export_bad_arguments(tmp_path, kwargs, match):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, activation="softmax")])
    with pytest.raises(ValueError, match=match):
        export_saved_model(model, str(tmp_path / "bad"), **kwargs)
    assert not os.path.exists(tmp_path / "bad")


def test_export_of_a_logits_model_serves_finite_entropies(tmp_path):
    tf.random.set_seed(2)
    model = tf.keras.Sequential([tf.keras.Input((6, 6, 1)), tf.keras.layers.Flatten(), L.MCDropout(0.3),
                                 tf.keras.layers.Dense(3)])  # linear output: logits
    path = export_saved_model(model, str(tmp_path / "logits"))  # from_logits read from the activation
    with open(os.path.join(path, "assets", "mc_predict.json")) as fh:
        assert json.load(fh)["from_logits"] is True
    out = tf.saved_model.load(path).signatures["mc_predict"](x=tf.constant(X), num_samples=tf.constant(MC))
    for key in ("predictive_entropy", "mutual_information", "expected_entropy"):
        assert np.all(np.isfinite(out[key].numpy())) and np.all(out[key].numpy() >= 0)
    np.testing.assert_allclose(out["mean"].numpy().sum(-1), 1.0, atol=1e-6)
    ref = mc_predict(model, X, num_samples=MC)
    np.testing.assert_allclose(out["mean"].numpy(), ref.mean, atol=0.05)  # as in the round-trip test
    with pytest.raises(ValueError, match="from_logits=False contradicts"):
        export_saved_model(model, str(tmp_path / "bad"), from_logits=False)


def _no_constants(token):
    raise ValueError(f"not strict JSON: {token}")


def test_privacy_json_is_strict_json_at_noise_zero(tmp_path):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, activation="softmax")])
    statement = {"epsilon": float("inf"), "delta": 1e-5, "noise_multiplier": 0.0,
                 "epsilon_by_accountant": {"rdp": math.inf, "pld": math.inf}, "curve": [1.0, math.inf]}
    path = export_saved_model(model, str(tmp_path / "m"), privacy=statement)
    with open(os.path.join(path, "assets", "privacy.json")) as fh:
        loaded = json.loads(fh.read(), parse_constant=_no_constants)  # Infinity / NaN would raise
    assert loaded["epsilon"] is None and loaded["epsilon_is_infinite"] is True
    assert loaded["epsilon_by_accountant"] == {"rdp": None, "rdp_is_infinite": True,
                                               "pld": None, "pld_is_infinite": True}
    assert loaded["curve"] == [1.0, "inf"] and loaded["delta"] == pytest.approx(1e-5)
    with pytest.raises(ValueError, match="NaN"):
        export_saved_model(model, str(tmp_path / "nan"), privacy={"epsilon": float("nan")})
    with L.mc_sampling(), pytest.raises(ValueError, match="outside"):
        export_saved_model(model, str(tmp_path / "inside"))


def test_export_applies_the_training_input_transform_in_every_signature(tmp_path):
    # A model trained on centred inputs x - 0.5 (what `tfdpbnn train` does): exported with input_offset=-0.5,
    # every signature fed RAW inputs gives what the model gives on centred ones, and so the training-time
    # accuracy; without it the raw inputs are silently misread (the accuracy drops).
    from tfdpbnn.uncertainty import conformal_threshold, fit_temperature

    rng = np.random.default_rng(5)
    raw = rng.uniform(0, 1, size=(400, 4)).astype("float32")
    labels = (raw[:, 0] > 0.5).astype("int64")
    tf.random.set_seed(5)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2, use_bias=False)])
    model.compile(SGD(1.0),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(raw - 0.5, labels, epochs=30, batch_size=50, verbose=0)  # no bias: centring matters
    probs = tf.nn.softmax(model(raw - 0.5)).numpy()
    accuracy = np.mean(probs.argmax(1) == labels)
    assert accuracy > 0.9
    temperature = fit_temperature(probs, labels)
    sets = conformal_threshold(temperature.apply(probs), labels, 0.1)
    path = export_saved_model(model, str(tmp_path / "t"), input_offset=-0.5, calibration=temperature,
                              prediction_sets=sets)
    served = tf.saved_model.load(path).signatures
    out = served["serving_default"](x=tf.constant(raw))["output"].numpy()
    np.testing.assert_allclose(out, model(raw - 0.5).numpy(), **F32)
    mc = served["mc_predict"](x=tf.constant(raw), num_samples=tf.constant(1))
    assert np.mean(mc["mean"].numpy().argmax(1) == labels) == pytest.approx(accuracy, abs=1e-9)
    np.testing.assert_allclose(mc["calibrated_mean"].numpy(), temperature.apply(probs), rtol=1e-4, atol=1e-5)
    calibrated = temperature.apply(probs)
    clear = np.abs(1.0 - calibrated - sets.threshold) > 1e-5  # float32 graph vs float64: ties at q may flip
    np.testing.assert_array_equal(mc["prediction_set"].numpy()[clear], sets.predict_sets(calibrated)[clear])
    with open(os.path.join(path, "assets", "mc_predict.json")) as fh:
        assert json.load(fh)["input_transform"]["offset"] == pytest.approx(-0.5)
    bare = export_saved_model(model, str(tmp_path / "bare"))
    misread = tf.saved_model.load(bare).signatures["serving_default"](x=tf.constant(raw))["output"].numpy()
    assert np.mean(misread.argmax(1) == labels) < accuracy - 0.1
    for kwargs, match in [({"input_offset": [0.0, 1.0, 2.0]}, "broadcast"), ({"input_scale": 0.0}, "nonzero"),
                          ({"input_offset": float("nan")}, "finite"), ({"input_scale": "a"}, "input_scale")]:
        with pytest.raises(ValueError, match=match):
            export_saved_model(model, str(tmp_path / "bad"), **kwargs)
