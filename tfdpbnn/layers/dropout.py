"""Monte Carlo dropout (Gal & Ghahramani 2016; DP-MC Dropout of Zhang et al. (2022, section 3.3))."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._validation import check_real
from tfdpbnn.layers.sampling import select


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class MCDropout(tf.keras.layers.Layer):
    """Dropout that stays active at inference under ``tfdpbnn.layers.mc_sampling()`` (MC dropout).

    ``gaussian=False``: Bernoulli (inverted) dropout, y = x * Bernoulli(1 - rate) / (1 - rate).
    ``gaussian=True``: Gaussian dropout (Srivastava et al. 2014 sec. 10), y = x * N(1, rate / (1 - rate)),
    same mean and variance as the Bernoulli version. Masks are independent per example and unit, so no
    example's output depends on another example. Identity at inference unless MC sampling is on.
    Attributes: ``rate`` in [0, 1), ``gaussian``.
    """

    def __init__(self, rate, gaussian=False, **kwargs):
        super().__init__(**kwargs)
        self.rate = check_real("rate", rate, low=0.0, high=1.0, high_open=True)
        self.gaussian = bool(gaussian)

    def call(self, inputs, training=None):
        """Apply a fresh dropout mask in training or under ``mc_sampling()``; otherwise return ``inputs``."""
        inputs = tf.convert_to_tensor(inputs)
        if self.rate == 0.0:
            return inputs

        def sample():
            if self.gaussian:
                std = (self.rate / (1.0 - self.rate)) ** 0.5
                return inputs * tf.random.normal(tf.shape(inputs), mean=1.0, stddev=std, dtype=inputs.dtype)
            return tf.nn.dropout(inputs, rate=self.rate)

        return select(training, sample, lambda: tf.identity(inputs))

    def compute_output_shape(self, input_shape):
        """The input shape (dropout keeps it)."""
        return tf.TensorShape(input_shape)

    def get_config(self):
        """The layer's config with ``rate`` and ``gaussian``, for Keras serialization."""
        config = super().get_config()
        config.update({"rate": self.rate, "gaussian": self.gaussian})
        return config
