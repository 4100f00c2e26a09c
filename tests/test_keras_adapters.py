"""The same DP flow under whichever Keras this set runs (Keras 2 through tf-keras, or Keras 3).

Run in both test sets (``./scripts/test`` and ``./scripts/test --keras3``): ``model.fit`` takes the DP step
of the closed form (Abadi et al. 2016, Algorithm 1), adds noise of the declared scale, and a DPVD model
(Ermis & Cemgil 2017a) trained, saved, reloaded and exported reports dp-accounting's epsilon of what ran,
before and after the round trips.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, gaussians_epsilon

import tfdpbnn
from tfdpbnn import _keras_version

F32 = {"rtol": 1e-5, "atol": 1e-6}
pytestmark = pytest.mark.timeout(120)


def _linear_problem(n=8, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)


def test_fit_step_is_the_clipped_mean_of_the_closed_form_gradients():
    x, y = _linear_problem()
    n, clip, lr = len(x), 0.5, 0.1
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((x.shape[1],)), tf.keras.layers.Dense(1)])
    w0, b0 = (v.numpy().copy() for v in model.trainable_variables)
    optimizer = tfdpbnn.DPSGDOptimizer(l2_norm_clip=clip, noise_multiplier=0.0, num_examples=n, batch_size=n,
                                       learning_rate=lr)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=n, epochs=1, shuffle=False, verbose=0)
    # loss_i = (x_i w + b - y_i)^2: g_i = 2 r_i (x_i, 1); clipped to norm <= C; mean over B = n
    r = x @ w0 + b0 - y
    grads = 2 * r * np.concatenate([x, np.ones((n, 1), np.float32)], axis=1)
    norms = np.linalg.norm(grads, axis=1, keepdims=True)
    assert (norms > clip).any()     # clipping is exercised
    mean = (grads * np.minimum(1.0, clip / norms)).sum(axis=0) / n
    w1, b1 = (v.numpy() for v in model.trainable_variables)
    np.testing.assert_allclose(w1[:, 0], w0[:, 0] - lr * mean[:-1], **F32)
    np.testing.assert_allclose(b1, b0 - lr * mean[-1:], **F32)
    assert optimizer.steps == 1


def test_fit_step_adds_noise_of_std_lr_sigma_c_over_b():
    # x = 0 and y = 0 with zero-initialized weights: every data gradient is 0, so the update is the noise
    n, units, sigma, clip, lr = 16, 512, 2.0, 0.7, 0.3
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.Input((1,)),
                                 tf.keras.layers.Dense(units, kernel_initializer="zeros")])
    optimizer = tfdpbnn.DPSGDOptimizer(l2_norm_clip=clip, noise_multiplier=sigma, num_examples=n,
                                       batch_size=n, learning_rate=lr)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(np.zeros((n, 1), np.float32), np.zeros((n, units), np.float32), batch_size=n, epochs=1,
              verbose=0)
    moved = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])    # 2 * 512 values
    expected = lr * sigma * clip / n
    # the sample std of 1024 normals is within 15% of the true std with probability > 1 - 1e-9
    assert abs(moved.std() / expected - 1) < 0.15, (moved.std(), expected)
    assert abs(moved.mean()) < 5 * expected / np.sqrt(moved.size)


def test_dpvd_train_save_reload_export_keeps_dp_accountings_epsilon(tmp_path):
    rng = np.random.default_rng(0)
    n, batch, sigma, epochs = 64, 16, 1.1, 2
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((4,)),
        tfdpbnn.layers.DenseVariational(8, activation="tanh", num_examples=n),
        tfdpbnn.layers.DenseVariational(2, num_examples=n),
    ])
    optimizer = tfdpbnn.DPVDOptimizer(l2_norm_clip=1.0, noise_multiplier=sigma, delta=DELTA, num_examples=n,
                                      batch_size=batch, epochs=epochs, learning_rate=0.1)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    # shuffled passes, add/remove: one Gaussian mechanism per pass (no amplification claimed)
    expected = gaussians_epsilon(sigma, epochs)
    assert optimizer.steps == epochs * n // batch
    np.testing.assert_allclose(optimizer.epsilon(), expected, rtol=1e-9)
    np.testing.assert_allclose(history.history["epsilon"][-1], expected, rtol=1e-6)
    assert "zeta" in history.history

    path = str(tmp_path / "dpvd.keras")
    model.save(path)
    reloaded = tf.keras.models.load_model(path)
    assert type(reloaded.optimizer).__name__ == "DPVDOptimizer"
    assert reloaded.optimizer.steps == optimizer.steps
    np.testing.assert_allclose(reloaded.optimizer.epsilon(), expected, rtol=1e-9)
    np.testing.assert_allclose(reloaded(x, training=False).numpy(), model(x, training=False).numpy(), **F32)

    exported = tfdpbnn.export_saved_model(reloaded, str(tmp_path / "dpvd_savedmodel"))
    with open(os.path.join(exported, "assets", "privacy.json")) as fh:
        statement = json.load(fh)
    np.testing.assert_allclose(statement["epsilon"], expected, rtol=1e-9)
    served = tf.saved_model.load(exported)
    det = served.signatures["serving_default"](x=tf.constant(x))["output"].numpy()
    np.testing.assert_allclose(det, model(x, training=False).numpy(), **F32)
    mc = served.signatures["mc_predict"](x=tf.constant(x), num_samples=tf.constant(8))
    assert float(tf.reduce_max(mc["mutual_information"])) > 0    # the signature samples the weights

    reloaded.fit(x, y, batch_size=batch, epochs=1, verbose=0)     # training goes on, counted from the record
    np.testing.assert_allclose(reloaded.optimizer.epsilon(), gaussians_epsilon(sigma, epochs + 1), rtol=1e-9)


class CustomStepModel(tf.keras.Model):
    """A model whose own ``train_step`` passes the per-example loss vector to ``optimizer.minimize``."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y), axis=-1)     # [batch]
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return {"loss": tf.reduce_mean(loss)}


