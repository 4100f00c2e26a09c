"""Clipping rule of ``tfdpbnn.layers.Conv2DVariational`` in training.

Local reparameterization for convolutions (Kingma et al. 2015; Ermis & Cemgil 2017).
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping import ops
from tfdpbnn.clipping.rules.conv2d import conv_geometry, conv_kernel_backprop, conv_unsupported_reason
from tfdpbnn.clipping.rules.dense_variational import DenseVariationalRule


class Conv2DVariationalRule(DenseVariationalRule):
    """``Conv2DVariational`` in training: the dense rule on input patches (im2col), per output position.

    ``z = conv(x, theta) + b + sqrt(conv(x^2, exp(log_sigma2)) + eps) xi``; ``dL_i/dlog_sigma2 =
    exp(log_sigma2) * patches(x_i^2)^T h_i`` (per-example gradients materialized as [D, K] for the norm).
    The forward pass is the layer's own, as for ``DenseVariationalRule``.
    """

    def unsupported_reason(self, layer):
        return conv_unsupported_reason(layer)

    def squared_norms(self, layer, context, grads):
        g = grads[0]
        geometry = conv_geometry(layer)
        if ops.conv_materialize_is_cheaper(layer.kernel_size, context.x.shape[-1], g):
            theta_norms = ops.squared_norms_of(ops.conv_per_example_gradients(context.x, g, *geometry))
        else:
            theta_norms = ops.outer_squared_norms(ops.conv_patches(context.x, *geometry),
                                                  ops.flatten_positions(g))
        h = self.log_sigma2_output_grad(context, g)
        e2 = tf.reshape(tf.exp(2.0 * layer.log_sigma2), [-1, layer.filters])
        log_sigma2_grads = ops.conv_per_example_gradients(tf.square(context.x), h, *geometry)
        norms = [theta_norms, ops.squared_norms_of(log_sigma2_grads, e2)]
        if layer.bias is not None:
            norms.append(ops.summed_squared_norms(ops.flatten_positions(g)))
        return norms

    def clipped_sums(self, layer, context, grads, factors):
        g = grads[0]
        c = factors[:, None, None, None]
        h = self.log_sigma2_output_grad(context, g)
        geometry, shape = conv_geometry(layer), tf.shape(layer.theta)
        sums = [conv_kernel_backprop(context.x, shape, g * c, geometry),
                tf.exp(layer.log_sigma2) * conv_kernel_backprop(tf.square(context.x), shape, h * c, geometry)]
        if layer.bias is not None:
            sums.append(ops.summed_clipped(ops.flatten_positions(g), factors))
        return sums
