"""Scores of gradient canaries: how strongly the observed weights say "canary j was in".

Two threat models (Nasr et al. 2021, 2023):

* final model (``displacement_scores``): the auditor sees the initial and the released weights; the score is
  how far coordinate j moved in the canary's direction.
* every update (``likelihood_ratio_scores``): the auditor sees the weights after every step
  (``UpdateRecorder``). For an SGD-type update the step on coordinate j, in units of one clipped canary
  gradient, is ``y_t = b_t + sigma z_t`` with ``b_t ~ Bernoulli(q)`` if the canary is in and ``b_t = 0`` if
  not; the Neyman-Pearson optimal statistic is the log likelihood ratio
  ``sum_t log(1 - q + q exp((y_t - 1/2) / sigma^2))`` (the subsampled Gaussian's privacy loss; Mironov,
  Talwar & Zhang 2019).
"""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from tfdpbnn.audit.canaries import canary_weights


class UpdateRecorder(tf.keras.callbacks.Callback):
    """Keras callback: the canary kernel before training and after every step (``weights``: [T + 1, m])."""

    def __init__(self):
        super().__init__()
        self._rows = []

    def on_train_begin(self, logs=None):
        """Start a new record with the canary kernel before training."""
        self._rows = [canary_weights(self.model)]

    def on_train_batch_end(self, batch, logs=None):
        """Record the canary kernel after this step."""
        self._rows.append(canary_weights(self.model))

    @property
    def num_recorded(self) -> int:
        """Rows recorded so far (0 before ``model.fit`` ran with this callback)."""
        return len(self._rows)

    @property
    def weights(self) -> np.ndarray:
        """The recorded canary kernels as one [T + 1, m] array (before training, then after each step)."""
        return np.stack(self._rows)


def displacement_scores(initial, final) -> np.ndarray:
    """``final - initial`` per canary: the canary gradient is ``-C e_j``, so descent moves w_j up."""
    return np.asarray(final, dtype=np.float64) - np.asarray(initial, dtype=np.float64)


def likelihood_ratio_scores(weights, unit, noise_multiplier, sample_rate) -> np.ndarray:
    """Log likelihood ratio of "in" against "out" from every step's update (module docstring).

    Args:
      weights: [T + 1, m] canary kernel before training and after each step (``UpdateRecorder.weights``).
      unit: how far one clipped canary gradient moves the weight (``update_unit``).
      noise_multiplier: sigma > 0.
      sample_rate: q in (0, 1].
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[0] < 2:
        raise ValueError(f"weights must be [steps + 1, m] with at least one step, got shape {weights.shape}")
    if not unit > 0:
        raise ValueError(f"unit must be > 0, got {unit!r}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0 for the likelihood ratio, got {noise_multiplier!r}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    y = np.diff(weights, axis=0) / unit
    a = (y - 0.5) / noise_multiplier ** 2
    if sample_rate == 1:
        return a.sum(axis=0)
    return np.logaddexp(np.log1p(-sample_rate), np.log(sample_rate) + a).sum(axis=0)


def update_unit(optimizer):
    """How far one clipped canary gradient moves its weight in one step; None if the update is not linear.

    None when the update is not linear in the gradient (Adam, momentum, a learning-rate schedule, SI-DPSGD's
    paper mode).
    """
    from tfdpbnn.optimizers import DPSGDOptimizer, DPSGLDOptimizer, SIDPOptimizer

    if not isinstance(optimizer, DPSGDOptimizer | DPSGLDOptimizer):
        return None
    if isinstance(optimizer, SIDPOptimizer) and optimizer.paper_mean_update:
        return None
    config = optimizer.get_config()
    lr = config.get("learning_rate")
    if not isinstance(lr, numbers.Real) or float(config.get("momentum", 0.0)) != 0.0:
        return None
    unit = float(lr) * optimizer.l2_norm_clip / optimizer.batch_size
    if isinstance(optimizer, DPSGLDOptimizer):
        unit *= optimizer.num_examples
    return unit
