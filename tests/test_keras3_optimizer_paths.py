"""Keras 3 paths around a DP optimizer that used to print an epsilon no run had (64 records, B = 8, sigma 1).

``optimizer.apply(grads, variables)``, which Keras 3's ``apply_gradients`` calls and which a custom loop or
a ``train_step`` override in the Keras 3 idiom calls directly, applied any gradients, past the DP
optimizer's check that they are its mechanism's release and past the write watch: the statement said
``guarantee: true`` with the epsilon of the releases counted (16.51 for 8 custom-loop steps, 7.08 for a
2-pass ``fit``), while the weights carried unclipped, noiseless gradients (no epsilon holds).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn import _keras_version

KERAS_3 = _keras_version.KERAS_MAJOR == 3
needs_keras3 = pytest.mark.skipif(not KERAS_3, reason="Keras 3's optimizer.apply and optimizer.variables")
PER_EXAMPLE = LOSS.__class__(from_logits=True, reduction="none")


def _compiled(model=None, **kwargs):
    model = model if model is not None else small_model()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, **kwargs)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


def _raw_gradients(model, xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(PER_EXAMPLE(yb, model(xb, training=True)))
    return tape.gradient(loss, model.trainable_variables)


@needs_keras3
def test_optimizer_apply_in_a_custom_loop_takes_the_dp_path():
    x, y = small_data()
    model, optimizer = _compiled()
    optimizer.begin_training(model, x, y, batch_size=8, assert_per_example_loss="per-example cross-entropy")
    for i in range(8):  # the Keras 3 idiom with the mechanism's release: trained and counted
        xb, yb = x[8 * i:8 * (i + 1)], y[8 * i:8 * (i + 1)]
        released = optimizer.mechanism.privatize_model(model, xb, yb,
                                                       loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
        optimizer.apply(released.gradients, model.trainable_variables)
    truth = gaussians_epsilon(1.0, 8)  # 8 steps, each one participation of every example
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)
    # Raw gradients through optimizer.apply: refused as apply_gradients refuses them (before: applied, 16.51).
    optimizer.mechanism.privatize_model(model, x[:8], y[:8], loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
    before = [v.numpy().copy() for v in model.trainable_variables]
    with pytest.raises(ValueError, match="grads_and_vars: the gradients for"):
        optimizer.apply(_raw_gradients(model, x[:8], y[:8]), model.trainable_variables)
    assert all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables, strict=True))


@needs_keras3
def test_optimizer_apply_of_raw_gradients_in_a_train_step_override_is_refused():
    import keras

    class RawApply(keras.Sequential):
        def train_step(self, data):
            xb, yb = data
            released = self.optimizer.mechanism.privatize_model(self, xb, yb,
                                                                loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
            del released  # released (counted), then raw gradients applied: 7.08 with guarantee true before
            self.optimizer.apply(_raw_gradients(self, xb, yb), self.trainable_variables)
            return {"done": tf.constant(0.0)}

    x, y = small_data()
    model, optimizer = _compiled(RawApply([keras.Input((x.shape[1],)), keras.layers.Dense(3)]))
    with pytest.raises(ValueError, match="grads_and_vars: the gradients for"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert optimizer._dp_writes() == 0  # no weight was updated
