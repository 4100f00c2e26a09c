"""Clipping rule of ``tfdpbnn.layers.NoisyConv2D`` (SI-DPSGD, Davody et al. 2020)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.rules.conv2d import Conv2DRule, ConvContext


class NoisyConv2DRule(Conv2DRule):
    """Convolution with the sampled kernel mu + s xi: ``dL_i/dmu = patches(x_i)^T g_i``, as ``Conv2DRule``.

    The tap is the layer's own ``preactivation`` (one noisy weight sample per call), run once.
    """

    def forward(self, layer, call, inputs, *args, **kwargs):
        x = tf.convert_to_tensor(inputs, dtype=layer.kernel.dtype)
        z = layer.preactivation(x, *args, **kwargs)
        outputs = layer.activation(z) if layer.activation is not None else z
        return outputs, [z], ConvContext(x)
