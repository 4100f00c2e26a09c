"""Building blocks of the ghost engine against direct computations: per-example convolution gradients
without im2col (``conv_per_example_gradients``), the Gram/materialize choice for convolutions, and the
``sum_scale`` folded into the clip factors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdpbnn.clipping import clipped_gradients, ops

rng = np.random.default_rng(0)


def per_example_kernel_gradients(x, g, kernel_size, strides, dilation, padding):
    """Reference: per example, the gradient of ``<conv(x_i, W), g_i>`` in ``W`` (``tf.nn.convolution``, which
    supports dilation on CPU), flattened like ``kernel.reshape([-1, K])``."""
    kernel = tf.Variable(tf.zeros([*kernel_size, x.shape[-1], g.shape[-1]]))
    out = []
    for i in range(x.shape[0]):
        with tf.GradientTape() as tape:
            z = tf.nn.convolution(x[i:i + 1], kernel, strides=strides, padding=padding.upper(),
                                  dilations=dilation)
            inner = tf.reduce_sum(z * g[i:i + 1])
        out.append(tf.reshape(tape.gradient(inner, kernel), [-1, g.shape[-1]]))
    return tf.stack(out).numpy()


@pytest.mark.parametrize("kernel_size,strides,dilation,padding", [
    ((3, 3), (1, 1), (1, 1), "valid"),
    ((3, 2), (2, 1), (1, 1), "same"),
    ((2, 2), (1, 1), (2, 2), "valid"),
    ((3, 3), (2, 2), (1, 1), "same"),
    ((1, 1), (1, 1), (1, 1), "valid"),
])
def test_conv_per_example_gradients_equal_backprop_filter(kernel_size, strides, dilation, padding):
    x = tf.constant(rng.normal(size=(4, 9, 8, 3)).astype("float32"))
    out = tf.nn.convolution(x, tf.zeros([*kernel_size, 3, 5]), strides=strides, padding=padding.upper(),
                            dilations=dilation)
    g = tf.constant(rng.normal(size=out.shape).astype("float32"))
    got = ops.conv_per_example_gradients(x, g, kernel_size, strides, dilation, padding).numpy()
    want = per_example_kernel_gradients(x, g, kernel_size, strides, dilation, padding)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # The im2col form gives the same matrices (the Gram path's input).
    patches = ops.conv_patches(x, kernel_size, strides, dilation, padding)
    np.testing.assert_allclose(tf.einsum("btd,btk->bdk", patches, ops.flatten_positions(g)).numpy(), want,
                               rtol=1e-4, atol=1e-4)


def test_conv_norm_choice_and_both_paths_agree():
    # Many positions, small D*K: materialize. Few positions, large D*K: the Gram form.
    assert ops.conv_materialize_is_cheaper((3, 3), 1, tf.zeros([2, 26, 26, 16]))
    assert not ops.conv_materialize_is_cheaper((3, 3), 16, tf.zeros([2, 2, 2, 32]))
    x = tf.constant(rng.normal(size=(3, 4, 4, 16)).astype("float32"))
    g = tf.constant(rng.normal(size=(3, 2, 2, 32)).astype("float32"))
    materialized = ops.squared_norms_of(ops.conv_per_example_gradients(x, g, (3, 3), (1, 1), (1, 1), "valid"))
    gram = ops.outer_squared_norms(ops.conv_patches(x, (3, 3), (1, 1), (1, 1), "valid"),
                                   ops.flatten_positions(g))
    np.testing.assert_allclose(materialized.numpy(), gram.numpy(), rtol=1e-4)


@pytest.mark.parametrize("method", ["ghost", "jacobian"])
def test_sum_scale_scales_the_clipped_sum_only(method):
    model = tf.keras.Sequential([tf.keras.Input((6, 6, 2)), tf.keras.layers.Conv2D(3, 3, activation="tanh"),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(4)])
    x = rng.normal(size=(8, 6, 6, 2)).astype("float32")
    y = rng.integers(0, 4, 8)

    def loss(yt, yp, sw):
        return tf.keras.losses.sparse_categorical_crossentropy(yt, yp, from_logits=True)

    plain = clipped_gradients(model, x, y, None, loss, 0.5, method=method)
    scaled = clipped_gradients(model, x, y, None, loss, 0.5, method=method, sum_scale=tf.constant(0.125))
    np.testing.assert_allclose(scaled.per_example_norms.numpy(), plain.per_example_norms.numpy(), rtol=1e-6)
    for a, b in zip(scaled.clipped_sum, plain.clipped_sum, strict=True):
        np.testing.assert_allclose(a.numpy(), 0.125 * b.numpy(), rtol=1e-5, atol=1e-7)
    assert max(np.abs(b.numpy()).max() for b in plain.clipped_sum) > 0
