"""Reference per-example clipping: materialize every per-example gradient with ``tape.jacobian``.

This is tensorflow-privacy's vectorized path (``VectorizedDPKeras*Optimizer._compute_gradients``): correct for
any model whose examples are independent, but its memory and time grow with batch size times the number of
parameters. It is the fallback of ``tfdpbnn.clipping.clipped_gradients`` and the reference the fast rules are
tested against.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.result import ClippedGradients


def _regularization_loss(model) -> tf.Tensor:
    losses = model.losses
    if not losses:
        return tf.constant(0.0)
    return tf.add_n([tf.cast(loss, tf.float32) for loss in losses])


def clip_factors(norms: tf.Tensor, l2_norm_clip) -> tf.Tensor:
    """``min(1, C / ||g_i||)`` per example (Abadi et al. 2016, Algorithm 1), safe at ``||g_i|| = 0``."""
    clip = tf.cast(l2_norm_clip, norms.dtype)
    return tf.minimum(1.0, clip / tf.maximum(norms, 1e-12))


def scaled_factors(factors: tf.Tensor, sum_scale=None) -> tf.Tensor:
    """``factors * sum_scale`` (``factors`` unchanged for ``None``): a constant multiplier of the clipped sum
    folded into the per-example weights, so that e.g. DP-SGD's division by the batch size costs nothing."""
    if sum_scale is None:
        return factors
    return factors * tf.cast(sum_scale, factors.dtype)


def jacobian_clipped_gradients(model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list,
                               training=True, sum_scale=None) -> ClippedGradients:
    """Forward pass, per-example losses and the clipped gradient sum via the full per-example jacobian."""
    with tf.GradientTape(persistent=True) as tape:
        y_pred = model(x, training=training)
        per_example_loss = per_example_loss_fn(y, y_pred, sample_weight)
        regularization_loss = _regularization_loss(model)
    jacobians = tape.jacobian(per_example_loss, var_list, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    batch = tf.shape(per_example_loss)[0]
    squared = [tf.reduce_sum(tf.reshape(tf.square(j), [batch, -1]), axis=1) for j in jacobians]
    norms = tf.sqrt(tf.add_n(squared))
    factors = scaled_factors(clip_factors(norms, l2_norm_clip), sum_scale)
    clipped_sum = [tf.tensordot(factors, j, axes=1) for j in jacobians]
    regularization_grads = tape.gradient(
        regularization_loss, var_list, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    del tape
    return ClippedGradients(
        clipped_sum=clipped_sum,
        regularization_grads=regularization_grads,
        per_example_loss=per_example_loss,
        per_example_norms=norms,
        regularization_loss=regularization_loss,
        y_pred=y_pred,
    )