def test_custom_train_step_minimize_takes_the_dp_step():
    # sigma = 0 and a clip above every gradient norm: the DP step is the plain SGD step on the mean loss
    x, y = _linear_problem()
    tf.keras.utils.set_random_seed(2)
    inputs = tf.keras.Input((x.shape[1],))
    model = CustomStepModel(inputs, tf.keras.layers.Dense(1)(inputs))
    with tf.GradientTape() as tape:
        mean_loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(mean_loss, model.trainable_variables)
    expected = [v.numpy() - 0.1 * g.numpy() for v, g in zip(model.trainable_variables, grads, strict=True)]
    optimizer = tfdpbnn.DPSGDOptimizer(l2_norm_clip=1e6, noise_multiplier=0.0, num_examples=len(x),
                                       batch_size=len(x), learning_rate=0.1)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    for v, e in zip(model.trainable_variables, expected, strict=True):
        np.testing.assert_allclose(v.numpy(), e, **F32)
    assert optimizer.steps == 1


def test_budget_stops_fit_before_the_step_that_would_exceed_it():
    x, y = _linear_problem(n=32)
    optimizer = tfdpbnn.DPSGDOptimizer(l2_norm_clip=1.0, target_epsilon=2.0, delta=DELTA, num_examples=32,
                                       batch_size=8, epochs=1, sampling="shuffle", learning_rate=0.1)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    with pytest.warns(UserWarning, match="would spend epsilon"):
        model.fit(x, y, batch_size=8, epochs=50, verbose=0)
    assert 0 < optimizer.steps < 50 * 4
    assert optimizer.epsilon() <= 2.0
    assert optimizer.privacy_statement()["epsilon"] <= 2.0


def test_keras_version_is_the_one_tf_keras_is():
    major = 3 if tf.keras.Model.__module__.startswith("keras.") else 2
    assert major == _keras_version.KERAS_MAJOR
