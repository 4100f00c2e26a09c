"""Clipping rule of ``tf.keras.layers.Dense`` (and of any affine layer ``z = x W + b``)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.registry import ClippingRule
from tfdpbnn.clipping.rules.preactivation import call_preactivation


class DenseRule(ClippingRule):
    """``z = x W + b``: per-example ``dL_i/dW = x_i^T g_i`` (Goodfellow 2015); ghost norm, book-keeping."""

    def variables(self, layer):
        return [v for v in (layer.kernel, layer.bias) if v is not None]

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs, z = call_preactivation(layer, call, inputs, *args, **kwargs)
        return outputs, [z], tf.cast(inputs, z.dtype)

    def squared_norms(self, layer, context, grads):
        return dense_squared_norms(context, grads[0], layer.bias is not None)

    def clipped_sums(self, layer, context, grads, factors):
        return dense_clipped_sums(context, grads[0], factors, layer.bias is not None)


def dense_squared_norms(x, g, has_bias: bool) -> list:
    """``[||x_i^T g_i||^2, ||sum_t g_it||^2]`` (kernel, then bias if ``has_bias``) per example."""
    a, b = ops.flatten_positions(x), ops.flatten_positions(g)
    norms = [ops.outer_squared_norms(a, b)]
    if has_bias:
        norms.append(ops.summed_squared_norms(b))
    return norms


def dense_clipped_sums(x, g, factors, has_bias: bool) -> list:
    """``[sum_i c_i x_i^T g_i, sum_i c_i sum_t g_it]`` (kernel, then bias if ``has_bias``)."""
    a, b = ops.flatten_positions(x), ops.flatten_positions(g)
    sums = [ops.outer_clipped_sum(a, b, factors)]
    if has_bias:
        sums.append(ops.summed_clipped(b, factors))
    return sums
