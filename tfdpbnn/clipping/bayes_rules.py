"""Fast clipping rules for the tfdpbnn layers: variational dropout, Bayes by Backprop, noisy and public-BN.

Derivations in docs/fast_clipping.md. The variance parameters enter through local reparameterization
``z = m + sqrt(v) * xi`` with ``m`` and ``v`` linear in the example's input (``x`` and ``x^2``), so their
per-example gradients are again outer products of per-example quantities: with ``h = g * xi / (2 sqrt(v))``
(``g`` = output gradient), ``dL_i/dlog_sigma2 = exp(log_sigma2) * (x_i^2 (x) h_i)`` (Ermis & Cemgil 2017a, eq.
10 with
Kingma et al. 2015's local reparameterization).
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.keras_rules import AffineNormalizationRule, Conv2DRule, DenseRule
from tfdpbnn.clipping.registry import ClippingRule, mark_unsupported, register_rule
from tfdpbnn.layers import (
    AppendPublicBatch,
    Conv2DVariational,
    DenseBayesByBackprop,
    DenseVariational,
    NoisyConv2D,
    NoisyDense,
    PublicBatchNormalization,
)
from tfdpbnn.uncertainty.regression import HeteroscedasticHead


def _training_reason(kwargs) -> str | None:
    """The variance rules below hold for the training branch (local reparameterization) only."""
    training = kwargs.get("training")
    static = tf.get_static_value(training) if training is not None else None
    if static is True or static == 1:
        return None
    return f"training={training!r}: the fast rule needs the training branch (training=True)"


def _conv_backprop(layer, x, out_grad):
    """``sum`` over examples and positions of patches(x)^T out_grad, shaped like the kernel."""
    return tf.compat.v1.nn.conv2d_backprop_filter(
        x, tf.shape(layer.theta if hasattr(layer, "theta") else layer.kernel), out_grad,
        strides=[1, *layer.strides, 1], padding=layer.padding.upper())


class NoisyDenseRule(DenseRule):
    """``z = x (mu + s eps) + b``: ``d theta / d mu = I``, so ``dL_i/dmu = x_i^T g_i`` (Davody et al.
    2020)."""


class NoisyConv2DRule(Conv2DRule):
    """``NoisyConv2D`` (Davody et al. 2020): conv with the sampled kernel; ``dL_i/dkernel = patches(x_i)^T
    g_i``."""

    def unsupported_reason(self, layer):
        return None

    def dilation(self, layer):
        return (1, 1)


class _VariationalContext:
    def __init__(self, x, noise, var):
        self.x, self.noise, self.var = x, noise, var   # noise = sqrt(v) xi, var = v (eps included)


class DenseVariationalRule(ClippingRule):
    """``DenseVariational`` in training (Ermis & Cemgil 2017a, eq. 10, local reparameterization).

    ``z = x theta + b + sqrt(v) xi``, ``v = x^2 exp(log_sigma2) + eps``. Per example:
    ``dL/dtheta = x^T g``, ``dL/db = g``, ``dL/dlog_sigma2 = exp(log_sigma2) * (x^2)^T h`` with
    ``h = g xi / (2 sqrt(v)) = g (sqrt(v) xi) / (2 v)``; squared norm ``(x^4)^T exp(2 log_sigma2) h^2``.
    """

    def variables(self, layer):
        return [v for v in (layer.theta, layer.log_sigma2, layer.bias) if v is not None]

    def call_unsupported_reason(self, layer, inputs, *args, **kwargs):
        return _training_reason(kwargs)

    def _forward_parts(self, layer, x):
        mean = tf.matmul(x, layer.theta)
        var = tf.matmul(tf.square(x), tf.exp(layer.log_sigma2))
        return mean, var

    def forward(self, layer, call, inputs, *args, **kwargs):
        x = tf.convert_to_tensor(inputs, dtype=layer.theta.dtype)
        mean, var = self._forward_parts(layer, x)
        z = layer._reparam(mean, var)          # the layer's own sampling: mean + sqrt(var + eps) * N(0, 1)
        outputs = layer._finish(z)             # KL add_loss, bias, activation
        return outputs, [z], _VariationalContext(x, z - mean, var + layer.eps)

    def _h(self, context, g):
        return g * context.noise / (2.0 * context.var)

    def squared_norms(self, layer, context, grads):
        g = grads[0]
        a, b = ops.flatten_positions(context.x), ops.flatten_positions(g)
        h = ops.flatten_positions(self._h(context, g))
        norms = [ops.outer_squared_norms(a, b),
                 ops.outer_squared_norms(tf.square(a), h, weight_sq=tf.exp(2.0 * layer.log_sigma2))]
        if layer.bias is not None:
            norms.append(ops.summed_squared_norms(b))
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        g = grads[0]
        a, b = ops.flatten_positions(context.x), ops.flatten_positions(g)
        h = ops.flatten_positions(self._h(context, g))
        sums = [ops.outer_clipped_sum(a, b, factors),
                tf.exp(layer.log_sigma2) * ops.outer_clipped_sum(tf.square(a), h, factors)]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(b, factors))
        return sums


class Conv2DVariationalRule(DenseVariationalRule):
    """``Conv2DVariational`` in training: the dense rule on input patches (im2col), per output position.

    ``z = conv(x, theta) + b + sqrt(conv(x^2, exp(log_sigma2)) + eps) xi``; ``dL_i/dlog_sigma2 =
    exp(log_sigma2) * patches(x_i^2)^T h_i`` (per-example gradients materialized as [D, K] for the norm).
    """

    def _forward_parts(self, layer, x):
        return layer._conv(x, layer.theta), layer._conv(tf.square(x), tf.exp(layer.log_sigma2))

    def _geometry(self, layer):
        return layer.kernel_size, layer.strides, (1, 1), layer.padding

    def squared_norms(self, layer, context, grads):
        g = grads[0]
        geometry = self._geometry(layer)
        if ops.conv_materialize_is_cheaper(layer.kernel_size, context.x.shape[-1], g):
            theta_norms = ops.squared_norms_of(ops.conv_per_example_gradients(context.x, g, *geometry))
        else:
            theta_norms = ops.outer_squared_norms(ops.conv_patches(context.x, *geometry),
                                                  ops.flatten_positions(g))
        h = self._h(context, g)
        e2 = tf.reshape(tf.exp(2.0 * layer.log_sigma2), [-1, layer.filters])
        log_sigma2_grads = ops.conv_per_example_gradients(tf.square(context.x), h, *geometry)
        norms = [theta_norms, ops.squared_norms_of(log_sigma2_grads, e2)]
        if layer.bias is not None:
            norms.append(ops.summed_squared_norms(ops.flatten_positions(g)))
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        g = grads[0]
        c = factors[:, None, None, None]
        h = self._h(context, g)
        sums = [_conv_backprop(layer, context.x, g * c),
                tf.exp(layer.log_sigma2) * _conv_backprop(layer, tf.square(context.x), h * c)]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(ops.flatten_positions(g), factors))
        return sums


class DenseBayesByBackpropRule(ClippingRule):
    """``DenseBayesByBackprop`` (Zhang et al. 2022, sec. 3.2) with its local reparameterization.

    ``z = x mu_W + mu_b + sqrt(v) xi``, ``v = x^2 S^2 + s_b^2``, ``S = softplus(rho_W)``, ``s_b =
    softplus(rho_b)``. With ``h = g xi / sqrt(v)``: ``dL/dmu_W = x^T g``, ``dL/dmu_b = g``,
    ``dL/drho_W = sigmoid(rho_W) S * (x^2)^T h``, ``dL/drho_b = sigmoid(rho_b) s_b h``. In the mean branch
    (no sampling) ``xi = 0`` and the rho gradients vanish, which the same formulas give.
    """

    def variables(self, layer):
        candidates = (layer.kernel_mu, layer.kernel_rho, layer.bias_mu, layer.bias_rho)
        return [v for v in candidates if v is not None]

    def call_unsupported_reason(self, layer, inputs, *args, **kwargs):
        return _training_reason(kwargs)

    def forward(self, layer, call, inputs, *args, **kwargs):
        x = tf.convert_to_tensor(inputs, dtype=layer.kernel_mu.dtype)
        mean = tf.matmul(x, layer.kernel_mu)
        var = tf.matmul(tf.square(x), tf.square(tf.nn.softplus(layer.kernel_rho)))
        if layer.use_bias:
            mean = tf.nn.bias_add(mean, layer.bias_mu)
            var += tf.square(tf.nn.softplus(layer.bias_rho))
        z = mean + tf.sqrt(var) * tf.random.normal(tf.shape(mean), dtype=mean.dtype)
        layer.add_loss(layer.kl_divergence() / float(layer.num_examples))
        outputs = layer.activation(z) if layer.activation is not None else z
        return outputs, [z], _VariationalContext(x, z - mean, var)

    def _parts(self, layer, context, g):
        h = g * context.noise / context.var
        w = tf.sigmoid(layer.kernel_rho) * tf.nn.softplus(layer.kernel_rho)
        return ops.flatten_positions(context.x), ops.flatten_positions(g), ops.flatten_positions(h), w

    def _bias_rho_weight(self, layer):
        return tf.sigmoid(layer.bias_rho) * tf.nn.softplus(layer.bias_rho)

    def squared_norms(self, layer, context, grads):
        a, b, h, w = self._parts(layer, context, grads[0])
        norms = [ops.outer_squared_norms(a, b),
                 ops.outer_squared_norms(tf.square(a), h, weight_sq=tf.square(w))]
        if layer.use_bias:
            wb = self._bias_rho_weight(layer)
            norms += [ops.summed_squared_norms(b), ops.summed_squared_norms(h * wb)]
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        a, b, h, w = self._parts(layer, context, grads[0])
        sums = [ops.outer_clipped_sum(a, b, factors), w * ops.outer_clipped_sum(tf.square(a), h, factors)]
        if layer.use_bias:
            sums += [ops.summed_clipped(b, factors),
                     self._bias_rho_weight(layer) * ops.summed_clipped(h, factors)]
        return sums


class PublicBatchNormalizationRule(AffineNormalizationRule):
    """``PublicBatchNormalization`` (stored public batch): ``y = gamma xhat + beta``."""

    def unsupported_reason(self, layer):
        if layer.carried:
            return "carried=True: the statistics depend on earlier layers' weights through the public rows"
        return None

    def param_axes(self, layer, rank):
        return [layer._axis]

    def normalized(self, layer, inputs):
        x = tf.convert_to_tensor(inputs)
        mean, var = layer.public_statistics(x)
        return (x - mean) * tf.math.rsqrt(var + layer.epsilon)


register_rule(DenseVariational, DenseVariationalRule())
register_rule(Conv2DVariational, Conv2DVariationalRule())
register_rule(DenseBayesByBackprop, DenseBayesByBackpropRule())
register_rule(NoisyDense, NoisyDenseRule())
register_rule(NoisyConv2D, NoisyConv2DRule())
register_rule(PublicBatchNormalization, PublicBatchNormalizationRule())
# The regression head is an affine map with no activation: the Dense rule covers it exactly.
register_rule(HeteroscedasticHead, DenseRule())
mark_unsupported(AppendPublicBatch, "public rows carried through the network: every layer before a carried "
                 "PublicBatchNormalization gets gradient through the public statistics")
