"""Fast clipping rules for Keras' own layers: Dense, Conv2D, Embedding, LayerNormalization.

Derivations in docs/fast_clipping.md. Each rule taps the layer's pre-activation ``z`` and reads the
per-example gradients from the layer input and ``g = d(sum_i L_i)/dz``.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.registry import ClippingRule, register_rule


@contextlib.contextmanager
def linear_activation(layer):
    """Temporarily make ``layer.activation`` the identity, so its ``call`` returns the pre-activation."""
    own = "activation" in layer.__dict__
    saved = getattr(layer, "activation", None)
    object.__setattr__(layer, "activation", tf.keras.activations.linear)
    try:
        yield saved
    finally:
        if own:
            object.__setattr__(layer, "activation", saved)
        else:
            object.__delattr__(layer, "activation")


def call_preactivation(layer, call, inputs, *args, **kwargs):
    """``(outputs, z)``: the layer's output and its pre-activation, from one run of its own ``call``."""
    with linear_activation(layer) as activation:
        z = call(inputs, *args, **kwargs)
    outputs = activation(z) if activation is not None else z
    return outputs, z


class DenseRule(ClippingRule):
    """``z = x W + b``: per-example ``dL_i/dW = x_i^T g_i`` (Goodfellow 2015); ghost norm, book-keeping."""

    def variables(self, layer):
        return [v for v in (layer.kernel, layer.bias) if v is not None]

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs, z = call_preactivation(layer, call, inputs, *args, **kwargs)
        x = tf.cast(inputs, z.dtype)
        return outputs, [z], x

    def squared_norms(self, layer, context, grads):
        a, b = ops.flatten_positions(context), ops.flatten_positions(grads[0])
        norms = [ops.outer_squared_norms(a, b)]
        if layer.bias is not None:
            norms.append(ops.summed_squared_norms(b))
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        a, b = ops.flatten_positions(context), ops.flatten_positions(grads[0])
        sums = [ops.outer_clipped_sum(a, b, factors)]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(b, factors))
        return sums


class ConvContext:
    """Input of a convolution and, once computed, its per-example kernel gradients ``[B, D, K]``."""

    def __init__(self, x):
        self.x = x
        self.per_example = None


class Conv2DRule(ClippingRule):
    """2-D convolution as a matmul of input patches (im2col) with the reshaped kernel, as ``DenseRule``.

    When the per-example kernel gradients are materialized for the norms (cheaper than the Gram form for
    most convolutions), the clipped sum reuses them (``sum_i c_i G_i``) instead of a second filter gradient.
    """

    def variables(self, layer):
        return [v for v in (layer.kernel, layer.bias) if v is not None]

    def unsupported_reason(self, layer):
        if layer.data_format != "channels_last":
            return "data_format='channels_first'"
        if getattr(layer, "groups", 1) != 1:
            return "groups != 1"
        if layer.padding not in ("valid", "same"):
            return f"padding={layer.padding!r}"
        return None

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs, z = call_preactivation(layer, call, inputs, *args, **kwargs)
        return outputs, [z], ConvContext(tf.cast(inputs, z.dtype))

    def dilation(self, layer):
        return getattr(layer, "dilation_rate", (1, 1))

    def squared_norms(self, layer, context, grads):
        g = grads[0]
        geometry = (layer.kernel_size, layer.strides, self.dilation(layer), layer.padding)
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
            kernel = tf.compat.v1.nn.conv2d_backprop_filter(
                context.x, tf.shape(layer.kernel), grads[0] * factors[:, None, None, None],
                strides=[1, *layer.strides, 1], padding=layer.padding.upper(),
                dilations=[1, *self.dilation(layer), 1])
        sums = [kernel]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(ops.flatten_positions(grads[0]), factors))
        return sums


