"""``jacobian_clipped_sum``: the jacobian clipping path from per-example losses on a tape, against clipping
computed example by example (Abadi et al. 2016, Algorithm 1)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdpbnn.clipping import jacobian_clipped_sum


def _model():
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(4, activation="tanh"),
                                tf.keras.layers.Dense(3)])


def test_matches_per_example_loop_for_a_batch_by_k_loss():
    model = _model()
    x = tf.constant(np.random.default_rng(0).normal(size=(6, 5)), tf.float32)
    clip, scale = 0.3, 1.0 / 4.0
    with tf.GradientTape() as tape:
        loss = tf.square(model(x))  # [batch, 3]: averaged per example
    clipped, norms = jacobian_clipped_sum(loss, tape, model.trainable_variables, clip, sum_scale=scale)
    expected = [np.zeros(v.shape, np.float32) for v in model.trainable_variables]
    for i in range(6):
        with tf.GradientTape() as t:
            li = tf.reduce_mean(tf.square(model(x[i:i + 1])))
        g = t.gradient(li, model.trainable_variables)
        norm = np.sqrt(sum(float(tf.reduce_sum(tf.square(gj))) for gj in g))
        assert float(norms[i]) == pytest.approx(norm, rel=1e-5)
        for e, gj in zip(expected, g, strict=True):
            e += scale * min(1.0, clip / norm) * gj.numpy()
    assert min(float(n) for n in norms) > clip  # every example was clipped: the factor matters
    for got, want in zip(clipped, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)


def test_scalar_loss_is_refused():
    model = _model()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tf.ones((2, 5))))
    with pytest.raises(ValueError, match="per_example_loss"):
        jacobian_clipped_sum(loss, tape, model.trainable_variables, 1.0)
