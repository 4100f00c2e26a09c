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
        return tf.expand_dims(t, 1)  # a reshape: no copy (t[:, None, :] is a strided-slice copy)
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
        a2 = tf.square(tf.squeeze(a, 1))
        b2 = tf.square(tf.squeeze(b, 1))
        if weight_sq is None:
            return tf.reduce_sum(a2, axis=1) * tf.reduce_sum(b2, axis=1)
        return tf.reduce_sum(tf.matmul(a2, weight_sq) * b2, axis=1)
    if weight_sq is None and t is not None and t * (d + k) < d * k:
        gram_a = tf.matmul(a, a, transpose_b=True)
        gram_b = tf.matmul(b, b, transpose_b=True)
        return tf.reduce_sum(gram_a * gram_b, axis=[1, 2])
    return squared_norms_of(tf.einsum("btd,btk->bdk", a, b), weight_sq)


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


def _kernel_offset_slices(x: tf.Tensor, kernel_size, strides, dilation_rate, padding: str):
    """The ``kh*kw`` strided input slices ``[B, out_h, out_w, cin]`` of a channels-last 2-D convolution.

    One per kernel offset in (row, column) order; "same" padding as tf.nn.conv2d.
    """
    (kh, kw), (sh, sw), (dh, dw) = kernel_size, strides, dilation_rate
    height, width = x.shape[1], x.shape[2]
    if padding.lower() == "same":
        pads = [_same_padding(height, kh, sh, dh), _same_padding(width, kw, sw, dw)]
        x = tf.pad(x, [[0, 0], list(pads[0]), list(pads[1]), [0, 0]])
        height, width = x.shape[1], x.shape[2]
    out_h = (height - (kh - 1) * dh - 1) // sh + 1
    out_w = (width - (kw - 1) * dw - 1) // sw + 1
    return [x[:, i * dh: i * dh + (out_h - 1) * sh + 1: sh, j * dw: j * dw + (out_w - 1) * sw + 1: sw, :]
            for i in range(kh) for j in range(kw)]


def conv_patches(x: tf.Tensor, kernel_size, strides, dilation_rate, padding: str) -> tf.Tensor:
    """The ``[B, P, kh*kw*cin]`` input patches of a channels-last 2-D convolution (``im2col``).

    Built from ``kh*kw`` strided slices (much faster on CPU than ``tf.image.extract_patches``); the depth
    order (row, column, channel) matches ``kernel.reshape([-1, filters])``; "same" padding as tf.nn.conv2d.
    """
    slices = _kernel_offset_slices(x, kernel_size, strides, dilation_rate, padding)
    patches = slices[0] if len(slices) == 1 else tf.concat(slices, axis=-1)
    return flatten_positions(patches)


def conv_per_example_gradients(x: tf.Tensor, g: tf.Tensor, kernel_size, strides, dilation_rate,
                               padding: str) -> tf.Tensor:
    """Per-example kernel gradients ``G_i = patches(x_i)^T g_i`` of a 2-D convolution, ``[B, kh*kw*cin, K]``.

    ``x``: the layer input ``[B, H, W, cin]``; ``g``: the output gradients ``[B, out_h, out_w, K]``. One
    batched ``[cin, T] x [T, K]`` matmul per kernel offset, on that offset's strided input slice, stacked in
    the (row, column, channel) order of ``kernel.reshape([-1, K])``. Same result as
    ``einsum("btd,btk->bdk", conv_patches(x), g)`` without building the ``[B, T, kh*kw*cin]`` patch matrix,
    the largest cost of the CNN's DP step before (docs/fast_clipping.md, docs/benchmarks.md).
    """
    b = flatten_positions(g)
    batch, cin = tf.shape(x)[0], x.shape[-1]
    per_offset = [tf.matmul(tf.reshape(s, [batch, -1, cin]), b, transpose_a=True)
                  for s in _kernel_offset_slices(x, kernel_size, strides, dilation_rate, padding)]
    return per_offset[0] if len(per_offset) == 1 else tf.concat(per_offset, axis=1)


def conv_materialize_is_cheaper(kernel_size, cin: int, g: tf.Tensor) -> bool:
    """True when materializing per-example kernel gradients beats the Gram (ghost) norm for a convolution.

    With output gradients ``g`` [B, h, w, K]: ``T D K <= T^2 (D + K)`` (T = h w positions, D = kh kw cin),
    or T unknown.
    """
    h, w = g.shape[1], g.shape[2]
    t = None if h is None or w is None else h * w
    d, k = kernel_size[0] * kernel_size[1] * cin, g.shape[-1]
    return t is None or (t != 1 and t * (d + k) >= d * k)


def squared_norms_of(per_example: tf.Tensor, weight_sq: tf.Tensor | None = None) -> tf.Tensor:
    """``sum_jk W_jk^2 G_ijk^2`` per example of materialized per-example gradients ``[B, D, K]``."""
    squared = tf.square(per_example)
    if weight_sq is not None:
        squared = squared * weight_sq
    return tf.reduce_sum(squared, axis=[1, 2])