class EmbeddingRule(ClippingRule):
    """Row lookup ``z_t = E[id_t]``: per-example gradient ``sum_t onehot(id_t) g_t^T``.

    Squared norm ``sum_{t,s} [id_t = id_s] g_t . g_s`` (the ghost norm with a one-hot Gram matrix); the
    clipped sum is a segment sum of the scaled output gradients into the ids' rows.
    """

    def variables(self, layer):
        return [layer.embeddings]

    def unsupported_reason(self, layer):
        if getattr(layer, "sparse", False):
            return "sparse=True"
        return None

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs = call(inputs, *args, **kwargs)
        return outputs, [outputs], tf.cast(inputs, tf.int64)

    @staticmethod
    def _flat(ids, g):
        batch = tf.shape(ids)[0]
        return tf.reshape(ids, [batch, -1]), tf.reshape(g, [batch, -1, g.shape[-1]])

    def squared_norms(self, layer, context, grads):
        ids, g = self._flat(context, grads[0])
        same = tf.cast(tf.equal(ids[:, :, None], ids[:, None, :]), g.dtype)
        gram = tf.matmul(g, g, transpose_b=True)
        return [tf.reduce_sum(same * gram, axis=[1, 2])]

    def clipped_sums(self, layer, context, grads, factors):
        ids, g = self._flat(context, grads[0])
        scaled = tf.reshape(g * factors[:, None, None], [-1, g.shape[-1]])
        return [tf.math.unsorted_segment_sum(scaled, tf.reshape(ids, [-1]), layer.input_dim)]


class AffineNormalizationRule(ClippingRule):
    """``y = gamma * xhat + beta`` with ``xhat`` independent of the layer's trainable variables.

    Per-example gradients: ``dL_i/dgamma = sum_positions g_i * xhat_i``, ``dL_i/dbeta = sum_positions g_i``
    (materialized; they are only as large as gamma). Subclasses define ``normalized(layer, inputs)`` (xhat)
    and the parameter axes.
    """

    def variables(self, layer):
        return [v for v in (layer.gamma, layer.beta) if v is not None]

    def param_axes(self, layer, rank) -> list:
        raise NotImplementedError

    def normalized(self, layer, inputs):
        raise NotImplementedError

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs = call(inputs, *args, **kwargs)
        return outputs, [outputs], inputs

    def _per_example(self, layer, context, grads):
        g = grads[0]
        rank = g.shape.rank
        reduce_axes = [a for a in range(1, rank) if a not in self.param_axes(layer, rank)]
        result = []
        if layer.gamma is not None:
            xhat = tf.cast(self.normalized(layer, context), g.dtype)
            per = tf.reduce_sum(g * xhat, axis=reduce_axes)
            result.append(tf.reshape(per, [-1, *layer.gamma.shape]))
        if layer.beta is not None:
            per = tf.reduce_sum(g, axis=reduce_axes)
            result.append(tf.reshape(per, [-1, *layer.beta.shape]))
        return result

    def squared_norms(self, layer, context, grads):
        return [tf.reduce_sum(tf.reshape(tf.square(p), [tf.shape(p)[0], -1]), axis=1)
                for p in self._per_example(layer, context, grads)]

    def clipped_sums(self, layer, context, grads, factors):
        return [tf.tensordot(factors, p, axes=1) for p in self._per_example(layer, context, grads)]


class LayerNormalizationRule(AffineNormalizationRule):
    """``tf.keras.layers.LayerNormalization`` (Ba et al. 2016): xhat from the example's own moments."""

    def unsupported_reason(self, layer):
        axes = list(layer.axis)
        if 0 in axes:
            return "axis includes the batch axis"
        if axes != sorted(axes):
            return "axis not in increasing order"
        return None

    def param_axes(self, layer, rank):
        return [a % rank for a in layer.axis]

    def normalized(self, layer, inputs):
        x = tf.cast(inputs, tf.float32)
        axes = [a % x.shape.rank for a in layer.axis]
        mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + layer.epsilon)


register_rule(tf.keras.layers.Dense, DenseRule())
register_rule(tf.keras.layers.Conv2D, Conv2DRule())
register_rule(tf.keras.layers.Embedding, EmbeddingRule())
register_rule(tf.keras.layers.LayerNormalization, LayerNormalizationRule())
