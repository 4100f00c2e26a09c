"""Shape arithmetic shared by the 2-D convolution layers (NHWC)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def conv2d_output_shape(input_shape, kernel_size, strides, padding, filters) -> tf.TensorShape:
    """Output shape of a 2-D convolution with "valid" or "same" padding, as ``tf.nn.conv2d`` gives it."""
    input_shape = tf.TensorShape(input_shape).as_list()
    dims = []
    for size, k, s in zip(input_shape[1:3], kernel_size, strides, strict=True):
        if size is None:
            dims.append(None)
        elif padding == "same":
            dims.append(int(np.ceil(size / s)))
        else:
            dims.append(int(np.ceil((size - k + 1) / s)))
    return tf.TensorShape([input_shape[0]] + dims + [filters])
