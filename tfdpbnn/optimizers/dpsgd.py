"""DP-SGD and DP-Adam (Abadi et al. 2016, Algorithm 1; Zhang et al. (2022), Algorithms 1, 3 and 4).

On Bayes-by-Backprop layers DP-SGD is DP-BBP (Zhang et al. 2022, Algorithm 3); on MC dropout layers it is
DP-MC
Dropout (Algorithm 4): the Bayesian part lives in the layers, the optimizer only privatizes the gradient.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras_vectorized import (
    VectorizedDPKerasAdamOptimizer,
    VectorizedDPKerasSGDOptimizer,
)

from tfdpbnn.optimizers.base import DPOptimizerMixin


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DPSGDOptimizer(DPOptimizerMixin, VectorizedDPKerasSGDOptimizer):
    """DP-SGD (Abadi et al. 2016, Algorithm 1; Zhang et al. (2022, Algorithm 1) with the regularizer after the
    noise).

    ``w <- w - eta * ((sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B + grad r(w))``; ``r`` is
    ``sum(model.losses)`` (KL terms, weight decay), never clipped. Epsilon: the subsampled Gaussian mechanism
    composed over ``optimizer.iterations`` steps by ``accountant`` (see ``DPOptimizerMixin`` for the args;
    ``learning_rate``, ``momentum``, ``nesterov`` go to ``tf.keras.optimizers.legacy.SGD``).
    """

    _dp_method = "DP-SGD"

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, learning_rate=0.01, name="DPSGDOptimizer",
                 **kwargs):
        super().__init__(l2_norm_clip, noise_multiplier, learning_rate=learning_rate, name=name, **kwargs)


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DPAdamOptimizer(DPOptimizerMixin, VectorizedDPKerasAdamOptimizer):
    """DP-Adam: Adam's update fed the DP-SGD gradient (Abadi et al. 2016; Zhang et al. (2022, section 2)).

    Adam's moments are post-processing of the privatized gradient, so the accounting is DP-SGD's.
    ``learning_rate``, ``beta_1``, ``beta_2``, ``epsilon_hat`` (Adam's own epsilon) go to
    ``tf.keras.optimizers.legacy.Adam``; ``epsilon`` here is the privacy budget.
    """

    _dp_method = "DP-Adam"

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, learning_rate=0.001, epsilon_hat=1e-7,
                 name="DPAdamOptimizer", **kwargs):
        super().__init__(l2_norm_clip, noise_multiplier, learning_rate=learning_rate, name=name,
                         base_kwargs={"epsilon": epsilon_hat}, **kwargs)

    # Keras's Adam keeps its numerical epsilon in ``self.epsilon`` (a float it converts to a tensor each
    # step); ours is the privacy method ``epsilon(delta, accountant)``. One attribute serves both.
    @property
    def epsilon(self):
        return _AdamEpsilon(self._adam_epsilon_hat, self)

    @epsilon.setter
    def epsilon(self, value):
        self._adam_epsilon_hat = float(value)

    def get_config(self):
        config = super().get_config()
        config["epsilon_hat"] = float(config.pop("epsilon"))
        return config


class _AdamEpsilon(float):
    """Adam's epsilon-hat as a float that, called, returns the privacy epsilon spent so far."""

    def __new__(cls, value, optimizer):
        obj = super().__new__(cls, value)
        obj._optimizer = optimizer
        return obj

    def __call__(self, delta=None, accountant=None):
        return DPOptimizerMixin.epsilon(self._optimizer, delta=delta, accountant=accountant)
