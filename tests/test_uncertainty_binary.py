"""One-unit (binary) outputs are Bernoulli everywhere: mc_predict, ECE/MCE, metrics, export; no retracing."""

import numpy as np
import pytest
import tensorflow as tf

from tfdpbnn.export import export_saved_model
from tfdpbnn.layers import MCDropout
from tfdpbnn.uncertainty import (
    ExpectedCalibrationError,
    MaximumCalibrationError,
    expected_calibration_error,
    maximum_calibration_error,
    mc_predict,
    reliability_diagram,
)
from tfdpbnn.uncertainty.mc import traced_function

RNG = np.random.default_rng(0)
X = RNG.normal(size=(9, 4)).astype("float32")


def _bernoulli_entropy(p):
    return -(p * np.log(p) + (1 - p) * np.log(1 - p))


def _binary(activation=None, stochastic=False):
    layers = [tf.keras.Input((4,))]
    if stochastic:
        layers.append(MCDropout(0.5))
    layers.append(tf.keras.layers.Dense(1, activation=activation))
    return tf.keras.Sequential(layers)


def test_one_logit_is_a_bernoulli_not_a_softmax():
    model = _binary()
    logits = model(X).numpy()[:, 0].astype(np.float64)
    p = 1.0 / (1.0 + np.exp(-logits))  # hand-computed sigmoid
    with pytest.warns(UserWarning, match="no tfdpbnn stochastic layer"):
        res = mc_predict(model, X, num_samples=2)  # linear output: logits
    assert res.mean.shape == (9, 2)
    np.testing.assert_allclose(res.mean, np.stack([1 - p, p], 1), rtol=1e-5)
    np.testing.assert_allclose(res.predictive_entropy, _bernoulli_entropy(p), rtol=1e-5)
    np.testing.assert_allclose(res.mutual_information, 0.0, atol=1e-12)
    # a sigmoid output is read as the probability of label 1
    sig = _binary("sigmoid")
    sig.set_weights(model.get_weights())
    np.testing.assert_allclose(mc_predict(sig, X, num_samples=1).mean, res.mean, rtol=1e-5)
    with pytest.raises(ValueError, match="from_logits=True contradicts"):
        mc_predict(sig, X, num_samples=1, from_logits=True)


def test_binary_mutual_information_from_snapshots_by_hand():
    model = _binary()
    snaps = [[w + RNG.normal(scale=1.0, size=w.shape).astype("float32") for w in model.get_weights()]
             for _ in range(2)]
    q = []
    for snap in snaps:
        model.set_weights(snap)
        q.append(1.0 / (1.0 + np.exp(-model(X).numpy()[:, 0].astype(np.float64))))
    q = np.stack(q)
    res = mc_predict(model, X, weight_snapshots=snaps)
    mean = q.mean(0)
    np.testing.assert_allclose(res.mean[:, 1], mean, rtol=1e-5)
    np.testing.assert_allclose(res.expected_entropy, _bernoulli_entropy(q).mean(0), rtol=1e-5)
    np.testing.assert_allclose(res.mutual_information,
                               _bernoulli_entropy(mean) - _bernoulli_entropy(q).mean(0), atol=1e-6)
    assert np.all(res.mutual_information > 0)


def test_refused_output_layers():
    one_softmax = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="softmax")])
    with pytest.raises(ValueError, match="softmax over one output unit"):
        mc_predict(one_softmax, X, num_samples=1)
    multilabel = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation="sigmoid")])
    with pytest.raises(ValueError, match="sigmoid over 3 output units"):
        mc_predict(multilabel, X, num_samples=1)
    relu = _binary("relu")
    relu.set_weights([np.ones((4, 1), "float32"), np.full((1,), 2.0, "float32")])  # outputs above 1
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"probability in \[0, 1\]"):
        mc_predict(relu, X + 5.0, num_samples=1, from_logits=False)


def test_binary_ece_mce_hand_computed():
    p = np.array([[0.9], [0.2], [0.6], [0.45]])  # probability of label 1
    labels = np.array([1, 1, 0, 0])
    # Bernoulli confidences .9 (pred 1, right), .8 (pred 0, wrong), .6 (pred 1, wrong), .55 (pred 0, right)
    # 2 bins: all four in (.5, 1]: accuracy .5, confidence .7125
    assert expected_calibration_error(p, labels, num_bins=2) == pytest.approx(0.2125)
    # 10 bins: (.5,.6] holds .6 and .55 (acc .5, conf .575); .8 alone (gap .8); .9 alone (gap .1)
    assert expected_calibration_error(p, labels, num_bins=10) == pytest.approx((2 * 0.075 + 0.8 + 0.1) / 4)
    assert maximum_calibration_error(p, labels, num_bins=10) == pytest.approx(0.8)
    assert expected_calibration_error(np.hstack([1 - p, p]), labels, 10) == pytest.approx(1.05 / 4)
    assert len(reliability_diagram(p, labels, num_bins=4).axes[0].patches) == 8
    logits = np.log(p / (1 - p)).astype("float32")
    for cls, fn in ((ExpectedCalibrationError, expected_calibration_error),
                    (MaximumCalibrationError, maximum_calibration_error)):
        for from_logits, y_pred in ((True, logits), (False, p.astype("float32"))):
            metric = cls(num_bins=10, from_logits=from_logits)
            metric.update_state(labels.reshape(-1, 1).astype("float32"), y_pred)
            assert float(metric.result()) == pytest.approx(fn(p, labels, 10), abs=1e-5)


def test_exported_mc_signature_is_bernoulli(tmp_path):
    model = _binary(stochastic=True)
    path = export_saved_model(model, str(tmp_path / "b"), num_samples=3)
    served = tf.saved_model.load(path).signatures["mc_predict"]
    out = served(x=tf.constant(X), num_samples=tf.constant(1))
    mean = out["mean"].numpy()
    assert mean.shape == (9, 2)
    np.testing.assert_allclose(mean.sum(1), 1.0, atol=1e-6)
    np.testing.assert_allclose(out["predictive_entropy"].numpy(), _bernoulli_entropy(mean[:, 1]), rtol=1e-5)


def test_mc_predict_traces_a_bounded_number_of_times():
    tf.random.set_seed(0)
    model = _binary(stochastic=True)
    data = RNG.normal(size=(40, 4)).astype("float32")
    for n, batch in ((3, 4), (5, 4), (9, 4), (2, 8), (11, 3), (40, 16), (7, 7)):
        mc_predict(model, data[:n], num_samples=2, batch_size=batch)
    for samples in (1, 3, 5):
        mc_predict(model, data[:6], num_samples=samples)
    # reduce_retracing: one trace for the first shape, one with the batch dimension relaxed
    assert traced_function(model, "mc", "classification", True).experimental_get_tracing_count() <= 2
    snaps = [model.get_weights()] * 2
    for n in (3, 5, 9, 2):
        mc_predict(model, data[:n], weight_snapshots=snaps)
    assert traced_function(model, "forward", "classification", True).experimental_get_tracing_count() <= 2
