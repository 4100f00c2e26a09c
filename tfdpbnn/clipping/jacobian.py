"""Reference per-example clipping: materialize every per-example gradient with ``tape.jacobian``.

This is tensorflow-privacy's vectorized path (``VectorizedDPKeras*Optimizer._compute_gradients``): correct for
any model whose examples are independent, but its memory and time grow with batch size times the number of
parameters. It is the fallback of ``tfdpbnn.clipping.clipped_gradients`` and the reference the fast rules are
tested against.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.clipping.result import ClippedGradients


def _regularization_loss(model) -> tf.Tensor:
    losses = model.losses
    if not losses:
        return tf.constant(0.0)
    return tf.add_n([tf.cast(loss, tf.float32) for loss in losses])


def widest_sum(squared: list) -> tf.Tensor:
    """``tf.add_n`` of per-example squared norms in the widest of their dtypes.

    A model mixing float32 and float64 layers has squared norms of both dtypes, which ``tf.add_n`` refuses.
    """
    widest = max((t.dtype for t in squared), key=lambda d: d.size)
    return tf.add_n([tf.cast(t, widest) for t in squared])


def clip_factors(norms: tf.Tensor, l2_norm_clip) -> tf.Tensor:
    """``min(1, C / ||g_i||)`` per example (Abadi et al. 2016, Algorithm 1), safe at ``||g_i|| = 0``."""
    clip = tf.cast(l2_norm_clip, norms.dtype)
    return tf.minimum(tf.ones([], norms.dtype), clip / tf.maximum(norms, tf.cast(1e-12, norms.dtype)))


def scaled_factors(factors: tf.Tensor, sum_scale=None) -> tf.Tensor:
    """``factors * sum_scale`` (``factors`` unchanged for ``None``).

    A constant multiplier of the clipped sum folded into the per-example weights, so that e.g. DP-SGD's
    division by the batch size costs nothing.
    """
    if sum_scale is None:
        return factors
    return factors * tf.cast(sum_scale, factors.dtype)


def jacobian_clipped_sum(per_example_loss, tape: tf.GradientTape, var_list, l2_norm_clip,
                         sum_scale=None) -> tuple[list[tf.Tensor], tf.Tensor]:
    """``(sum_i s min(1, C/||g_i||) g_i, ||g_i||)`` from per-example losses recorded on ``tape``.

    The per-example gradients ``g_i`` (Abadi et al. 2016, Algorithm 1) are materialized with
    ``tape.jacobian``; this is the one jacobian clipping path (``jacobian_clipped_gradients`` and
    ``optimizer.minimize(loss, var_list, tape=tape)`` both use it).

    Args:
      per_example_loss: ``[batch]`` data losses, or ``[batch, ...]`` (averaged per example, recorded on
        ``tape``), computed under ``tape``.
      tape: the ``tf.GradientTape`` that recorded ``per_example_loss`` (it may be non-persistent: one
        ``jacobian`` call).
      var_list: the variables to differentiate (unconnected ones get zero gradients).
      l2_norm_clip: the clip bound C > 0.
      sum_scale: optional constant s folded into the clip factors (``scaled_factors``).

    Returns:
      the scaled clipped sum, one tensor per variable, and the ``[batch]`` unclipped per-example norms.
    """
    per_example_loss = tf.convert_to_tensor(per_example_loss)
    if per_example_loss.shape.rank == 0:
        raise ValueError("per_example_loss: got a scalar; per-example clipping needs one loss per example, "
                         "a tensor of shape [batch] (or [batch, ...])")
    batch = tf.shape(per_example_loss)[0]
    if per_example_loss.shape.rank != 1:
        with tape:
            per_example_loss = tf.reduce_mean(tf.reshape(per_example_loss, [batch, -1]), axis=1)
    jacobians = tape.jacobian(per_example_loss, _private_api.tf_variables(var_list),
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
    squared = [tf.reduce_sum(tf.reshape(tf.square(j), [batch, -1]), axis=1) for j in jacobians]
    norms = tf.sqrt(widest_sum(squared))
    factors = scaled_factors(clip_factors(norms, l2_norm_clip), sum_scale)
    return [tf.tensordot(tf.cast(factors, j.dtype), j, axes=1) for j in jacobians], norms


def jacobian_clipped_gradients(model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list,
                               training=True, sum_scale=None) -> ClippedGradients:
    """Forward pass, per-example losses and the clipped gradient sum via the full per-example jacobian."""
    with tf.GradientTape(persistent=True) as tape:
        y_pred = model(x, training=training)
        per_example_loss = per_example_loss_fn(y, y_pred, sample_weight)
        regularization_loss = _regularization_loss(model)
    clipped_sum, norms = jacobian_clipped_sum(per_example_loss, tape, var_list, l2_norm_clip, sum_scale)
    regularization_grads = tape.gradient(
        regularization_loss, _private_api.tf_variables(var_list),
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    del tape
    return ClippedGradients(
        clipped_sum=clipped_sum,
        regularization_grads=regularization_grads,
        per_example_loss=per_example_loss,
        per_example_norms=norms,
        regularization_loss=regularization_loss,
        y_pred=y_pred,
    )
