"""Pretraining on public data, then private fine-tuning of the whole network or of its last layers.

The recipe of Tramer & Boneh (2021), De et al. (2022) and Kurakin et al. (2022): features learned without
privacy from public data, then DP-SGD (or any tfdpbnn DP optimizer) on the private data only.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._validation import check_nonnegative_int, check_positive_int
from tfdpbnn.public._inputs import as_dataset


def pretrain(model: tf.keras.Model, public_data, *, epochs: int, optimizer="adam", loss=None,
             batch_size: int | None = None, verbose: int = 0, **fit_kwargs):
    """Train ``model`` on public data without privacy (Tramer & Boneh 2021); returns the Keras ``History``.

    ``public_data``: a ``tf.data.Dataset`` of (x, y) batches or a pair (x, y) (batched by ``batch_size``,
    default 128). ``optimizer`` is any non-private Keras optimizer (default Adam); ``loss`` defaults to
    ``SparseCategoricalCrossentropy(from_logits=True)``. The weights stay in ``model``: compile it again with
    a DP optimizer (after ``freeze_layers`` to fine-tune only the last layers) and fit on the private data.
    Nothing private is read, so the DP optimizer's privacy statement is unchanged. Bayesian layers keep their
    KL terms (scaled by their ``num_examples``, the private set's size) during pretraining.
    """
    if not isinstance(model, tf.keras.Model):
        raise ValueError(f"model must be a tf.keras.Model, got {type(model).__name__}")
    epochs = check_positive_int("epochs", epochs)
    if hasattr(optimizer, "privacy_statement"):
        raise ValueError("optimizer: pretraining on public data needs no DP optimizer; pass a Keras "
                         "optimizer (e.g. 'adam') and use the DP optimizer for the private fine-tuning")
    dataset = as_dataset("public_data", public_data, batch_size)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True) if loss is None else loss
    model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
    return model.fit(dataset, epochs=epochs, verbose=verbose, **fit_kwargs)


def freeze_layers(model: tf.keras.Model, trainable_last: int) -> list[str]:
    """Freeze every layer with weights except the last ``trainable_last`` ones; returns the frozen names.

    Last-layers fine-tuning after public pretraining (Tramer & Boneh 2021; De et al. 2022): frozen layers
    have no trainable variables, so DP optimizers clip and noise only the gradients of the layers left
    trainable. Call before ``model.compile``. ``trainable_last=0`` freezes all (nothing to fine-tune:
    refused); a count above the number of layers with weights is refused too.
    """
    if not isinstance(model, tf.keras.Model):
        raise ValueError(f"model must be a tf.keras.Model, got {type(model).__name__}")
    trainable_last = check_nonnegative_int("trainable_last", trainable_last)
    weighted = [layer for layer in model.layers if layer.weights]
    if not 1 <= trainable_last <= len(weighted):
        raise ValueError(f"trainable_last must be in [1, {len(weighted)}] (the model's layers with weights), "
                         f"got {trainable_last}")
    frozen = weighted[:len(weighted) - trainable_last]
    for layer in frozen:
        layer.trainable = False
    for layer in weighted[len(weighted) - trainable_last:]:
        layer.trainable = True
    return [layer.name for layer in frozen]
