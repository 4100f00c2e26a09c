"""Tiny models, one per tfdpbnn/Keras layer type, shared by the optimizer tests."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdpbnn import layers as L

N_EXAMPLES = 50
NUM_CLASSES = 3


def make_data(kind, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    shape = (5, 5, 1) if kind in CONV_KINDS else (6,)
    x = rng.normal(size=(batch,) + shape).astype(np.float32)
    y = rng.integers(0, NUM_CLASSES, size=batch).astype(np.int64)
    return x, y


CONV_KINDS = ("conv2d", "conv2d_variational", "noisy_conv2d_public_bn")


def make_model(kind, seed=0):
    """A model whose trainable layers are of the layer type ``kind`` (plus a Dense head where needed)."""
    tf.keras.utils.set_random_seed(seed)
    reg = tf.keras.regularizers.l2(0.05)  # weight decay: a data-independent term that must not be clipped
    n = N_EXAMPLES
    if kind == "dense":
        body = [tf.keras.layers.Dense(4, activation="tanh", kernel_regularizer=reg),
                tf.keras.layers.Dense(NUM_CLASSES)]
    elif kind == "conv2d":
        body = [tf.keras.layers.Conv2D(2, 3, activation="tanh", kernel_regularizer=reg),
                tf.keras.layers.Flatten(), tf.keras.layers.Dense(NUM_CLASSES)]
    elif kind == "dense_variational":
        body = [L.DenseVariational(4, num_examples=n, activation="tanh"),
                L.DenseVariational(NUM_CLASSES, num_examples=n)]
    elif kind == "conv2d_variational":
        body = [L.Conv2DVariational(2, 3, num_examples=n, activation="tanh"), tf.keras.layers.Flatten(),
                L.DenseVariational(NUM_CLASSES, num_examples=n)]
    elif kind == "bayes_by_backprop":
        body = [L.DenseBayesByBackprop(4, num_examples=n, activation="tanh"),
                L.DenseBayesByBackprop(NUM_CLASSES, num_examples=n)]
    elif kind == "mc_dropout":
        body = [tf.keras.layers.Dense(4, activation="tanh", kernel_regularizer=reg), L.MCDropout(0.3),
                tf.keras.layers.Dense(NUM_CLASSES)]
    elif kind == "mc_dropout_gaussian":
        body = [tf.keras.layers.Dense(4, activation="tanh"), L.MCDropout(0.3, gaussian=True),
                tf.keras.layers.Dense(NUM_CLASSES)]
    elif kind == "noisy_dense_ln":
        body = [L.NoisyDense(4), tf.keras.layers.LayerNormalization(), tf.keras.layers.Activation("tanh"),
                L.NoisyDense(NUM_CLASSES)]
    elif kind == "noisy_conv2d_public_bn":
        public = np.random.default_rng(99).normal(size=(6, 3, 3, 2)).astype(np.float32)
        body = [L.NoisyConv2D(2, 3), L.PublicBatchNormalization(public_batch=public),
                tf.keras.layers.Activation("tanh"), tf.keras.layers.Flatten(), L.NoisyDense(NUM_CLASSES)]
    else:
        raise KeyError(kind)
    shape = (5, 5, 1) if kind in CONV_KINDS else (6,)
    return tf.keras.Sequential([tf.keras.Input(shape)] + body)


LAYER_KINDS = ("dense", "conv2d", "dense_variational", "conv2d_variational", "bayes_by_backprop",
               "mc_dropout", "mc_dropout_gaussian", "noisy_dense_ln", "noisy_conv2d_public_bn")
NOISY_KINDS = ("noisy_dense_ln", "noisy_conv2d_public_bn")
