"""The small classification problem the privacy-record tests train on, and dp-accounting's RDP epsilon."""

from __future__ import annotations

import dp_accounting
import numpy as np
import tensorflow as tf

import tfdpbnn  # noqa: F401 - first, so that tf.keras is Keras 2 (tf-keras) before LOSS below uses it

N, D, DELTA = 64, 4, 1e-5
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def small_data(n=N, seed=0):
    """``n`` Gaussian examples in D dimensions with labels in {0, 1, 2}."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, D)).astype(np.float32), rng.integers(0, 3, n)


def small_model(seed=0):
    """A D -> 3 linear classifier built on ``seed``."""
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])


def custom_loop_step(model, x, y):
    """``begin_training`` with the per-example loss asserted; returns a traced ``minimize`` step(xb, yb)."""
    opt = model.optimizer
    opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="per-example cross-entropy")

    @tf.function
    def step(xb, yb):
        opt.minimize(lambda: LOSS.__class__(from_logits=True, reduction="none")(yb, model(xb, training=True)),
                     model.trainable_variables)

    return step


def rdp_epsilon(event):
    """dp-accounting's RDP epsilon of ``event`` at DELTA (the independent reference)."""
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(DELTA)


def gaussians_epsilon(sigma, count):
    """RDP epsilon of ``count`` Gaussian mechanisms of noise multiplier ``sigma`` (no amplification)."""
    return rdp_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count))
