"""Dispatch between per-example clipping engines: "ghost" (fast rules) and "jacobian" (reference)."""

from __future__ import annotations

import warnings

import tensorflow as tf

from tfdpbnn.clipping.ghost import UnsupportedModelError, ghost_clipped_gradients, plan
from tfdpbnn.clipping.independence import check_per_example_independence
from tfdpbnn.clipping.jacobian import jacobian_clipped_gradients
from tfdpbnn.clipping.result import ClippedGradients

METHODS = ("auto", "ghost", "jacobian")

_WARNED: set = set()


def _warn_fallback(model, err: UnsupportedModelError) -> None:
    key = (id(model), tuple(err.layers))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"tfdpbnn.clipping: {err}; falling back to the jacobian path (per-example gradients materialized: "
        "correct but much slower).",
        UserWarning,
        stacklevel=3,
    )


def clipped_gradients(model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list=None,
                      training=True, method="auto", sum_scale=None) -> ClippedGradients:
    """Run ``model`` on ``x`` and return the per-example-clipped data gradient sum (see ``ClippedGradients``).

    Args:
      model: a Keras model whose examples are independent (``check_per_example_independence``).
      x: the batch's inputs, as ``model.fit`` unpacks them.
      y: the batch's targets.
      sample_weight: the batch's sample weights, or None.
      per_example_loss_fn: ``f(y, y_pred, sample_weight) -> [batch]`` data losses (no regularizers).
      l2_norm_clip: the clip bound C > 0.
      var_list: variables to differentiate; defaults to ``model.trainable_variables``.
      training: forwarded to the model call.
      method: "auto" (the ghost engine when every variable of ``var_list`` is covered by a registered rule,
        else the jacobian path with one warning naming the uncovered layers), "ghost" (raises
        ``ValueError`` naming unsupported layers) or "jacobian" (the reference).
      sum_scale: optional scalar (float or tensor) the clipped sum is multiplied by, ``sum_i s c_i g_i``;
        folded into the clip factors ``c_i`` (no extra pass over the gradients). DP optimizers pass
        ``1 / B``. The norms are those of the unscaled ``g_i``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    check_per_example_independence(model)
    if var_list is None:
        var_list = model.trainable_variables
    ragged = [type(t).__name__ for t in tf.nest.flatten(x)
              if isinstance(t, tf.RaggedTensor | tf.SparseTensor)]
    if ragged and method == "ghost":
        raise ValueError(f"method: the ghost engine's rules read activations row by row and cannot take "
                         f"{ragged[0]} inputs; use method='jacobian' (or 'auto', which does)")
    if method in ("auto", "ghost") and not ragged:  # ragged/sparse inputs: the exact jacobian path
        try:
            entries = plan(model, var_list)
            return ghost_clipped_gradients(model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip,
                                           var_list, training=training, entries=entries, sum_scale=sum_scale)
        except UnsupportedModelError as err:
            if method == "ghost":
                raise
            _warn_fallback(model, err)
    return jacobian_clipped_gradients(
        model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list, training=training,
        sum_scale=sum_scale)
