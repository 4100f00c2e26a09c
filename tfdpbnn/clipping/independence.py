"""Checks that one example's loss depends on no other example of the batch.

Per-example clipping bounds the sensitivity of the summed gradient only if example ``i``'s loss is a function
of example ``i`` alone. Batch normalization with batch statistics breaks that (docs/soundness.md, finding 1):
one private
example then moves every other example's output and gradient.
"""

from __future__ import annotations

import tensorflow as tf


def _walk(layer):
    yield layer
    yield from getattr(layer, "_flatten_layers", lambda **_: [])(include_self=False, recursive=True)


def check_per_example_independence(model: tf.keras.layers.Layer) -> None:
    """Raise ``ValueError`` if a layer of ``model`` mixes examples of a batch in training.

    Keras ``BatchNormalization`` (and its synchronized variant) normalizes with statistics of the whole
    private batch when trainable; use ``tfdpbnn.layers.PublicBatchNormalization`` (statistics from
    public data) or freeze the layer (``trainable=False`` runs it in inference mode with fixed moving
    statistics, which must be the initial ones or asserted public: ``tfdpbnn.optimizers.state_checks``).
    """
    bn_types = (tf.keras.layers.BatchNormalization,)
    sync_bn = getattr(getattr(tf.keras.layers, "experimental", None), "SyncBatchNormalization", None)
    if sync_bn is not None:
        bn_types = bn_types + (sync_bn,)
    for layer in _walk(model):
        if isinstance(layer, bn_types) and layer.trainable:
            raise ValueError(
                f"model: layer {layer.name!r} is a trainable {type(layer).__name__}, which normalizes each "
                "example with statistics of the whole private batch, so per-example clipping no longer "
                "bounds the sensitivity and DP training would not be private. Use "
                "tfdpbnn.layers.PublicBatchNormalization (statistics from a public batch), "
                "LayerNormalization, or set trainable=False on this layer (its moving statistics must then "
                "be the initial ones, or computed from public data and asserted with "
                "tfdpbnn.preprocessing.assert_public_preprocessing)."
            )
