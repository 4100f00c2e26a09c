"""Layers with Gaussian-perturbed weights, theta = mu + s * eps (SI-DPSGD, Davody et al. (2020) Alg. 1-2)."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from tfdpbnn._validation import check_positive_int, check_real
from tfdpbnn.layers import _checks
from tfdpbnn.layers._conv import conv2d_output_shape
from tfdpbnn.layers.sampling import select


class _NoisyMixin:
    """Noise variable, weight sampling and config shared by ``NoisyDense`` and ``NoisyConv2D``."""

    #: Non-trainable variables the DP optimizer sets (SI-DPSGD's s_t): not state the state checks compare.
    _tfdpbnn_managed_state = ("noise_stddev",)

    def _init_noise(self, noise_stddev, inference_noise, activation, use_bias, kernel_initializer,
                    bias_initializer):
        self._initial_noise_stddev = check_real("noise_stddev", noise_stddev, low=0.0)
        self.inference_noise = bool(inference_noise)
        self.activation = tf.keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)
        self.bias_initializer = tf.keras.initializers.get(bias_initializer)

    def _add_weights(self, kernel_shape, units):
        self.kernel = self.add_weight(name="kernel", shape=kernel_shape, initializer=self.kernel_initializer)
        self.bias = (self.add_weight(name="bias", shape=(units,), initializer=self.bias_initializer)
                     if self.use_bias else None)
        self.noise_stddev = self.add_weight(name="noise_stddev", shape=(), trainable=False,
            initializer=tf.keras.initializers.Constant(self._initial_noise_stddev))

    def set_noise_stddev(self, value):
        """Assign the noise std s (>= 0); optimizers may also ``assign`` the ``noise_stddev`` variable."""
        self.noise_stddev.assign(check_real("noise_stddev", value, low=0.0))

    def _noisy(self, var, private=True):
        """``var + s xi``, one fresh ``xi ~ N(0, I)``.

        ``xi`` is ``tf.random.normal`` for prediction-time sampling (``private=False``: MC signatures, whose
        noise is not the privacy noise and must not capture the optimizer's key in a SavedModel), and unless
        a ``SIDPOptimizer`` tracks this layer: then the exact-tailed
        draw of ``tfdpbnn.privacy.noise`` seeded by the optimizer's mechanism (``noise_seed``: a key from
        ``os.urandom`` per run and a step counter, or ``os.urandom`` per draw in secure mode), because in its
        paper mode ``xi`` is the privacy noise of the released theta and must not be replayable from a seed
        the process sets.
        """
        next_seed = getattr(self, "_tfdpbnn_noise_seed", None) if private else None
        if next_seed is None:
            noise = tf.random.normal(tf.shape(var), dtype=var.dtype)
        else:
            from tfdpbnn.privacy.noise import gaussian_noise_like

            noise = gaussian_noise_like([var], 1.0, seed=next_seed())[0]
        return var + tf.cast(self.noise_stddev, var.dtype) * noise

    def _weights(self, training):
        """(kernel, bias) used by this call: one noisy sample shared by the batch, or the means."""
        use_bias = self.use_bias

        def sample(private=True):
            return (self._noisy(self.kernel, private),
                    self._noisy(self.bias, private) if use_bias else tf.zeros([0]))

        def mc_sample():  # prediction-time sampling (MC signatures): not the DP step's noise
            return sample(private=False)

        def mean():
            return tf.identity(self.kernel), (tf.identity(self.bias) if use_bias else tf.zeros([0]))

        return select(training, sample, mc_sample if self.inference_noise else mean, mc_sample)

    def sample_weights_into_kernel(self):
        """Replace the means by one noisy sample: kernel <- kernel + s * eps, bias <- bias + s * eps.

        SI-DPSGD (Davody et al. 2020) releases sampled weights theta_T, not mu_T. Call this once before export
        in that mode; afterwards deterministic inference serves the sampled weights. ``noise_stddev`` is left
        as it is (set it to 0 if further MC sampling around the released sample is not wanted).
        """
        self.kernel.assign(self._noisy(self.kernel))
        if self.use_bias:
            self.bias.assign(self._noisy(self.bias))

    def preactivation(self, inputs, training=None):
        """The pre-activation ``z = x theta + b`` (``NoisyConv2D``: ``conv(x, theta) + b``).

        With this call's weights: one noisy sample theta = mu + s xi shared by the batch, or the means (see
        the class docstring). ``call`` applies the activation to it; the clipping rule taps it.
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.kernel.dtype)
        kernel, bias = self._weights(training)
        z = self._apply_kernel(inputs, kernel)
        return tf.nn.bias_add(z, bias) if self.use_bias else z

    def call(self, inputs, training=None):
        """The activation of ``preactivation(inputs, training)``."""
        z = self.preactivation(inputs, training=training)
        return self.activation(z) if self.activation is not None else z

    def _noise_config(self):
        ser = tf.keras.initializers.serialize
        value = (float(self.noise_stddev.numpy()) if getattr(self, "built", False)
                 and tf.executing_eagerly() else self._initial_noise_stddev)
        return {"noise_stddev": value, "inference_noise": self.inference_noise,
                "activation": tf.keras.activations.serialize(self.activation), "use_bias": self.use_bias,
                "kernel_initializer": ser(self.kernel_initializer),
                "bias_initializer": ser(self.bias_initializer)}


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class NoisyDense(_NoisyMixin, tf.keras.layers.Layer):
    """Dense layer with noisy weights theta = mu + s * N(0, I) (SI-DPSGD, Davody et al. (2020), Algorithm 1).

    The noisy weights are line 4 of Davody et al.'s (2020) Algorithm 1.
    Variables (read by the per-example clipping engine): ``kernel`` (= mu, [in, out]), ``bias`` (= mu of the
    bias, [out]) and ``noise_stddev``, a non-trainable scalar variable s that the optimizer assigns each step.
    In training one sample of (kernel, bias) is drawn per call and shared by the whole batch (Davody et al.
    (2020) draws theta_t once per step); each example's output depends only on its own input and that shared
    sample. Inference: the means (``inference_noise=False``, default) or a fresh sample per call
    (``inference_noise=True``); under ``tfdpbnn.layers.mc_sampling()`` always a sample. To serve one released
    sample as in the paper, call ``sample_weights_into_kernel()`` before export.
    """

    def __init__(self, units, noise_stddev=0.0, inference_noise=False, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self._init_noise(noise_stddev, inference_noise, activation, use_bias, kernel_initializer,
                         bias_initializer)

    def build(self, input_shape):
        """Create ``kernel`` [in, units], ``bias`` [units] and the ``noise_stddev`` variable."""
        in_dim = tf.TensorShape(input_shape)[-1]
        if in_dim is None:
            raise ValueError("inputs: the last dimension of the input must be known")
        self._add_weights((int(in_dim), self.units), self.units)
        super().build(input_shape)

    def _apply_kernel(self, inputs, kernel):
        return tf.matmul(inputs, kernel)

    def compute_output_shape(self, input_shape):
        """The input shape with the last dimension replaced by ``units``."""
        return tf.TensorShape(input_shape)[:-1].concatenate([self.units])

    def get_config(self):
        """The config with ``units`` and the noise settings, for Keras serialization."""
        config = super().get_config()
        config.update({"units": self.units, **self._noise_config()})
        return config


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class NoisyConv2D(_NoisyMixin, tf.keras.layers.Layer):
    """2-D convolution (NHWC) with noisy weights theta = mu + s * N(0, I) (SI-DPSGD, Davody et al. (2020)).

    Variables: ``kernel`` [kh, kw, in, out], ``bias`` [out], ``noise_stddev`` (non-trainable scalar);
    sampling rules as in ``NoisyDense``.
    """

    def __init__(self, filters, kernel_size, strides=1, padding="valid", noise_stddev=0.0,
                 inference_noise=False, activation=None, use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", data_format=None, dilation_rate=1, **kwargs):
        super().__init__(**kwargs)
        (self.filters, self.kernel_size, self.strides, self.padding, self.data_format,
         self.dilation_rate) = _checks.conv2d_arguments(filters, kernel_size, strides, padding, data_format,
                                                        dilation_rate)
        self._init_noise(noise_stddev, inference_noise, activation, use_bias, kernel_initializer,
                         bias_initializer)

    def build(self, input_shape):
        """Create ``kernel`` [kh, kw, in, filters], ``bias`` [filters] and the ``noise_stddev`` variable."""
        input_shape = tf.TensorShape(input_shape)
        if input_shape.rank != 4 or input_shape[-1] is None:
            raise ValueError(f"inputs: expected shape [batch, height, width, channels] with known channels, "
                             f"got {input_shape}")
        self._add_weights(self.kernel_size + (int(input_shape[-1]), self.filters), self.filters)
        super().build(input_shape)

    def _apply_kernel(self, inputs, kernel):
        return tf.nn.conv2d(inputs, kernel, strides=(1,) + self.strides + (1,), padding=self.padding.upper())

    def compute_output_shape(self, input_shape):
        """[batch, out_height, out_width, filters] for the kernel size, strides and padding."""
        return conv2d_output_shape(input_shape, self.kernel_size, self.strides, self.padding, self.filters)

    def get_config(self):
        """The config with the convolution and noise settings, for Keras serialization."""
        config = super().get_config()
        config.update({"filters": self.filters, "kernel_size": self.kernel_size, "strides": self.strides,
                       "padding": self.padding, "data_format": self.data_format,
                       "dilation_rate": self.dilation_rate, **self._noise_config()})
        return config


@contextlib.contextmanager
def without_dp_noise_keys(model):
    """Detach the optimizer's noise key from ``model``'s noisy layers while the block runs.

    A SavedModel must not capture the DP optimizer's noise key (its variables are kept out of every file
    on purpose, ``tfdpbnn.privacy.noise``), and the noise a served model samples is prediction-time noise,
    not the DP step's: ``export_saved_model`` traces and saves inside this block, where the layers draw
    ``tf.random.normal`` (as without a ``SIDPOptimizer``).
    """
    from tfdpbnn import _private_api

    detached = [(layer, layer.__dict__.pop("_tfdpbnn_noise_seed"))
                for layer in [model, *_private_api.sublayers(model)]
                if "_tfdpbnn_noise_seed" in layer.__dict__]
    try:
        yield
    finally:
        for layer, seed in detached:
            layer._tfdpbnn_noise_seed = seed
