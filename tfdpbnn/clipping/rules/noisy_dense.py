"""Clipping rule of ``tfdpbnn.layers.NoisyDense`` (SI-DPSGD, Davody et al. 2020)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.registry import ClippingRule
from tfdpbnn.clipping.rules.dense import dense_clipped_sums, dense_squared_norms


class NoisyDenseRule(ClippingRule):
    """``z = x (mu + s xi) + b``: ``d theta / d mu = I``, so ``dL_i/dmu = x_i^T g_i`` as for a dense layer.

    The tap is the layer's own ``preactivation`` (one noisy weight sample per call), run once.
    """

    def variables(self, layer):
        return [v for v in (layer.kernel, layer.bias) if v is not None]

    def forward(self, layer, call, inputs, *args, **kwargs):
        x = tf.convert_to_tensor(inputs, dtype=layer.kernel.dtype)
        z = layer.preactivation(x, *args, **kwargs)
        outputs = layer.activation(z) if layer.activation is not None else z
        return outputs, [z], x

    def squared_norms(self, layer, context, grads):
        return dense_squared_norms(context, grads[0], layer.bias is not None)

    def clipped_sums(self, layer, context, grads, factors):
        return dense_clipped_sums(context, grads[0], factors, layer.bias is not None)
