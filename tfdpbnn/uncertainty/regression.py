"""Heteroscedastic Gaussian negative log-likelihood (Kendall & Gal 2017, eq. 5) for ``HeteroscedasticHead``.

``HeteroscedasticHead`` itself is a layer (``tfdpbnn.layers.heteroscedastic``), re-exported here.
"""

from __future__ import annotations

import math

import tensorflow as tf

from tfdpbnn import _keras_version
from tfdpbnn.layers.heteroscedastic import HeteroscedasticHead  # noqa: F401 (re-exported)

_DEFAULT_REDUCTION = "auto" if _keras_version.KERAS_MAJOR == 2 else "sum_over_batch_size"


def split_mean_log_variance(y_pred):
    """Split a [..., 2 d] head output into (mean [..., d], log-variance [..., d])."""
    y_pred = tf.convert_to_tensor(y_pred)
    width = y_pred.shape[-1]
    if width is not None and width % 2:
        raise ValueError(f"y_pred: the last dimension must be even (mean and log-variance), got {width}")
    mean, log_var = tf.split(y_pred, 2, axis=-1)
    return mean, log_var


def heteroscedastic_nll(y_true, y_pred):
    """Per-example Gaussian NLL, sum_j 0.5 (log 2 pi + log s_j^2 + (y_j - mu_j)^2 / s_j^2); shape [batch].

    ``y_pred`` is a ``HeteroscedasticHead`` output [batch, 2 d]; ``y_true`` is [batch, d] ([batch] if d=1).
    """
    mean, log_var = split_mean_log_variance(y_pred)
    y_true = tf.cast(tf.convert_to_tensor(y_true), mean.dtype)
    if y_true.shape.rank == mean.shape.rank - 1:
        y_true = tf.expand_dims(y_true, -1)
    if y_true.shape[-1] is not None and mean.shape[-1] is not None and y_true.shape[-1] != mean.shape[-1]:
        raise ValueError(f"y_true: expected {mean.shape[-1]} targets per example (half of y_pred's last "
                         f"dimension), got {y_true.shape[-1]}")
    nll = 0.5 * (math.log(2.0 * math.pi) + log_var + tf.square(y_true - mean) * tf.exp(-log_var))
    return tf.reduce_sum(nll, axis=-1)


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class HeteroscedasticGaussianNLL(tf.keras.losses.Loss):
    """Keras loss wrapping ``heteroscedastic_nll`` (Kendall & Gal 2017).

    ``reduction="none"`` gives the per-example vector (what per-example clipping needs); the default is
    Keras's own (``"auto"`` on Keras 2, ``"sum_over_batch_size"`` on Keras 3, which has no ``"auto"``).
    """

    def __init__(self, reduction=_DEFAULT_REDUCTION, name="heteroscedastic_gaussian_nll"):
        super().__init__(reduction=reduction, name=name)

    def call(self, y_true, y_pred):
        """Per-example ``heteroscedastic_nll(y_true, y_pred)``, before the reduction."""
        return heteroscedastic_nll(y_true, y_pred)
