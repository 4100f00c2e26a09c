"""DPVD: differentially private variational dropout (Ermis & Cemgil (2017a, 2017b), Ermis & Cemgil).

The optimizer is DP-SGD applied to a network of ``DenseVariational`` / ``Conv2DVariational`` layers: the
per-example DATA-term gradients of theta and log sigma^2 are clipped, Gaussian noise is added once per step,
and the KL term (``model.losses``) is added unclipped. With plain SGD the noise moves each weight by
``zeta * N(0, 1)`` with ``zeta = eta * sigma * C / B``: the additive weight noise of Ermis & Cemgil (2017a,
eq. 12), i.e. a
Gaussian dropout of rate ``alpha = zeta^2 / theta^2`` on top of the learned one.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_probability as tfp

from tfdpbnn import _private_api
from tfdpbnn.optimizers.dpsgd import DPSGDOptimizer

#: Weights above this count: dp_alpha_median is taken over an evenly strided subsample of about this many.
ALPHA_MEDIAN_SAMPLE = 10_000


def _variational_thetas(model):
    thetas = []
    for layer in _private_api.submodules(model):
        theta = getattr(layer, "theta", None)
        if _private_api.is_variable(theta) and _private_api.is_variable(getattr(layer, "log_sigma2", None)):
            thetas.append(theta)
    return thetas


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DPVDOptimizer(DPSGDOptimizer):
    """DPVD (Ermis & Cemgil 2017a, Algorithm 1 with eq. 12; 2017b): DP-SGD on variational dropout layers.

    Same arguments and accounting as ``DPSGDOptimizer`` (SGD family: ``learning_rate``, ``momentum``).
    Adds two metrics to the Keras logs each step: ``zeta`` = eta * sigma * C / B, the std of the privacy
    noise on every weight (Ermis & Cemgil 2017a, eq. 12), and ``dp_alpha_median``, the median over the
    variational weights theta of the dropout rate that noise implies, zeta^2 / theta^2. For more than
    ``ALPHA_MEDIAN_SAMPLE`` weights the median is taken over an evenly strided subsample of about that many
    (a full sort of every weight each step cost DPVD more than the clipping did).
    """

    _dp_method = "DPVD"

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, target_epsilon=None, delta=None,
                 num_examples=None, batch_size=None, epochs=None, accountant="rdp", sampling="shuffle",
                 neighboring="add_or_remove", clipping_method="auto", allow_exceeding_budget=False,
                 secure_mode=False,
                 learning_rate=0.01, momentum=0.0, nesterov=False, name="DPVDOptimizer", **kwargs):
        super().__init__(l2_norm_clip, noise_multiplier, target_epsilon=target_epsilon, delta=delta,
                         num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                         accountant=accountant,
                         sampling=sampling, neighboring=neighboring, clipping_method=clipping_method,
                         allow_exceeding_budget=allow_exceeding_budget, secure_mode=secure_mode,
                         learning_rate=learning_rate,
                         momentum=momentum, nesterov=nesterov, name=name, **kwargs)

    def zeta(self):
        """zeta = eta * sigma * C / B (Ermis & Cemgil 2017a, eq. 12), a scalar tensor."""
        lr = self._decayed_lr(tf.float32)
        return lr * self._f32(self._dp_noise_multiplier * self._dp_l2_norm_clip / self._dp_batch_size)

    def _dp_extra_logs(self, model):
        zeta = self.zeta()
        logs = {"zeta": zeta}
        thetas = _variational_thetas(model)
        if thetas:
            flat = tf.concat([tf.reshape(t, [-1]) for t in thetas], axis=0)
            size = sum(int(t.shape.num_elements()) for t in thetas)
            flat = flat[:: max(1, size // ALPHA_MEDIAN_SAMPLE)]
            alpha = tf.square(zeta) / tf.maximum(tf.square(flat), 1e-30)
            logs["dp_alpha_median"] = tfp.stats.percentile(alpha, 50.0, interpolation="midpoint")
        return logs
