"""DP-SGD and DP-Adam (Abadi et al. 2016, Algorithm 1; Zhang et al. (2022), Algorithms 1, 3 and 4).

On Bayes-by-Backprop layers DP-SGD is DP-BBP (Zhang et al. 2022, Algorithm 3); on MC dropout layers it is
DP-MC
Dropout (Algorithm 4): the Bayesian part lives in the layers, the optimizer only privatizes the gradient.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn import _adapters
from tfdpbnn.optimizers.base import DPOptimizerMixin

# tensorflow-privacy's vectorized optimizers on Keras 2, tfdpbnn's own bases on Keras 3
_SGDBase, _AdamBase = _adapters.optimizer_bases()


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DPSGDOptimizer(DPOptimizerMixin, _SGDBase):
    """DP-SGD (Abadi et al. 2016, Algorithm 1; Zhang et al. 2022, Algorithm 1, regularizer after the noise).

    ``w <- w - eta * ((sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / B + grad r(w))``; ``r`` is
    ``sum(model.losses)`` (KL terms, weight decay), never clipped. Epsilon: the subsampled Gaussian mechanism
    composed over ``optimizer.iterations`` steps by ``accountant`` (see ``DPOptimizerMixin`` for the args;
    ``learning_rate``, ``momentum``, ``nesterov`` go to ``tf.keras.optimizers.legacy.SGD``).
    """

    _dp_method = "DP-SGD"

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, target_epsilon=None, delta=None,
                 num_examples=None, batch_size=None, epochs=None, accountant="rdp", sampling="shuffle",
                 neighboring="add_or_remove", clipping_method="auto", allow_exceeding_budget=False,
                 secure_mode=False,
                 learning_rate=0.01, momentum=0.0, nesterov=False, name="DPSGDOptimizer", **kwargs):
        super().__init__(l2_norm_clip, noise_multiplier, target_epsilon=target_epsilon, delta=delta,
                         num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                         accountant=accountant,
                         sampling=sampling, neighboring=neighboring, clipping_method=clipping_method,
                         allow_exceeding_budget=allow_exceeding_budget, secure_mode=secure_mode,
                         learning_rate=learning_rate,
                         momentum=momentum, nesterov=nesterov, name=name, **kwargs)


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DPAdamOptimizer(DPOptimizerMixin, _AdamBase):
    """DP-Adam: Adam's update fed the DP-SGD gradient (Abadi et al. 2016; Zhang et al. (2022, section 2)).

    Adam's moments are post-processing of the privatized gradient, so the accounting is DP-SGD's.
    ``learning_rate``, ``beta_1``, ``beta_2``, ``epsilon`` (Adam's own, as in Keras) and ``amsgrad`` go to
    ``tf.keras.optimizers.legacy.Adam``; the privacy budget is ``target_epsilon``. ``optimizer.epsilon``
    is Adam's float, and, called (``optimizer.epsilon(delta)``), the privacy epsilon spent.
    """

    _dp_method = "DP-Adam"

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, target_epsilon=None, delta=None,
                 num_examples=None, batch_size=None, epochs=None, accountant="rdp", sampling="shuffle",
                 neighboring="add_or_remove", clipping_method="auto", allow_exceeding_budget=False,
                 secure_mode=False,
                 learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False,
                 name="DPAdamOptimizer", **kwargs):
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon > 0:
            raise ValueError(f"epsilon: Adam's numerical epsilon must be a number > 0 (the privacy budget is "
                             f"target_epsilon), got {epsilon!r}")
        DPOptimizerMixin.__init__(
            self, l2_norm_clip, noise_multiplier, target_epsilon=target_epsilon, delta=delta,
            num_examples=num_examples, batch_size=batch_size, epochs=epochs, accountant=accountant,
            sampling=sampling, neighboring=neighboring, clipping_method=clipping_method,
            allow_exceeding_budget=allow_exceeding_budget, secure_mode=secure_mode,
            learning_rate=learning_rate, beta_1=beta_1,
            beta_2=beta_2, adam_epsilon=float(epsilon), amsgrad=amsgrad, name=name, **kwargs)

    # Keras's Adam keeps its numerical epsilon in ``self.epsilon`` (a float it converts to a tensor each
    # step); ours is the privacy method ``epsilon(delta, accountant)``. One attribute serves both.
    @property
    def epsilon(self):
        """Adam's numerical epsilon, also callable as the privacy method ``epsilon(delta, accountant)``."""
        return _AdamEpsilon(self._adam_epsilon_hat, self)

    @epsilon.setter
    def epsilon(self, value):
        self._adam_epsilon_hat = float(value)

    def get_config(self):
        """The optimizer's config, with Adam's numerical ``epsilon``."""
        config = super().get_config()
        config["epsilon"] = float(self._adam_epsilon_hat)
        return config


class _AdamEpsilon(float):
    """Adam's epsilon-hat as a float that, called, returns the privacy epsilon spent so far."""

    #: Keras 3 takes a number's dtype from ``dtype`` or else its type; this one is a Python float.
    dtype = float

    def __new__(cls, value, optimizer):
        obj = super().__new__(cls, value)
        obj._optimizer = optimizer
        return obj

    def __call__(self, delta=None, accountant=None):
        return DPOptimizerMixin.epsilon(self._optimizer, delta=delta, accountant=accountant)
