"""The Keras 2 adapter: tensorflow-privacy's vectorized Keras optimizers as the optimizer base classes."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._private_api import VECTORIZED_OPTIMIZERS, tensorflow_privacy_module


def optimizer_bases():
    """``(VectorizedDPKerasSGDOptimizer, VectorizedDPKerasAdamOptimizer)`` of tensorflow-privacy."""
    vectorized = tensorflow_privacy_module(VECTORIZED_OPTIMIZERS)
    return vectorized.VectorizedDPKerasSGDOptimizer, vectorized.VectorizedDPKerasAdamOptimizer


def save_saved_model(model, path, signatures):
    """Write ``model`` as a TensorFlow SavedModel with ``signatures``, without its optimizer."""
    tf.keras.models.save_model(model, path, save_format="tf", include_optimizer=False, signatures=signatures)
