"""Clipping rule of ``tfdpbnn.layers.DenseVariational`` in training.

Ermis & Cemgil 2017's DPVD with the local reparameterization of Kingma et al. 2015.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.registry import ClippingRule
from tfdpbnn.clipping.rules.training import SampledPreactivation, training_reason


class DenseVariationalRule(ClippingRule):
    """``DenseVariational`` in training (Ermis & Cemgil 2017 eq. 10, local reparameterization).

    ``z = x theta + b + sqrt(v) xi``, ``v = x^2 exp(log_sigma2) + eps``. Per example:
    ``dL/dtheta = x^T g``, ``dL/db = g``, ``dL/dlog_sigma2 = exp(log_sigma2) * (x^2)^T h`` with
    ``h = g xi / (2 sqrt(v)) = g (sqrt(v) xi) / (2 v)``; squared norm ``(x^4)^T exp(2 log_sigma2) h^2``.
    The forward pass is the layer's own (``preactivation_moments``, ``sample_preactivation``,
    ``outputs_from_preactivation``), run once.
    """

    def variables(self, layer):
        return [v for v in (layer.theta, layer.log_sigma2, layer.bias) if v is not None]

    def call_unsupported_reason(self, layer, inputs, *args, **kwargs):
        return training_reason(kwargs)

    def forward(self, layer, call, inputs, *args, **kwargs):
        x = tf.convert_to_tensor(inputs, dtype=layer.theta.dtype)
        mean, var = layer.preactivation_moments(x)
        z = layer.sample_preactivation(mean, var)
        return layer.outputs_from_preactivation(z), [z], SampledPreactivation(x, z - mean, var + layer.eps)

    @staticmethod
    def log_sigma2_output_grad(context, g):
        """``h = g xi / (2 sqrt(v))``: the output gradient seen by the variance branch."""
        return g * context.noise / (2.0 * context.var)

    def squared_norms(self, layer, context, grads):
        g = grads[0]
        a, b = ops.flatten_positions(context.x), ops.flatten_positions(g)
        h = ops.flatten_positions(self.log_sigma2_output_grad(context, g))
        norms = [ops.outer_squared_norms(a, b),
                 ops.outer_squared_norms(tf.square(a), h, weight_sq=tf.exp(2.0 * layer.log_sigma2))]
        if layer.bias is not None:
            norms.append(ops.summed_squared_norms(b))
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        g = grads[0]
        a, b = ops.flatten_positions(context.x), ops.flatten_positions(g)
        h = ops.flatten_positions(self.log_sigma2_output_grad(context, g))
        sums = [ops.outer_clipped_sum(a, b, factors),
                tf.exp(layer.log_sigma2) * ops.outer_clipped_sum(tf.square(a), h, factors)]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(b, factors))
        return sums
