"""Dispatch between per-example clipping engines."""

from __future__ import annotations

from tfdpbnn.clipping.jacobian import jacobian_clipped_gradients
from tfdpbnn.clipping.result import ClippedGradients

METHODS = ("auto", "jacobian")


def clipped_gradients(model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list=None,
                      training=True, method="auto") -> ClippedGradients:
    """Run ``model`` on ``x`` and return the per-example-clipped data gradient sum (see ``ClippedGradients``).

    Args:
      model: a Keras model whose examples are independent (``check_per_example_independence``).
      x, y, sample_weight: one batch as ``model.fit`` unpacks it.
      per_example_loss_fn: ``f(y, y_pred, sample_weight) -> [batch]`` data losses (no regularizers).
      l2_norm_clip: the clip bound C > 0.
      var_list: variables to differentiate; defaults to ``model.trainable_variables``.
      training: forwarded to the model call.
      method: "auto" (the fastest engine that supports every layer) or "jacobian" (the reference).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if var_list is None:
        var_list = model.trainable_variables
    return jacobian_clipped_gradients(
        model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list, training=training)
