"""Variational dropout layers with additive noise reparameterization and the log-uniform prior.

Ermis & Cemgil (2017a, DP Variational Dropout), eq. (10): theta_ij = phi_ij + zeta_ij *
eps_ij with
zeta_ij^2 = alpha_ij * phi_ij^2 = sigma_ij^2, trained with the local reparameterization trick (Kingma et al.
2015) and the KL approximation of Molchanov, Ashukha & Vetrov (2017, "Variational dropout sparsifies deep
neural networks", eq. 14):

    -KL(q(w | theta, sigma^2) || p(w)) ~= k1 sigmoid(k2 + k3 log alpha) - 0.5 log(1 + 1/alpha) - k1
    k1 = 0.63576, k2 = 1.87320, k3 = 1.48695.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._validation import check_positive_int, check_real
from tfdpbnn.layers import _checks
from tfdpbnn.layers._conv import conv2d_output_shape
from tfdpbnn.layers.sampling import select

K1, K2, K3 = 0.63576, 1.87320, 1.48695
#: log alpha is clipped to this range, as in Molchanov et al.'s code.
LOG_ALPHA_RANGE = (-8.0, 8.0)


def log_uniform_kl(log_alpha):
    """KL(N(w | theta, alpha theta^2) || log-uniform prior) per weight, Molchanov et al. 2017 eq. 14.

    Approximation error below 1e-2 over all log alpha (tested against numerical integration); the
    constant makes the KL vanish as alpha -> infinity.
    """
    log_alpha = tf.convert_to_tensor(log_alpha)
    return K1 - K1 * tf.sigmoid(K2 + K3 * log_alpha) + 0.5 * tf.math.softplus(-log_alpha)


class _VariationalMixin:
    """log alpha, pruning mask and KL shared by the dense and convolutional variants."""

    def _init_common(self, num_examples, threshold, eps, use_bias, activation, theta_initializer,
                     log_sigma2_initializer, bias_initializer, kernel_regularizer=None, bias_regularizer=None,
                     kernel_constraint=None, bias_constraint=None, kl_weight=1.0):
        self.num_examples = check_positive_int("num_examples", num_examples)
        self.kl_weight = check_real("kl_weight", kl_weight, low=0.0)
        # log alpha is clipped to LOG_ALPHA_RANGE, so a threshold outside it prunes all or no weights.
        self.threshold = check_real("threshold", threshold, low=LOG_ALPHA_RANGE[0],
                                              high=LOG_ALPHA_RANGE[1])
        self.eps = check_real("eps", eps, low=0.0, low_open=True)
        self.use_bias = bool(use_bias)
        self.activation = tf.keras.activations.get(activation)
        self.theta_initializer = tf.keras.initializers.get(theta_initializer)
        self.log_sigma2_initializer = tf.keras.initializers.get(log_sigma2_initializer)
        self.bias_initializer = tf.keras.initializers.get(bias_initializer)
        # Keras names: the "kernel" of these layers is the mean theta. Regularizers are data-independent
        # (added to model.losses, which DP optimizers add after clipping and noise).
        self.kernel_regularizer = tf.keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = tf.keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = tf.keras.constraints.get(kernel_constraint)
        self.bias_constraint = tf.keras.constraints.get(bias_constraint)

    def _add_weights(self, kernel_shape, units):
        self.theta = self.add_weight(name="theta", shape=kernel_shape, initializer=self.theta_initializer,
                                     regularizer=self.kernel_regularizer, constraint=self.kernel_constraint,
                                     trainable=True)
        self.log_sigma2 = self.add_weight(name="log_sigma2", shape=kernel_shape,
                                          initializer=self.log_sigma2_initializer, trainable=True)
        self.bias = (self.add_weight(name="bias", shape=(units,), initializer=self.bias_initializer,
                                     regularizer=self.bias_regularizer, constraint=self.bias_constraint)
                     if self.use_bias else None)

    @property
    def log_alpha(self):
        """clip(log_sigma2 - log(theta^2 + eps), -8, 8): per-weight log dropout rate log(sigma^2/theta^2)."""
        raw = self.log_sigma2 - tf.math.log(tf.square(self.theta) + self.eps)
        return tf.clip_by_value(raw, LOG_ALPHA_RANGE[0], LOG_ALPHA_RANGE[1])

    def keep_mask(self):
        """1.0 for weights kept at inference, 0.0 where ``log_alpha > threshold`` (pruned)."""
        return tf.cast(self.log_alpha <= self.threshold, self.theta.dtype)

    def kl_divergence(self):
        """Sum over weights of the KL to the log-uniform prior (unscaled; add_loss gets it / num_examples)."""
        return tf.reduce_sum(log_uniform_kl(self.log_alpha))

    def outputs_from_preactivation(self, z):
        """The layer's output from its pre-activation ``z``.

        Adds the KL term (``add_loss``), the bias and the activation. ``call`` and the per-example clipping
        rule both end with it.
        """
        self.add_loss(self.kl_weight * self.kl_divergence() / float(self.num_examples))
        if self.use_bias:
            z = tf.nn.bias_add(z, self.bias)
        return self.activation(z) if self.activation is not None else z

    def sample_preactivation(self, mean, variance):
        """``mean + sqrt(variance + eps) * N(0, 1)``, independently per example and unit.

        The local reparameterization of Kingma et al. 2015.
        """
        return mean + tf.sqrt(variance + self.eps) * tf.random.normal(tf.shape(mean), dtype=mean.dtype)

    def _common_config(self):
        return {
            "num_examples": self.num_examples,
            "kl_weight": self.kl_weight,
            "threshold": self.threshold,
            "eps": self.eps,
            "use_bias": self.use_bias,
            "activation": tf.keras.activations.serialize(self.activation),
            "theta_initializer": tf.keras.initializers.serialize(self.theta_initializer),
            "log_sigma2_initializer": tf.keras.initializers.serialize(self.log_sigma2_initializer),
            "bias_initializer": tf.keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": tf.keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": tf.keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": tf.keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": tf.keras.constraints.serialize(self.bias_constraint),
        }


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DenseVariational(_VariationalMixin, tf.keras.layers.Layer):
    """Dense layer with variational dropout (Ermis & Cemgil 2017a, eq. 10; Molchanov et al. 2017).

    Variables (read by the per-example clipping engine):
      ``theta``: kernel means, shape [in, out]; ``log_sigma2``: log sigma^2 per weight, [in, out];
      ``bias``: deterministic bias [out] (absent if ``use_bias=False``). Attributes: ``activation``,
      ``num_examples`` (the KL is added with ``add_loss`` scaled by ``kl_weight`` / num_examples, the
      per-example ELBO term), ``kl_weight`` (1.0: the ELBO of Ermis & Cemgil 2017a; below 1 a tempered
      posterior, Wenzel et al. 2020: under DP the clipped data term is weaker than the unclipped KL, whose
      gradient in theta, about 1/theta per weight, then shrinks the means and the logits, making the model
      under-confident; docs/results.md measures it), ``threshold`` (pruning), ``log_alpha`` (property,
      clipped to ``LOG_ALPHA_RANGE`` = [-8, 8]).

    Training (local reparameterization, independent noise per example and unit):
      z = x theta + b + sqrt(x^2 exp(log_sigma2) + eps) * N(0, 1).
    Inference: z = x (theta * m) + b with m = [log_alpha <= threshold] (pruned weights are exactly 0).
    MC sampling (``tfdpbnn.layers.mc_sampling()``): local reparameterization with pruned mean and variance,
      z = x (theta m) + b + sqrt(x^2 (exp(log_sigma2) m) + eps) N(0, 1).
    """

    def __init__(self, units, num_examples, activation=None, use_bias=True, threshold=3.0, eps=1e-8,
                 theta_initializer="glorot_uniform", log_sigma2_initializer=None,
                 bias_initializer="zeros", kernel_regularizer=None, bias_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, kl_weight=1.0, **kwargs):
        _checks.refuse(kwargs, {"kernel_initializer": "the kernel is the mean theta: use theta_initializer"})
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        if log_sigma2_initializer is None:
            log_sigma2_initializer = tf.keras.initializers.Constant(-10.0)
        self._init_common(num_examples, threshold, eps, use_bias, activation, theta_initializer,
                          log_sigma2_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
                          kernel_constraint, bias_constraint, kl_weight)

    def build(self, input_shape):
        """Create ``theta``, ``log_sigma2`` [in, units] and, with ``use_bias``, ``bias`` [units]."""
        in_dim = tf.TensorShape(input_shape)[-1]
        if in_dim is None:
            raise ValueError("inputs: the last dimension of the input must be known")
        self._add_weights((int(in_dim), self.units), self.units)
        super().build(input_shape)

    def call(self, inputs, training=None):
        """Variational-dropout pre-activation (Ermis & Cemgil 2017a, eq. 10), then KL term, bias, activation.

        Training: sampled by local reparameterization; inference: x (theta * m) with the pruning mask m;
        under ``mc_sampling()``: sampled with the masked theta and variance.
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.theta.dtype)

        def train():
            return self.sample_preactivation(*self.preactivation_moments(inputs))

        def infer():
            return tf.matmul(inputs, self.theta * self.keep_mask())

        def mc():
            mask = self.keep_mask()
            return self.sample_preactivation(tf.matmul(inputs, self.theta * mask),
                                             tf.matmul(tf.square(inputs), tf.exp(self.log_sigma2) * mask))

        return self.outputs_from_preactivation(select(training, train, infer, mc))

    def preactivation_moments(self, inputs):
        """Training pre-activation moments without bias and eps (Ermis & Cemgil 2017 eq. 10).

        Returns ``(x theta, x^2 exp(log_sigma2))`` (local reparameterization). ``call`` samples from them;
        the clipping rule reads the same tensors for the per-example gradients.
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.theta.dtype)
        return tf.matmul(inputs, self.theta), tf.matmul(tf.square(inputs), tf.exp(self.log_sigma2))

    def compute_output_shape(self, input_shape):
        """The input shape with the last dimension replaced by ``units``."""
        return tf.TensorShape(input_shape)[:-1].concatenate([self.units])

    def get_config(self):
        """The config with ``units`` and the variational-dropout settings, for Keras serialization."""
        config = super().get_config()
        config.update({"units": self.units, **self._common_config()})
        return config


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class Conv2DVariational(_VariationalMixin, tf.keras.layers.Layer):
    """2-D convolution with variational dropout (Ermis & Cemgil 2017a, eq. 10; Molchanov et al. 2017), NHWC.

    Variables: ``theta`` [kh, kw, in, out], ``log_sigma2`` [kh, kw, in, out], ``bias`` [out]; attributes
    ``activation``, ``num_examples``, ``threshold``, ``log_alpha`` as in ``DenseVariational``.
    Training (local reparameterization for convolutions):
      z = conv(x, theta) + b + sqrt(conv(x^2, exp(log_sigma2)) + eps) * N(0, 1)  (independent per output).
    Inference: conv(x, theta * m) + b with the pruning mask m; MC sampling as in training with theta*m and
    exp(log_sigma2)*m.
    """

    def __init__(self, filters, kernel_size, num_examples, strides=1, padding="valid", activation=None,
                 use_bias=True, threshold=3.0, eps=1e-8, theta_initializer="glorot_uniform",
                 log_sigma2_initializer=None, bias_initializer="zeros", data_format=None, dilation_rate=1,
                 kernel_regularizer=None, bias_regularizer=None, kernel_constraint=None, bias_constraint=None,
                 kl_weight=1.0, **kwargs):
        _checks.refuse(kwargs, {"kernel_initializer": "the kernel is the mean theta: use theta_initializer",
                                "groups": "grouped convolutions have no per-example clipping rule here"})
        super().__init__(**kwargs)
        (self.filters, self.kernel_size, self.strides, self.padding, self.data_format,
         self.dilation_rate) = _checks.conv2d_arguments(filters, kernel_size, strides, padding, data_format,
                                                        dilation_rate)
        if log_sigma2_initializer is None:
            log_sigma2_initializer = tf.keras.initializers.Constant(-10.0)
        self._init_common(num_examples, threshold, eps, use_bias, activation, theta_initializer,
                          log_sigma2_initializer, bias_initializer, kernel_regularizer, bias_regularizer,
                          kernel_constraint, bias_constraint, kl_weight)

    def build(self, input_shape):
        """Create ``theta``, ``log_sigma2`` [kh, kw, in, filters] and (``use_bias``) ``bias`` [filters]."""
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank != 4 or input_shape[-1] is None:
            raise ValueError(f"inputs: expected shape [batch, height, width, channels] with known channels, "
                             f"got {input_shape}")
        self._add_weights(self.kernel_size + (int(input_shape[-1]), self.filters), self.filters)
        super().build(input_shape)

    def _conv(self, x, kernel):
        return tf.nn.conv2d(x, kernel, strides=(1,) + self.strides + (1,), padding=self.padding.upper())

    def preactivation_moments(self, inputs):
        """Training pre-activation moments without bias and eps (local reparameterization for convolutions).

        Returns ``(conv(x, theta), conv(x^2, exp(log_sigma2)))``; shared by ``call`` and the clipping rule.
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.theta.dtype)
        return self._conv(inputs, self.theta), self._conv(tf.square(inputs), tf.exp(self.log_sigma2))

    def call(self, inputs, training=None):
        """Convolutional pre-activation by variational dropout, then KL term, bias and activation.

        Training: sampled by local reparameterization; inference: conv(x, theta * m) with the pruning mask m;
        under ``mc_sampling()``: sampled with the masked theta and variance.
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.theta.dtype)

        def train():
            return self.sample_preactivation(*self.preactivation_moments(inputs))

        def infer():
            return self._conv(inputs, self.theta * self.keep_mask())

        def mc():
            mask = self.keep_mask()
            return self.sample_preactivation(self._conv(inputs, self.theta * mask),
                                             self._conv(tf.square(inputs), tf.exp(self.log_sigma2) * mask))

        return self.outputs_from_preactivation(select(training, train, infer, mc))

    def compute_output_shape(self, input_shape):
        """[batch, out_height, out_width, filters] for the kernel size, strides and padding."""
        return conv2d_output_shape(input_shape, self.kernel_size, self.strides, self.padding, self.filters)

    def get_config(self):
        """The config with the convolution and variational-dropout settings, for Keras serialization."""
        config = super().get_config()
        config.update({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
                       "padding": self.padding, "data_format": self.data_format,
                       "dilation_rate": self.dilation_rate, **self._common_config()})
        return config
