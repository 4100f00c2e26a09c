"""Shared part of the normalization rules: ``y = gamma * xhat + beta``, xhat free of gamma and beta."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.registry import ClippingRule


class NormalizationContext:
    """``xhat`` from the forward pass and, once computed, the per-example gradients of gamma and beta."""

    def __init__(self, xhat):
        self.xhat = xhat
        self.per_example = None


class AffineNormalizationRule(ClippingRule):
    """``y = gamma * xhat + beta`` with ``xhat`` independent of the layer's trainable variables.

    Per-example gradients: ``dL_i/dgamma = sum_positions g_i * xhat_i``, ``dL_i/dbeta = sum_positions g_i``
    (materialized once; they are only as large as gamma). Subclasses define ``param_axes(layer, rank)`` and
    ``forward_normalized`` (the outputs and xhat of one forward pass).
    """

    def variables(self, layer):
        return [v for v in (layer.gamma, layer.beta) if v is not None]

    def param_axes(self, layer, rank) -> list:
        """The axes gamma and beta span, as non-negative indices of a rank-``rank`` input."""
        raise NotImplementedError

    def forward_normalized(self, layer, call, inputs, *args, **kwargs):
        """``(outputs, xhat)`` of one forward pass: the layer's outputs and its normalized input."""
        raise NotImplementedError

    def forward(self, layer, call, inputs, *args, **kwargs):
        outputs, xhat = self.forward_normalized(layer, call, inputs, *args, **kwargs)
        return outputs, [outputs], NormalizationContext(xhat)

    def _per_example(self, layer, context, grads):
        if context.per_example is not None:
            return context.per_example
        g = grads[0]
        rank = g.shape.rank
        reduce_axes = [a for a in range(1, rank) if a not in self.param_axes(layer, rank)]
        result = []
        if layer.gamma is not None:
            per = tf.reduce_sum(g * tf.cast(context.xhat, g.dtype), axis=reduce_axes)
            result.append(tf.reshape(per, [-1, *layer.gamma.shape]))
        if layer.beta is not None:
            per = tf.reduce_sum(g, axis=reduce_axes)
            result.append(tf.reshape(per, [-1, *layer.beta.shape]))
        context.per_example = result
        return result

    def squared_norms(self, layer, context, grads):
        return [tf.reduce_sum(tf.reshape(tf.square(p), [tf.shape(p)[0], -1]), axis=1)
                for p in self._per_example(layer, context, grads)]

    def clipped_sums(self, layer, context, grads, factors):
        return [tf.tensordot(factors, p, axes=1) for p in self._per_example(layer, context, grads)]
