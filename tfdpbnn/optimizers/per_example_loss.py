"""Per-example data losses from what ``model.compile(loss=...)`` was given.

Keras 2.15's ``LossesContainer`` reduces every loss to a scalar before an optimizer sees it, which leaves
nothing to clip per example. This module rebuilds the unreduced loss: for each output, the loss object's own
``call`` (or the plain function), times its ``loss_weights`` entry and the sample weight, averaged over every
non-batch axis. Its mean over the batch equals Keras's ``SUM_OVER_BATCH_SIZE`` loss, so with the clip above
every gradient norm and no noise one DP step is the ordinary step (Abadi et al. 2016, Algorithm 1).
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn import _private_api


def _reduce_to_batch(values: tf.Tensor) -> tf.Tensor:
    """Average a ``[batch, ...]`` tensor over its non-batch axes (Keras's per-element mean)."""
    values = tf.convert_to_tensor(values)
    if values.shape.rank is not None and values.shape.rank <= 1:
        return tf.reshape(values, [-1])
    batch = tf.shape(values)[0]
    return tf.reduce_mean(tf.reshape(values, [batch, -1]), axis=1)


def _one_output_loss(loss_obj, y_t, y_p, sw):
    """``[batch]`` unreduced loss of one output, weighted as ``compute_weighted_loss`` weights it."""
    y_t = tf.convert_to_tensor(y_t)
    sw = None if sw is None else tf.convert_to_tensor(sw)
    y_t, y_p, sw = _private_api.weigh_like_keras(y_t, y_p, sw)
    # The container wraps plain functions in LossFunctionWrapper; a bare function is called as it is.
    values = loss_obj.call(y_t, y_p) if isinstance(loss_obj, tf.keras.losses.Loss) else loss_obj(y_t, y_p)
    values = tf.cast(values, tf.float32)
    if sw is not None:
        sw = tf.cast(sw, values.dtype)
        values, sw = _private_api.squeeze_or_expand(values, sw)
        values = values * sw
    return _reduce_to_batch(values)


def compiled_per_example_loss_fn(model: tf.keras.Model):
    """Return ``f(y, y_pred, sample_weight) -> [batch]`` built from ``model.compiled_loss``.

    Works for loss strings ("sparse_categorical_crossentropy"), ``tf.keras.losses.Loss`` objects with any
    reduction (their unreduced ``call`` is used, so the reduction does not matter) and plain functions, for
    single- and multi-output models with ``loss_weights``. Regularization terms (``model.losses``) are NOT
    included: they are data-independent and are added after clipping (docs/soundness.md, finding 5).
    """
    container = _private_api.compiled_loss(model)
    if container is None:
        raise ValueError(
            "model: it was not compiled with a loss; call model.compile(optimizer=..., loss=...) with a loss "
            "such as 'sparse_categorical_crossentropy' so per-example losses can be clipped.")

    def per_example_loss(y, y_pred, sample_weight=None):
        y_true, sample_weight, losses, loss_weights = _private_api.loss_container_parts(
            container, y_pred, y, sample_weight)
        flat = zip(tf.nest.flatten(y_true), tf.nest.flatten(y_pred), tf.nest.flatten(sample_weight),
                   losses, loss_weights, strict=True)
        total = None
        for y_t, y_p, sw, loss_obj, loss_weight in flat:
            if y_t is None or loss_obj is None:
                continue
            values = _one_output_loss(loss_obj, y_t, y_p, sw)
            if loss_weight is not None:
                values = values * tf.cast(loss_weight, values.dtype)
            total = values if total is None else total + values
        if total is None:
            raise ValueError("model: compiled loss produced no per-example loss (no loss for any output, or "
                             "no targets y were given); DP training needs a data loss to clip.")
        return total

    return per_example_loss
