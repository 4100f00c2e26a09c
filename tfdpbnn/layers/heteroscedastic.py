"""Heteroscedastic Gaussian regression head (Kendall & Gal 2017, sec. 2.2): a mean and a log-variance."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._validation import check_positive_int


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class HeteroscedasticHead(tf.keras.layers.Layer):
    """Dense head giving a Gaussian mean and log-variance per target: output [batch, 2 * units].

    The first ``units`` columns are the mean mu(x), the last ``units`` the log-variance log s^2(x)
    (the layout ``heteroscedastic_nll`` and ``mc_predict(task="regression")`` expect). Variables: ``kernel``
    [in, 2 units] and ``bias`` [2 units]; it is a plain dense layer, so per-example clipping applies as usual.
    """

    def __init__(self, units=1, kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)
        self.bias_initializer = tf.keras.initializers.get(bias_initializer)

    def build(self, input_shape):
        """Create ``kernel`` [in, 2 units] and ``bias`` [2 units]."""
        in_dim = tf.TensorShape(input_shape)[-1]
        if in_dim is None:
            raise ValueError("inputs: the last dimension of the input must be known")
        self.kernel = self.add_weight(name="kernel", shape=(int(in_dim), 2 * self.units),
                                      initializer=self.kernel_initializer)
        self.bias = self.add_weight(name="bias", shape=(2 * self.units,), initializer=self.bias_initializer)
        super().build(input_shape)

    def call(self, inputs):
        """``inputs @ kernel + bias``: means in the first ``units`` columns, log-variances in the rest."""
        inputs = tf.convert_to_tensor(inputs, self.kernel.dtype)
        return tf.nn.bias_add(tf.matmul(inputs, self.kernel), self.bias)

    def compute_output_shape(self, input_shape):
        """The input shape with the last dimension replaced by ``2 * units``."""
        return tf.TensorShape(input_shape)[:-1].concatenate([2 * self.units])

    def get_config(self):
        """The config with ``units`` and the serialized initializers, for Keras serialization."""
        config = super().get_config()
        config.update({"units": self.units,
                       "kernel_initializer": tf.keras.initializers.serialize(self.kernel_initializer),
                       "bias_initializer": tf.keras.initializers.serialize(self.bias_initializer)})
        return config
