"""Standard Keras arguments: accepted where they have a meaning here, else a ValueError naming them."""

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32

from tfdpbnn.layers import Conv2DVariational, DenseVariational, NoisyConv2D, PublicBatchNormalization

X = np.random.default_rng(0).normal(size=(3, 5, 5, 2)).astype("float32")


def test_variational_regularizers_and_constraints():
    reg = tf.keras.regularizers.L2(0.5)
    layer = DenseVariational(3, num_examples=10, kernel_regularizer=reg, bias_regularizer="l1",
                             kernel_constraint=tf.keras.constraints.MaxNorm(0.1), bias_constraint="non_neg")
    layer(np.ones((2, 4), "float32"))
    theta = layer.theta.numpy()
    kl = float(layer.kl_divergence()) / 10
    # model losses: the KL term plus 0.5 * sum(theta^2) plus l1 of the (zero) bias
    np.testing.assert_allclose(sum(float(v) for v in layer.losses), kl + 0.5 * np.sum(theta ** 2), rtol=1e-5)
    assert layer.theta.constraint is layer.kernel_constraint and layer.bias.constraint is not None
    clone = DenseVariational.from_config(layer.get_config())
    assert isinstance(clone.kernel_regularizer, tf.keras.regularizers.L2)
    conv = Conv2DVariational(2, 3, num_examples=10, kernel_regularizer="l2", data_format="channels_last",
                             dilation_rate=(1, 1))
    assert conv(X).shape == (3, 3, 3, 2) and len(conv.losses) == 2  # KL + l2
    assert Conv2DVariational.from_config(conv.get_config()).dilation_rate == (1, 1)


@pytest.mark.parametrize("make,match", [
    (lambda: DenseVariational(3, num_examples=10, threshold=-100), r"threshold must lie in \[-8.0, 8.0\]"),
    (lambda: DenseVariational(3, num_examples=10, threshold=9.0), "threshold"),
    (lambda: DenseVariational(3, num_examples=10, kernel_initializer="zeros"), "theta_initializer"),
    (lambda: Conv2DVariational(2, 3, num_examples=10, dilation_rate=2), "dilation_rate must be 1"),
    (lambda: Conv2DVariational(2, 3, num_examples=10, data_format="channels_first"), "data_format"),
    (lambda: NoisyConv2D(2, 3, dilation_rate=(2, 1)), "dilation_rate"),
    (lambda: NoisyConv2D(2, 3, data_format="channels_first"), "channels_last"),
    (lambda: PublicBatchNormalization(num_public=4, momentum=0.9), "momentum is not supported: .*moving"),
    (lambda: PublicBatchNormalization(num_public=4, renorm=True), "renorm"),
    (lambda: PublicBatchNormalization(num_public=4, virtual_batch_size=2), "virtual_batch_size"),
])
def test_refused_arguments_name_themselves(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_public_batch_normalization_regularizers():
    public = np.random.default_rng(1).normal(size=(8, 4)).astype("float32")
    layer = PublicBatchNormalization(public_batch=public, gamma_regularizer=tf.keras.regularizers.L2(2.0),
                                     beta_constraint=tf.keras.constraints.NonNeg())
    x = np.ones((2, 4), "float32")
    y = layer(x).numpy()
    np.testing.assert_allclose(float(sum(layer.losses)), 2.0 * 4, rtol=1e-6)  # gamma = 1: 2 * sum(1)
    clone = PublicBatchNormalization.from_config(layer.get_config())
    np.testing.assert_allclose(clone(x).numpy(), y, **F32)
    assert isinstance(clone.beta_constraint, tf.keras.constraints.NonNeg)
