"""DP-SGLD (Zhang et al. 2022, Algorithm 2; Theorems 1 and 3).

``w <- w - eta * ((n/B) sum_i clip_C(g_i) + grad r(w)) + N(0, eta I)``. Theorem 1: this is DP-SGD with
noise multiplier ``sigma = B / (n sqrt(eta) C)`` (and learning rate ``eta n``), so its epsilon is DP-SGD's
for that sigma, by any accountant; Theorem 3 is the GDP (central-limit) reading of the same fact.
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf

from tfdpbnn import _adapters
from tfdpbnn._validation import check_positive
from tfdpbnn.optimizers.base import DPOptimizerMixin

# tensorflow-privacy's vectorized optimizers on Keras 2, tfdpbnn's own bases on Keras 3
_SGDBase = _adapters.optimizer_bases()[0]


def sgld_noise_multiplier(learning_rate, l2_norm_clip, num_examples, batch_size) -> float:
    """sigma = B / (n sqrt(eta) C): DP-SGLD's DP-SGD noise multiplier (Zhang et al. 2022, Theorem 1)."""
    return batch_size / (num_examples * math.sqrt(learning_rate) * l2_norm_clip)


def sgld_learning_rate(noise_multiplier, l2_norm_clip, num_examples, batch_size) -> float:
    """eta = (B / (n sigma C))^2: the step size whose Langevin noise is DP-SGD noise multiplier sigma."""
    return (batch_size / (num_examples * noise_multiplier * l2_norm_clip)) ** 2


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DPSGLDOptimizer(DPOptimizerMixin, _SGDBase):
    """DP-SGLD (Zhang et al. 2022, Algorithm 2): n/B-scaled clipped gradient, prior gradient, N(0, eta) noise.

    Args:
      l2_norm_clip: C.
      learning_rate: eta (a constant float, keyword-only). Give it, OR a budget (``target_epsilon``,
        ``delta``, ``epochs``), from which sigma is calibrated and eta = (B / (n sigma C))^2 chosen
        (Theorem 1).
      prior_stddev: std of an isotropic Gaussian prior N(0, prior_stddev^2) on every trainable weight
        (gradient w / prior_stddev^2); None for a flat prior.
      The regularizer also includes ``n * sum(model.losses)`` (Keras losses are per-example scaled).
      Other args as ``DPOptimizerMixin`` (no ``noise_multiplier``: it is implied by eta).
      Collect posterior samples with ``tfdpbnn.callbacks.PosteriorSampler``.
    """

    _dp_method = "DP-SGLD"

    def __init__(self, l2_norm_clip, *, learning_rate=None, target_epsilon=None, delta=None,
                 num_examples=None, batch_size=None, epochs=None, prior_stddev=None, accountant="rdp",
                 sampling="shuffle", neighboring="add_or_remove", clipping_method="auto",
                 allow_exceeding_budget=False, secure_mode=False, name="DPSGLDOptimizer", **kwargs):
        for key in ("noise_multiplier", "momentum", "nesterov", "decay"):
            if kwargs.get(key):
                raise ValueError(f"{key}: DP-SGLD takes none (noise comes from learning_rate; Langevin "
                                 f"dynamics use plain SGD), got {kwargs[key]!r}")
            kwargs.pop(key, None)
        if "epsilon" in kwargs:
            raise ValueError("epsilon: DPSGLDOptimizer has no 'epsilon' argument; the privacy budget is "
                             f"target_epsilon=..., got epsilon={kwargs['epsilon']!r}")
        clip = check_positive("l2_norm_clip", l2_norm_clip)
        if learning_rate is None and target_epsilon is None:
            raise ValueError("learning_rate and target_epsilon: give a constant step size eta, or a budget "
                             "target_epsilon=..., delta=..., epochs=...; got neither")
        if prior_stddev is not None:
            prior_stddev = check_positive("prior_stddev", prior_stddev)
        self._sgld_prior_stddev = prior_stddev
        if learning_rate is not None:
            if not isinstance(learning_rate, numbers.Real):
                raise ValueError("learning_rate must be a constant float > 0 for DP-SGLD (its noise "
                                 f"N(0, eta) sets the privacy), got {learning_rate!r}")
            learning_rate = check_positive("learning_rate", learning_rate)
            if batch_size is None or num_examples is None:
                raise ValueError("batch_size and num_examples are required (sigma = B / (n sqrt(eta) C))")
            sigma = sgld_noise_multiplier(learning_rate, clip, num_examples, batch_size)
            super().__init__(clip, sigma, target_epsilon=target_epsilon, delta=delta,
                             num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                             accountant=accountant, sampling=sampling,
                             neighboring=neighboring, clipping_method=clipping_method,
                             allow_exceeding_budget=allow_exceeding_budget, secure_mode=secure_mode,
                             learning_rate=learning_rate,
                             name=name, **kwargs)
        else:
            super().__init__(clip, None, target_epsilon=target_epsilon, delta=delta,
                             num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                             accountant=accountant, sampling=sampling,
                             neighboring=neighboring, clipping_method=clipping_method,
                             allow_exceeding_budget=allow_exceeding_budget, secure_mode=secure_mode,
                             learning_rate=1.0, name=name,
                             **kwargs)
            if self.noise_multiplier == 0:  # pragma: no cover - calibration never returns 0
                raise ValueError("epsilon: calibration returned sigma = 0")
            self._set_hyper("learning_rate", sgld_learning_rate(self.noise_multiplier, clip, num_examples,
                                                                batch_size))

    def _dp_sum_scale(self):
        """n / B: the clipped sum enters the update as the unbiased estimate of the full-data gradient."""
        return tf.cast(self.num_examples, tf.float32) / self._f32(self._dp_batch_size)

    def _dp_gradients(self, clipped, var_list):
        """``(n/B)(sum + N(0, (sigma C)^2)) + n grad(model.losses) + w / prior_stddev^2``."""
        n = tf.cast(self.num_examples, tf.float32)
        released = self.mechanism.release(clipped)
        noised = released.noised_gradients
        if released.regularization_gradients is not None:
            noised = [g + n * tf.cast(r, g.dtype)
                      for g, r in zip(noised, released.regularization_gradients, strict=True)]
        if self._sgld_prior_stddev is None:
            return noised
        return [g + tf.cast(v, g.dtype) / self._sgld_prior_stddev ** 2
                for g, v in zip(noised, var_list, strict=True)]

    def get_config(self):
        """The config: no ``noise_multiplier`` (the learning rate implies it), plus ``prior_stddev``."""
        config = super().get_config()
        config.pop("noise_multiplier", None)
        config["prior_stddev"] = self._sgld_prior_stddev
        return config

    def _dp_statement_extras(self):
        rate = self._get_hyper("learning_rate")  # a MirroredVariable under tf.distribute: read it first
        return {"learning_rate": float(rate.numpy() if hasattr(rate, "numpy") else rate),
                "equivalent_dp_sgd": "Zhang et al. (2022, Theorem 1): sigma = B / (n sqrt(eta) C)"}


__all__ = ["DPSGLDOptimizer", "sgld_learning_rate", "sgld_noise_multiplier"]
