"""The value every per-example clipping engine returns."""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf


@dataclasses.dataclass
class ClippedGradients:
    """Per-example-clipped gradient sum of the data term, and the data-independent gradient beside it.

    This is the input of DP-SGD's noise step (Abadi et al. 2016, Algorithm 1, lines "clip gradient" and
    "add noise"): ``clipped_sum`` is ``sum_i g_i * min(1, C / ||g_i||)`` where ``g_i`` is the gradient of
    example ``i``'s data loss with respect to all of ``var_list`` together.

    Attributes:
      clipped_sum: one tensor per variable of ``var_list`` (zeros where a variable does not influence the
        data loss), times the engine's ``sum_scale`` when one was given.
      regularization_grads: one tensor per variable: the gradient of ``regularization_loss``; it never goes
        through clipping (docs/soundness.md, finding 5; Zhang et al. (2022) adds the prior's gradient after
        the noise).
      per_example_loss: ``[batch]`` data losses.
      per_example_norms: ``[batch]`` L2 norms of the unclipped per-example gradients.
      regularization_loss: scalar, ``sum(model.losses)`` from the same forward pass (0 when there are none).
      y_pred: the model's output of the same forward pass (for metrics).
    """

    clipped_sum: list[tf.Tensor]
    regularization_grads: list[tf.Tensor]
    per_example_loss: tf.Tensor
    per_example_norms: tf.Tensor
    regularization_loss: tf.Tensor
    y_pred: Any
