"""Clipping rule of ``tf.keras.layers.Embedding`` (dense gradients)."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.registry import ClippingRule


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
