"""Clipping rule of ``tfdpbnn.layers.DenseBayesByBackprop`` in training.

Blundell et al. 2015 with local reparameterization; DP-BBP of Zhang et al. 2021.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.registry import ClippingRule
from tfdpbnn.clipping.rules.training import SampledPreactivation, training_reason


class DenseBayesByBackpropRule(ClippingRule):
    """``DenseBayesByBackprop`` (Zhang et al. 2021 sec. 3.2) with its local reparameterization.

    ``z = x mu_W + mu_b + sqrt(v) xi``, ``v = x^2 S^2 + s_b^2``, ``S = softplus(rho_W)``, ``s_b =
    softplus(rho_b)``. With ``h = g xi / sqrt(v)``: ``dL/dmu_W = x^T g``, ``dL/dmu_b = g``,
    ``dL/drho_W = sigmoid(rho_W) S * (x^2)^T h``, ``dL/drho_b = sigmoid(rho_b) s_b h``. The forward pass is
    the layer's own (``preactivation_moments``, ``sample_preactivation``, ``outputs_from_preactivation``),
    run once; the tap is the sampled pre-activation before the bias mean (same gradient).
    """

    def variables(self, layer):
        candidates = (layer.kernel_mu, layer.kernel_rho, layer.bias_mu, layer.bias_rho)
        return [v for v in candidates if v is not None]

    def call_unsupported_reason(self, layer, inputs, *args, **kwargs):
        return training_reason(kwargs)

    def forward(self, layer, call, inputs, *args, **kwargs):
        x = tf.convert_to_tensor(inputs, dtype=layer.kernel_mu.dtype)
        mean, var = layer.preactivation_moments(x)
        z = layer.sample_preactivation(mean, var)
        return layer.outputs_from_preactivation(z), [z], SampledPreactivation(x, z - mean, var)

    def _parts(self, layer, context, g):
        h = g * context.noise / context.var
        w = tf.sigmoid(layer.kernel_rho) * tf.nn.softplus(layer.kernel_rho)
        return ops.flatten_positions(context.x), ops.flatten_positions(g), ops.flatten_positions(h), w

    @staticmethod
    def _bias_rho_weight(layer):
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
