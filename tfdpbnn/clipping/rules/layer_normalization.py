"""Clipping rule of ``tf.keras.layers.LayerNormalization`` (Ba et al. 2016)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.rules.affine_normalization import AffineNormalizationRule


class LayerNormalizationRule(AffineNormalizationRule):
    """``tf.keras.layers.LayerNormalization``: xhat from the example's own moments.

    Keras' layer exposes no public xhat, so the rule recomputes the example's moments beside its ``call``
    (the only rule that does: an O(batch x features) reduction, not a second pass through any weights).
    """

    def unsupported_reason(self, layer):
        if getattr(layer, "rms_scaling", False):  # Keras 3: x over its root mean square, not centred
            return "rms_scaling (xhat is not centred)"
        axes = list(layer.axis)
        if 0 in axes:
            return "axis includes the batch axis"
        if axes != sorted(axes):
            return "axis not in increasing order"
        return None

    def param_axes(self, layer, rank):
        return [a % rank for a in layer.axis]

    def forward_normalized(self, layer, call, inputs, *args, **kwargs):
        outputs = call(inputs, *args, **kwargs)
        x = tf.cast(inputs, tf.float32)
        axes = [a % x.shape.rank for a in layer.axis]
        mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
        return outputs, (x - mean) * tf.math.rsqrt(var + layer.epsilon)
