"""mc_predict (stochastic layers and weight snapshots) and the heteroscedastic regression head."""

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32
from scipy import stats

from tfdpbnn.layers import DenseVariational, MCDropout
from tfdpbnn.uncertainty import (
    HeteroscedasticGaussianNLL,
    HeteroscedasticHead,
    heteroscedastic_nll,
    mc_predict,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(9, 4)).astype("float32")


def _entropy(p):
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), axis=-1)


def _classifier(stochastic=False):
    layers = [tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu")]
    if stochastic:
        layers.append(MCDropout(0.5))
    layers.append(tf.keras.layers.Dense(3, activation="softmax"))
    return tf.keras.Sequential(layers)


def test_mutual_information_is_zero_for_a_deterministic_model():
    model = _classifier()
    with pytest.warns(UserWarning, match="no tfdpbnn stochastic layer"):
        res = mc_predict(model, X, num_samples=4, batch_size=4)
    np.testing.assert_allclose(res.mean, model(X).numpy(), rtol=1e-6)
    np.testing.assert_allclose(res.mutual_information, np.zeros(9), atol=1e-12)  # float64 rounding only
    np.testing.assert_allclose(res.predictive_entropy, res.expected_entropy, atol=1e-12)
    expected = _entropy(model(X).numpy().astype(np.float64))
    np.testing.assert_allclose(res.predictive_entropy, expected, rtol=1e-5)


def test_stochastic_model_has_epistemic_uncertainty_and_bounded_batches():
    tf.random.set_seed(0)
    model = _classifier(stochastic=True)
    res = mc_predict(model, X, num_samples=20, batch_size=4)
    assert res.mean.shape == (9, 3) and res.num_samples == 20
    np.testing.assert_allclose(res.mean.sum(1), 1.0, atol=1e-6)
    assert np.all(res.mutual_information > 0)
    total = res.expected_entropy + res.mutual_information
    np.testing.assert_allclose(res.predictive_entropy, total, atol=1e-12)
    assert not np.allclose(res.mean, mc_predict(model, X, num_samples=20).mean)  # fresh samples
    np.testing.assert_allclose(model(X).numpy(), model(X).numpy(), **F32)  # mc_predict left inference alone


def test_weight_snapshots_match_hand_computation():
    model = _classifier()
    snaps = [[w + RNG.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()]
             for _ in range(3)]
    original = model.get_weights()
    probs = []
    for snap in snaps:
        model.set_weights(snap)
        probs.append(model(X).numpy().astype(np.float64))
    model.set_weights(original)
    probs = np.stack(probs)
    res = mc_predict(model, X, weight_snapshots=snaps, batch_size=2)
    mean = probs.mean(0)
    np.testing.assert_allclose(res.mean, mean, rtol=1e-6)
    np.testing.assert_allclose(res.expected_entropy, _entropy(probs).mean(0), rtol=1e-5)
    np.testing.assert_allclose(res.mutual_information, _entropy(mean) - _entropy(probs).mean(0), atol=1e-6)
    for a, b in zip(model.get_weights(), original, strict=False):
        np.testing.assert_array_equal(a, b)  # weights restored


def test_regression_epistemic_and_aleatoric_variance():
    model = tf.keras.Sequential([tf.keras.Input((4,)), HeteroscedasticHead(2)])
    snaps = [[w + RNG.normal(scale=0.3, size=w.shape).astype("float32") for w in model.get_weights()]
             for _ in range(4)]
    outs = []
    for snap in snaps:
        model.set_weights(snap)
        outs.append(model(X).numpy().astype(np.float64))
    outs = np.stack(outs)
    mu, log_var = outs[..., :2], outs[..., 2:]
    res = mc_predict(model, X, weight_snapshots=snaps, task="regression")
    np.testing.assert_allclose(res.mean, mu.mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(res.epistemic_variance, mu.var(0), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(res.aleatoric_variance, np.exp(log_var).mean(0), rtol=1e-5)
    np.testing.assert_allclose(res.variance, res.epistemic_variance + res.aleatoric_variance)
    # a variational layer in front gives epistemic variance under MC sampling, none without it
    tf.random.set_seed(1)
    vmodel = tf.keras.Sequential([tf.keras.Input((4,)), DenseVariational(5, num_examples=10,
                                  log_sigma2_initializer=tf.keras.initializers.Constant(-2.0)),
                                  HeteroscedasticHead(1)])
    assert np.all(mc_predict(vmodel, X, num_samples=10, task="regression").epistemic_variance > 0)


def test_heteroscedastic_nll_closed_form_and_reduction_none():
    y_pred = RNG.normal(size=(6, 4)).astype("float32")
    y_true = RNG.normal(size=(6, 2)).astype("float32")
    mu, log_var = y_pred[:, :2], y_pred[:, 2:]
    expected = -stats.norm.logpdf(y_true, mu, np.exp(0.5 * log_var)).sum(1)
    np.testing.assert_allclose(heteroscedastic_nll(y_true, y_pred).numpy(), expected, rtol=1e-5)
    none = HeteroscedasticGaussianNLL(reduction=tf.keras.losses.Reduction.NONE)(y_true, y_pred).numpy()
    assert none.shape == (6,)
    np.testing.assert_allclose(none, expected, rtol=1e-5)
    mean_loss = HeteroscedasticGaussianNLL()(y_true, y_pred).numpy()
    np.testing.assert_allclose(mean_loss, expected.mean(), rtol=1e-5)
    model = tf.keras.Sequential([tf.keras.Input((4,)), HeteroscedasticHead(1)])
    model.compile("sgd", HeteroscedasticGaussianNLL())
    model.fit(X, RNG.normal(size=(9,)), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="y_pred"):
        heteroscedastic_nll(y_true, y_pred[:, :3])


@pytest.mark.parametrize("kwargs,match", [
    ({"num_samples": 0}, "num_samples must be an integer >= 1"),
    ({"num_samples": 2.5}, "num_samples"),
    ({"batch_size": 0}, "batch_size"),
    ({"task": "ranking"}, "task"),
    ({"weight_snapshots": []}, "weight_snapshots"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mc_predict(_classifier(), X, **kwargs)


def test_logits_are_read_from_the_output_layer_or_refused():
    logits_model = tf.keras.Sequential([tf.keras.Input((4,)), MCDropout(0.0), tf.keras.layers.Dense(3)])
    expected = tf.nn.softmax(logits_model(X)).numpy()
    # linear output layer: logits, softmax applied (the default from_logits=None reads the activation)
    np.testing.assert_allclose(mc_predict(logits_model, X, num_samples=2).mean, expected, rtol=1e-5)
    np.testing.assert_allclose(mc_predict(logits_model, X, num_samples=2, from_logits=True).mean, expected,
                               rtol=1e-5)
    with pytest.raises(ValueError, match="from_logits=False contradicts"):
        mc_predict(logits_model, X, num_samples=2, from_logits=False)
    with pytest.raises(ValueError, match="from_logits=True contradicts"):
        mc_predict(_classifier(stochastic=True), X, num_samples=2, from_logits=True)
    # an activation that says neither: the caller must say; a wrong "probabilities" claim fails in the graph
    relu_model = tf.keras.Sequential([tf.keras.Input((4,)), MCDropout(0.1),
                                      tf.keras.layers.Dense(3, activation="relu")])
    with pytest.raises(ValueError, match="cannot tell"):
        mc_predict(relu_model, X, num_samples=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="probability vectors"):
        mc_predict(relu_model, X + 3.0, num_samples=2, from_logits=False)


def test_keras_dropout_alone_warns_that_mi_is_zero():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8), tf.keras.layers.Dropout(0.5),
                                 tf.keras.layers.Dense(3, activation="softmax")])
    with pytest.warns(UserWarning, match=r"\['Dropout'\] are the identity at inference.*MCDropout"):
        res = mc_predict(model, X, num_samples=5)
    np.testing.assert_allclose(res.mutual_information, 0.0, atol=1e-12)  # what the warning explains


def test_dataset_input_matches_array_input():
    tf.random.set_seed(0)
    model = _classifier(stochastic=True)
    labels = np.arange(9) % 3
    ds = tf.data.Dataset.from_tensor_slices((X, labels)).batch(4)  # (x, y) as for model.fit
    snaps = [model.get_weights()] * 2
    np.testing.assert_allclose(mc_predict(model, ds, weight_snapshots=snaps).mean,
                               mc_predict(model, X, weight_snapshots=snaps).mean, **F32)
    res = mc_predict(model, tf.data.Dataset.from_tensor_slices(X).batch(5), num_samples=400)
    assert res.mean.shape == (9, 3)
    # independent 400-sample estimates of the same predictive mean (entries in [0, 1]): within 0.1
    np.testing.assert_allclose(res.mean, mc_predict(model, X, num_samples=400).mean, atol=0.1)
    with pytest.raises(ValueError, match="infinite"):
        mc_predict(model, ds.repeat(), num_samples=2)


def test_subclassed_model_must_say_logits_or_probabilities():
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.drop, self.out = MCDropout(0.2), tf.keras.layers.Dense(3, activation="softmax")

        def call(self, x, training=None):
            return tf.math.log(self.out(self.drop(x, training=training)))  # log-probabilities: logits

    net = Net()
    with pytest.raises(ValueError, match="cannot tell"):  # last layer softmax, output not
        mc_predict(net, X, num_samples=2)
    res = mc_predict(net, X, num_samples=2, from_logits=True)
    np.testing.assert_allclose(res.mean.sum(-1), 1.0, atol=1e-6)
