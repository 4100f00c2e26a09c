"""Bayes by Backprop dense layer (Blundell et al. 2015; Zhang et al. (2022, section 3.2), DP-BBP)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from tfdpbnn._validation import check_positive_int, check_real
from tfdpbnn.layers.sampling import select

tfd = tfp.distributions


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class DenseBayesByBackprop(tf.keras.layers.Layer):
    """Dense layer with a factorized Gaussian posterior, Bayes by Backprop (Zhang et al. 2022, sec. 3.2).

    Posterior per weight: w ~ N(mu, softplus(rho)^2); prior N(0, prior_scale^2), or per-weight N(loc, scale^2)
    set by ``set_prior`` (non-trainable variables ``prior_kernel_loc``, ``prior_kernel_scale``,
    ``prior_bias_loc``, ``prior_bias_scale``, saved with the weights). The closed-form
    KL(q || p) summed over kernel and bias (``tfp.distributions.kl_divergence`` of two Normals) is added with
    ``add_loss`` scaled by 1/``num_examples`` (the per-example term of the ELBO, Zhang et al. (2022, sec.
    3.2)).

    Variables (read by the per-example clipping engine): ``kernel_mu``, ``kernel_rho`` [in, out];
    ``bias_mu``, ``bias_rho`` [out] (absent if ``use_bias=False``). Attributes ``prior_scale``,
    ``num_examples``, ``activation``.

    Gradient estimator: local reparameterization (Kingma et al. 2015), not one weight sample per batch:
      z = x mu_W + mu_b + sqrt(x^2 softplus(rho_W)^2 + softplus(rho_b)^2) * eps,  eps ~ N(0, 1)
    independently per example and unit. This has the same marginal distribution of each pre-activation as
    sampling the weights, makes the examples' noises independent, and the pre-activation is mean + std * eps.
    Sampled in training and under ``tfdpbnn.layers.mc_sampling()``; otherwise the posterior mean
    z = x mu_W + mu_b.
    """

    def __init__(self, units, num_examples, prior_scale=1.0, activation=None, use_bias=True,
                 kernel_mu_initializer="glorot_uniform", kernel_rho_initializer=None,
                 bias_mu_initializer="zeros", bias_rho_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.units = check_positive_int("units", units)
        self.num_examples = check_positive_int("num_examples", num_examples)
        self.prior_scale = check_real("prior_scale", prior_scale, low=0.0, low_open=True)
        self.activation = tf.keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        default_rho = tf.keras.initializers.Constant(-5.0)
        self.kernel_mu_initializer = tf.keras.initializers.get(kernel_mu_initializer)
        self.kernel_rho_initializer = tf.keras.initializers.get(kernel_rho_initializer or default_rho)
        self.bias_mu_initializer = tf.keras.initializers.get(bias_mu_initializer)
        self.bias_rho_initializer = tf.keras.initializers.get(bias_rho_initializer or default_rho)

    def build(self, input_shape):
        """Create ``kernel_mu``, ``kernel_rho`` [in, units] and (``use_bias``) ``bias_mu``, ``bias_rho``."""
        in_dim = tf.TensorShape(input_shape)[-1]
        if in_dim is None:
            raise ValueError("inputs: the last dimension of the input must be known")
        shape = (int(in_dim), self.units)
        self.kernel_mu = self.add_weight(name="kernel_mu", shape=shape,
                                         initializer=self.kernel_mu_initializer)
        self.kernel_rho = self.add_weight(name="kernel_rho", shape=shape,
                                          initializer=self.kernel_rho_initializer)
        if self.use_bias:
            self.bias_mu = self.add_weight(name="bias_mu", shape=(self.units,),
                                           initializer=self.bias_mu_initializer)
            self.bias_rho = self.add_weight(name="bias_rho", shape=(self.units,),
                                            initializer=self.bias_rho_initializer)
        else:
            self.bias_mu = self.bias_rho = None
        # The prior N(loc, scale^2) per weight: not trained, N(0, prior_scale^2) until set_prior.
        zeros, scale = "zeros", tf.keras.initializers.Constant(self.prior_scale)
        self.prior_kernel_loc = self.add_weight(name="prior_kernel_loc", shape=shape, initializer=zeros,
                                                trainable=False)
        self.prior_kernel_scale = self.add_weight(name="prior_kernel_scale", shape=shape, initializer=scale,
                                                  trainable=False)
        if self.use_bias:
            self.prior_bias_loc = self.add_weight(name="prior_bias_loc", shape=(self.units,),
                                                  initializer=zeros, trainable=False)
            self.prior_bias_scale = self.add_weight(name="prior_bias_scale", shape=(self.units,),
                                                    initializer=scale, trainable=False)
        else:
            self.prior_bias_loc = self.prior_bias_scale = None
        super().build(input_shape)

    def set_prior(self, kernel_loc, kernel_scale, bias_loc=None, bias_scale=None, *, public_reason=None):
        """Set the Gaussian prior N(loc, scale^2) of every weight (e.g. a posterior fit on public data).

        Empirical-Bayes use of public data (Blundell et al. 2015's prior, its parameters from a public fit):
        ``kernel_loc``/``kernel_scale`` broadcast to [in, units], ``bias_loc``/``bias_scale`` to [units]
        (required with ``use_bias``, refused without). Scales must be > 0 and finite. Build the layer first.
        The prior enters the KL term after clipping and noise, so the DP optimizers cannot bound what it
        carries: ``public_reason`` (required: which public data the parameters come from) asserts that they
        come from public data only. It is written to the privacy statement under ``asserted_by_user`` and
        holds for the prior set now (``tfdpbnn.preprocessing.assert_public_preprocessing``); a prior changed
        otherwise (assigned, or set again during training) is refused by the DP optimizers' state checks.
        """
        if not isinstance(public_reason, str) or not public_reason.strip():
            raise ValueError("public_reason: a non-empty string saying which public data the prior's "
                             "parameters come from (a prior computed from the private records is not covered "
                             f"by any epsilon), got {public_reason!r}")
        if not self.built:
            raise ValueError("set_prior: build the layer first (call it on an input or build the model)")
        if self.use_bias and (bias_loc is None or bias_scale is None):
            raise ValueError("bias_loc and bias_scale are required: the layer has a bias (use_bias=True)")
        if not self.use_bias and (bias_loc is not None or bias_scale is not None):
            raise ValueError("bias_loc and bias_scale must be None: the layer has no bias (use_bias=False)")
        pairs = [("kernel", self.prior_kernel_loc, self.prior_kernel_scale, kernel_loc, kernel_scale)]
        if self.use_bias:
            pairs.append(("bias", self.prior_bias_loc, self.prior_bias_scale, bias_loc, bias_scale))
        values = []
        for name, loc_var, scale_var, loc, scale in pairs:
            shape = tuple(loc_var.shape)
            try:
                loc = np.broadcast_to(np.asarray(loc, dtype=np.float64), shape)
                scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), shape)
            except ValueError as err:
                raise ValueError(f"{name}_loc and {name}_scale must broadcast to {shape}") from err
            if not np.all(np.isfinite(loc)):
                raise ValueError(f"{name}_loc must be finite")
            if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
                raise ValueError(f"{name}_scale must be finite and > 0 everywhere")
            values.append((loc_var, loc, scale_var, scale))
        for loc_var, loc, scale_var, scale in values:
            loc_var.assign(loc.astype(tf.as_dtype(loc_var.dtype).as_numpy_dtype))
            scale_var.assign(scale.astype(tf.as_dtype(scale_var.dtype).as_numpy_dtype))
        from tfdpbnn.preprocessing.checks import assert_public_preprocessing

        assert_public_preprocessing(self, f"the prior of {self.name!r} (set_prior): {public_reason.strip()}")

    def posterior(self):
        """The posterior's per-weight ``(kernel_loc, kernel_scale, bias_loc, bias_scale)`` as numpy arrays.

        loc = mu, scale = softplus(rho) (Blundell et al. 2015); bias entries None without a bias.
        """
        softplus = tf.nn.softplus
        kernel = (self.kernel_mu.numpy(), softplus(self.kernel_rho).numpy())
        bias = (self.bias_mu.numpy(), softplus(self.bias_rho).numpy()) if self.use_bias else (None, None)
        return kernel + bias

    def kl_divergence(self):
        """Closed-form KL(q || prior) summed over the weights (unscaled); default prior N(0, prior_scale^2).

        Blundell et al. (2015); the prior is per-weight N(loc, scale^2), set by ``set_prior``.
        """
        prior = tfd.Normal(self.prior_kernel_loc, self.prior_kernel_scale)
        posterior = tfd.Normal(self.kernel_mu, tf.nn.softplus(self.kernel_rho))
        kl = tf.reduce_sum(tfd.kl_divergence(posterior, prior))
        if self.use_bias:
            prior = tfd.Normal(self.prior_bias_loc, self.prior_bias_scale)
            posterior = tfd.Normal(self.bias_mu, tf.nn.softplus(self.bias_rho))
            kl += tf.reduce_sum(tfd.kl_divergence(posterior, prior))
        return kl

    def preactivation_moments(self, inputs):
        """Moments of the sampled pre-activation without the bias mean (local reparameterization).

        Returns ``(x mu_W, x^2 softplus(rho_W)^2 + softplus(rho_b)^2)``. ``call`` samples from them; the
        clipping rule reads the same tensors for the per-example gradients.
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.kernel_mu.dtype)
        mean = tf.matmul(inputs, self.kernel_mu)
        var = tf.matmul(tf.square(inputs), tf.square(tf.nn.softplus(self.kernel_rho)))
        if self.use_bias:
            var += tf.square(tf.nn.softplus(self.bias_rho))
        return mean, var

    def sample_preactivation(self, mean, variance):
        """``mean + sqrt(variance) * N(0, 1)``, independently per example and unit."""
        return mean + tf.sqrt(variance) * tf.random.normal(tf.shape(mean), dtype=mean.dtype)

    def outputs_from_preactivation(self, z):
        """The layer's output from the sampled pre-activation ``z`` (without bias).

        Adds the bias mean, the KL term (``add_loss``) and the activation. ``call`` and the clipping rule both
        end with it.
        """
        # bias added last (as in DenseVariational): keeps grappler from fusing MatMul+BiasAdd+Add+Relu
        # inside while loops, which TF 2.15 logs as an "empty op name" error
        if self.use_bias:
            z = tf.nn.bias_add(z, self.bias_mu)
        self.add_loss(self.kl_divergence() / float(self.num_examples))
        return self.activation(z) if self.activation is not None else z

    def call(self, inputs, training=None):
        """Sampled pre-activation (local reparameterization) in training or MC sampling, else posterior mean.

        Either way the bias mean, the KL term and the activation follow (``outputs_from_preactivation``).
        """
        inputs = tf.convert_to_tensor(inputs, dtype=self.kernel_mu.dtype)

        def sample():
            return self.sample_preactivation(*self.preactivation_moments(inputs))

        def mean():
            return tf.matmul(inputs, self.kernel_mu)

        return self.outputs_from_preactivation(select(training, sample, mean))

    def compute_output_shape(self, input_shape):
        """The input shape with the last dimension replaced by ``units``."""
        return tf.TensorShape(input_shape)[:-1].concatenate([self.units])

    def get_config(self):
        """The constructor arguments (initializers, activation serialized), for Keras serialization."""
        config = super().get_config()
        ser = tf.keras.initializers.serialize
        config.update({
            "units": self.units, "num_examples": self.num_examples, "prior_scale": self.prior_scale,
            "activation": tf.keras.activations.serialize(self.activation), "use_bias": self.use_bias,
            "kernel_mu_initializer": ser(self.kernel_mu_initializer),
            "kernel_rho_initializer": ser(self.kernel_rho_initializer),
            "bias_mu_initializer": ser(self.bias_mu_initializer),
            "bias_rho_initializer": ser(self.bias_rho_initializer),
        })
        return config
