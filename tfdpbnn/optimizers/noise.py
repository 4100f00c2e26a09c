"""The Gaussian noise of a DP step: one fused, vectorized Box-Muller draw for every variable.

DP-SGD (Abadi et al. 2016, Algorithm 1, "add noise") needs one N(0, s^2) number per trainable parameter per
step: 785k numbers for the DPVD paper's 784-1000-10 MLP. ``tf.random.normal`` draws them with a scalar
Box-Muller loop per element, which made the noise the largest cost of a DP step on CPU (docs/benchmarks.md).
Here the same Box-Muller transform (Box & Muller 1958)

    z1 = r cos(2 pi u2),  z2 = r sin(2 pi u2),  r = s sqrt(-2 log(1 - u1)),  u1, u2 ~ U[0, 1) iid

runs as a handful of vectorized TensorFlow ops over ONE uniform draw for all variables: the scale ``s`` is
folded into the radius (computed once per pair), and the result is split into the variables' shapes.

Exactness: ``z1``, ``z2`` are independent N(0, s^2) for exact uniforms. With float32 uniforms (23 random
bits, ``1 - u1 >= 2^-23``) the radius is at most ``s sqrt(46 log 2) = 5.65 s``: the same float32 tail limit
as TensorFlow's own sampler (5.68 s), so this is no weaker than ``tf.random.normal``. Like every
floating-point DP library (tf-privacy, Opacus without its secure mode), the accounting treats the noise as
an exact Gaussian; docs/privacy.md says so.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

_TWO_PI = np.float32(2.0 * math.pi)


def standard_box_muller(u1: tf.Tensor, u2: tf.Tensor, stddev) -> tf.Tensor:
    """``[r cos(2 pi u2), r sin(2 pi u2)]`` concatenated, ``r = stddev sqrt(-2 log(1 - u1))``.

    ``u1``, ``u2``: equal-shape uniforms on [0, 1); the output has twice their length (1-D).
    """
    radius = tf.sqrt(tf.math.log1p(-u1) * (-2.0 * tf.square(tf.cast(stddev, u1.dtype))))
    angle = _TWO_PI * u2
    return tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)


def gaussian_noise_like(tensors, stddev, seed=None) -> list[tf.Tensor]:
    """Independent N(0, stddev^2) noise shaped like each tensor of ``tensors`` (float32), in one draw.

    Args:
      tensors: tensors (or variables) with fully defined static shapes; only their shapes and dtypes are
        used.
      stddev: scalar standard deviation (Python float or scalar tensor), >= 0.
      seed: op seed of the underlying ``tf.random.uniform`` (with the global seed, as ``tf.random.normal``).
    Returns:
      one tensor per input, same shape and dtype.
    """
    tensors = list(tensors)
    if not tensors:
        return []
    shapes = []
    for t in tensors:
        if not t.shape.is_fully_defined():
            raise ValueError(f"tensors: gaussian_noise_like needs static shapes, got {t.shape} for {t!r}")
        shapes.append(t.shape)
    sizes = [int(s.num_elements()) for s in shapes]
    total = sum(sizes)
    if total == 0:
        return [tf.zeros(s, t.dtype) for s, t in zip(shapes, tensors, strict=True)]
    pairs = (total + 1) // 2
    # Two draws rather than one [2, pairs] draw: rows of an unaligned [2, pairs] tensor are sliced by copy.
    u1 = tf.random.uniform([pairs], dtype=tf.float32, seed=seed)
    u2 = tf.random.uniform([pairs], dtype=tf.float32, seed=None if seed is None else seed + 1)
    flat = standard_box_muller(u1, u2, stddev)
    if 2 * pairs != total:
        flat = flat[:total]
    pieces = tf.split(flat, sizes) if len(sizes) > 1 else [flat]
    return [tf.cast(tf.reshape(p, s), t.dtype) if t.dtype != tf.float32 else tf.reshape(p, s)
            for p, s, t in zip(pieces, shapes, tensors, strict=True)]


__all__ = ["gaussian_noise_like", "standard_box_muller"]
