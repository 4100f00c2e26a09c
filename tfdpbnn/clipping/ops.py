"""Per-example norms and clipped sums of outer-product gradients, without per-example gradients where cheaper.

A weight ``W`` ([D, K]) used as ``z_t = a_t W`` at ``T`` positions of an example (tokens, conv patches) has
per-example gradient ``G_i = A_i^T B_i`` with ``A_i`` [T, D] the inputs and ``B_i`` [T, K] the output
gradients. Its squared norm is either

- ``||a_i||^2 ||b_i||^2`` when ``T = 1`` (Goodfellow 2015), O(D + K);
- ``<A_i A_i^T, B_i B_i^T>`` (ghost norm, Li et al. 2022), O(T^2 (D + K)); or
- ``||A_i^T B_i||^2`` materialized, O(T D K);

``outer_squared_norms`` picks the cheapest. The clipped sum ``sum_i c_i G_i = A^T (c * B)`` is one matmul over
all positions (book-keeping, Bu et al. 2023): the same cost as the non-private weight gradient.
"""

from __future__ import annotations

import tensorflow as tf


def flatten_positions(t: tf.Tensor) -> tf.Tensor:
    """Reshape ``[B, ..., F]`` to ``[B, T, F]`` (T = 1 for rank-2 input)."""
    if t.shape.rank == 2:
        return t[:, None, :]
    shape = tf.shape(t)
    return tf.reshape(t, [shape[0], -1, t.shape[-1]])


def _positions(a: tf.Tensor):
    t = a.shape[1]
    return t


def outer_squared_norms(a: tf.Tensor, b: tf.Tensor, weight_sq: tf.Tensor | None = None) -> tf.Tensor:
    """``||W ⊙ (A_i^T B_i)||_F^2`` per example for ``a`` [B, T, D], ``b`` [B, T, K].

    ``weight_sq`` (optional, [D, K]) is the elementwise square of a fixed factor ``W`` (used by the variance
    rules: e.g. ``exp(2 log_sigma2)``); with it, ``T = 1`` costs one [B, D] x [D, K] matmul:
    ``sum_jk a_j^2 W_jk^2 b_k^2 = (a^2)^T W^2 (b^2)``.
    """
    t = _positions(a)
    d, k = a.shape[-1], b.shape[-1]
    if t == 1:
        a2 = tf.square(a[:, 0, :])
        b2 = tf.square(b[:, 0, :])
        if weight_sq is None:
            return tf.reduce_sum(a2, axis=1) * tf.reduce_sum(b2, axis=1)
        return tf.reduce_sum(tf.matmul(a2, weight_sq) * b2, axis=1)
    if weight_sq is None and t is not None and t * (d + k) < d * k:
        gram_a = tf.matmul(a, a, transpose_b=True)
        gram_b = tf.matmul(b, b, transpose_b=True)
        return tf.reduce_sum(gram_a * gram_b, axis=[1, 2])
    per_example = tf.einsum("btd,btk->bdk", a, b)
    if weight_sq is not None:
        return tf.reduce_sum(tf.square(per_example) * weight_sq, axis=[1, 2])
    return tf.reduce_sum(tf.square(per_example), axis=[1, 2])


def materialize_is_cheaper(a: tf.Tensor, b: tf.Tensor) -> bool:
    """True when ``T D K <= T^2 (D + K)`` (or T unknown): per-example ``A_i^T B_i`` beat the Gram form."""
    t, d, k = a.shape[1], a.shape[-1], b.shape[-1]
    return t is None or (t != 1 and t * (d + k) >= d * k)


def outer_clipped_sum(a: tf.Tensor, b: tf.Tensor, factors: tf.Tensor) -> tf.Tensor:
    """``sum_i factors_i A_i^T B_i`` for ``a`` [B, T, D], ``b`` [B, T, K]: one [D, B*T] x [B*T, K] matmul."""
    scaled = b * factors[:, None, None]
    d, k = a.shape[-1], b.shape[-1]
    return tf.matmul(tf.reshape(a, [-1, d]), tf.reshape(scaled, [-1, k]), transpose_a=True)


def summed_squared_norms(b: tf.Tensor) -> tf.Tensor:
    """Squared norm per example of ``sum_t b_t`` (a bias gradient) for ``b`` [B, T, K]."""
    return tf.reduce_sum(tf.square(tf.reduce_sum(b, axis=1)), axis=1)


def summed_clipped(b: tf.Tensor, factors: tf.Tensor) -> tf.Tensor:
    """``sum_i factors_i sum_t b_it`` for ``b`` [B, T, K]."""
    return tf.tensordot(factors, tf.reduce_sum(b, axis=1), axes=1)


def _same_padding(size, k, stride, dilation):
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def conv_patches(x: tf.Tensor, kernel_size, strides, dilation_rate, padding: str) -> tf.Tensor:
    """The ``[B, P, kh*kw*cin]`` input patches of a channels-last 2-D convolution (``im2col``).

    Built from ``kh*kw`` strided slices (much faster on CPU than ``tf.image.extract_patches``); the depth
    order (row, column, channel) matches ``kernel.reshape([-1, filters])``; "same" padding as tf.nn.conv2d.
    """
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, strides, dilation_rate
    height, width = x.shape[1], x.shape[2]
    if padding.lower() == "same":
        pads = [_same_padding(height, kh, sh, dh), _same_padding(width, kw, sw, dw)]
        x = tf.pad(x, [[0, 0], list(pads[0]), list(pads[1]), [0, 0]])
        height, width = x.shape[1], x.shape[2]
    out_h = (height - (kh - 1) * dh - 1) // sh + 1
    out_w = (width - (kw - 1) * dw - 1) // sw + 1
    slices = []
    for i in range(kh):
        for j in range(kw):
            slices.append(x[:, i * dh: i * dh + (out_h - 1) * sh + 1: sh,
                            j * dw: j * dw + (out_w - 1) * sw + 1: sw, :])
    patches = slices[0] if len(slices) == 1 else tf.concat(slices, axis=-1)
    return flatten_positions(patches)
