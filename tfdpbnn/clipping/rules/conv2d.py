"""Clipping rule of ``tf.keras.layers.Conv2D`` (NHWC, groups 1; any stride, dilation, valid/same padding)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.registry import ClippingRule
from tfdpbnn.clipping.rules.preactivation import call_preactivation


class ConvContext:
    """Input of a convolution and, once computed, its per-example kernel gradients ``[B, D, K]``."""

    def __init__(self, x):
        self.x = x
        self.per_example = None


def conv_geometry(layer) -> tuple:
    """``(kernel_size, strides, dilation_rate, padding)`` of a 2-D convolution (dilation 1 if absent)."""
    return layer.kernel_size, layer.strides, tuple(getattr(layer, "dilation_rate", (1, 1))), layer.padding


def conv_unsupported_reason(layer) -> str | None:
    """Why a 2-D convolution's configuration has no fast rule (channels-first, groups, other padding)."""
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        return f"data_format={layer.data_format!r}"
    if getattr(layer, "groups", 1) != 1:
        return "groups != 1"
    if layer.padding not in ("valid", "same"):
        return f"padding={layer.padding!r}"
    return None


def conv_kernel_backprop(x, kernel_shape, out_grad, geometry):
    """``sum`` over examples and positions of ``patches(x)^T out_grad``, shaped like the kernel."""
    _, strides, dilation, padding = geometry
    return tf.compat.v1.nn.conv2d_backprop_filter(
        x, kernel_shape, out_grad, strides=[1, *strides, 1], padding=padding.upper(),
        dilations=[1, *dilation, 1])


class Conv2DRule(ClippingRule):
    """2-D convolution as a matmul of input patches (im2col) with the reshaped kernel, as ``DenseRule``.

    When the per-example kernel gradients are materialized for the norms (cheaper than the Gram form for
    most convolutions), the clipped sum reuses them (``sum_i c_i G_i``) instead of a second filter gradient.
    The derivation takes the kernel as the layer's convolution reads it: a subclass overriding
    ``convolution_op`` (a weight-standardized kernel) is not covered.
    """

    layer_methods = ("call", "convolution_op")

    def variables(self, layer):
        return [v for v in (layer.kernel, layer.bias) if v is not None]

    def unsupported_reason(self, layer):
        return conv_unsupported_reason(layer)

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs, z = call_preactivation(layer, call, inputs, *args, **kwargs)
        return outputs, [z], ConvContext(tf.cast(inputs, z.dtype))

    def squared_norms(self, layer, context, grads):
        g = grads[0]
        geometry = conv_geometry(layer)
        if ops.conv_materialize_is_cheaper(layer.kernel_size, context.x.shape[-1], g):
            context.per_example = ops.conv_per_example_gradients(context.x, g, *geometry)
            norms = [ops.squared_norms_of(context.per_example)]
        else:
            patches = ops.conv_patches(context.x, *geometry)
            norms = [ops.outer_squared_norms(patches, ops.flatten_positions(g))]
        if layer.bias is not None:
            norms.append(ops.summed_squared_norms(ops.flatten_positions(g)))
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        if context.per_example is not None:
            kernel = tf.tensordot(factors, context.per_example, axes=1)
        else:
            scaled = grads[0] * factors[:, None, None, None]
            kernel = conv_kernel_backprop(context.x, tf.shape(layer.kernel), scaled, conv_geometry(layer))
        sums = [kernel]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(ops.flatten_positions(grads[0]), factors))
        return sums
