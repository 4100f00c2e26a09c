"""Augmentation multiplicity (De et al. 2022, sec. 3.1) with augmentations suited to DIGITS' count images.

De et al. (2022) train DP-SGD on K augmented copies of each example and average the K copies' losses
*before* the per-example gradient is clipped, so each example still contributes one gradient of norm at
most C and the accounting is unchanged by K. Here the copies travel as an extra axis through the network:
``AugmentationCopies`` turns a training batch ``[B, 64]`` into ``[B, K, 64]`` (Dense-type layers act on the
last axis), the network's training output is ``[B, K, classes]``, ``CopiesSparseCategoricalCrossentropy``
gives the ``[B, K]`` losses, and the per-example loss (``tfdpbnn/optimizers/per_example_loss.py``) averages
every non-batch axis, so the clipping engine (ghost or jacobian path) sees one loss per example: the mean
over its K copies. At inference the layer passes the image through unchanged (``[B, 64]`` in and out).

DIGITS (Alpaydin & Kaynak 1998, sklearn's ``load_digits``) stores each 8x8 pixel as the count (0-16) of set
bits in a 4x4 block of a 32x32 bitmap. Two augmentations keep that format:

- a sub-cell shift: the bitmap moved by -1, 0 or +1 of its own pixels along each axis, i.e. a quarter of an
  8x8 cell; with the set bits taken as spread evenly within a cell, a quarter of each cell's count moves to
  its neighbour (zero padding at the border);
- count jitter: each count moved by -1 or +1 with probability ``jitter`` each, kept in 0-16.

The result is rounded stochastically to whole counts (unbiased), so every copy is itself a valid DIGITS
image. Whole-cell shifts are not offered: a 1-pixel shift of a size-normalized 8x8 digit is a different
image (docs/results.md, "Recipes": -25 points).
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._validation import check_real

COUNT_MAX = 16.0  # DIGITS' largest pixel count (a 4x4 block of the 32x32 bitmap)


def _neighbour(counts, axis, sign):
    """``counts`` ``[B, 8, 8]`` moved one cell along ``axis`` (1 rows, 2 cols) towards ``sign``; zero fill."""
    size = counts.shape[axis]
    if sign > 0:  # cell j receives from cell j - 1
        kept = counts[:, : size - 1, :] if axis == 1 else counts[:, :, : size - 1]
        pad = [[0, 0], [1, 0], [0, 0]] if axis == 1 else [[0, 0], [0, 0], [1, 0]]
    else:
        kept = counts[:, 1:, :] if axis == 1 else counts[:, :, 1:]
        pad = [[0, 0], [0, 1], [0, 0]] if axis == 1 else [[0, 0], [0, 0], [0, 1]]
    return tf.pad(kept, pad)


def augment_digit_counts(counts, shift=True, jitter=0.1, seed=None):
    """One augmented copy of DIGITS count images ``counts`` (``[B, 8, 8]``, float counts in 0-16).

    ``shift``: a random sub-cell shift per image (-1, 0 or +1 bitmap pixels per axis, a quarter cell);
    ``jitter``: probability of each of -1 and +1 on each count. Rounded stochastically to whole counts in
    0-16. Every image gets its own random draw, so no image's copy depends on another image.
    """
    counts = tf.cast(counts, tf.float32)
    batch = tf.shape(counts)[0]
    seed = None if seed is None else int(seed)
    if shift:
        for axis in (1, 2):
            step = tf.random.uniform([batch, 1, 1], -1, 2, dtype=tf.int32, seed=seed)  # -1, 0, +1
            frac = tf.cast(tf.abs(step), tf.float32) / 4.0
            source = tf.where(step > 0, _neighbour(counts, axis, +1), _neighbour(counts, axis, -1))
            counts = (1.0 - frac) * counts + frac * source
    if jitter > 0:
        u = tf.random.uniform(tf.shape(counts), seed=seed)
        counts = counts + tf.cast(u < jitter, tf.float32) - tf.cast(u > 1.0 - jitter, tf.float32)
    counts = tf.floor(counts + tf.random.uniform(tf.shape(counts), seed=seed))  # unbiased rounding
    return tf.clip_by_value(counts, 0.0, COUNT_MAX)


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class AugmentationCopies(tf.keras.layers.Layer):
    """K augmented copies of each DIGITS image in training, as an extra axis (De et al. 2022).

    Input: 64-vectors (or ``[8, 8]`` / ``[8, 8, 1]`` images) whose pixels are ``count / 16 + offset``
    (``tfdpbnn.data.load_digits`` gives offset 0; ``tfdpbnn train`` centres by -0.5). In training the
    output is ``[B, copies, 64]``: ``copies`` independent draws of ``augment_digit_counts`` in the same
    scale; at inference the input flattened to ``[B, 64]``. Put it first in the network and compile with a
    loss that takes the copies axis (``CopiesSparseCategoricalCrossentropy``): the per-example loss is
    then the mean over the copies, clipped once, and the privacy accounting does not depend on ``copies``.
    ``copies=1`` with ``shift=False, jitter=0`` (and integer counts) reproduces the plain training step.
    """

    def __init__(self, copies, shift=True, jitter=0.1, offset=0.0, **kwargs):
        super().__init__(**kwargs)
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"copies must be an integer >= 1 (augmented copies per example), got {copies!r}")
        if not isinstance(shift, bool):
            raise ValueError(f"shift must be True or False (sub-cell shifts), got {shift!r}")
        self.copies, self.shift = copies, shift
        self.jitter = check_real("jitter", jitter, low=0.0, high=0.5)
        self.offset = check_real("offset", offset)

    def build(self, input_shape):
        """Check that each example is one 8x8 image (64 values)."""
        size = 1
        for d in input_shape[1:]:
            size *= -1 if d is None else int(d)
        if size != 64:
            raise ValueError(f"AugmentationCopies: inputs must be 8x8 DIGITS images (64 values per example), "
                             f"got shape {tuple(input_shape)}")
        super().build(input_shape)

    def call(self, inputs, training=None):
        """``[B, copies, 64]`` augmented copies in training, else the input as ``[B, 64]``."""
        flat = tf.reshape(tf.cast(inputs, tf.float32), [-1, 64])
        if not training:
            return flat
        counts = tf.reshape((flat - self.offset) * COUNT_MAX, [-1, 8, 8])
        copies = [augment_digit_counts(counts, self.shift, self.jitter) for _ in range(self.copies)]
        stacked = tf.stack([tf.reshape(c, [-1, 64]) for c in copies], axis=1)
        return stacked / COUNT_MAX + self.offset

    def get_config(self):
        """Keras config (copies, shift, jitter, offset)."""
        return {**super().get_config(), "copies": self.copies, "shift": self.shift, "jitter": self.jitter,
                "offset": self.offset}


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class CopiesSparseCategoricalCrossentropy(tf.keras.losses.SparseCategoricalCrossentropy):
    """Sparse categorical cross-entropy that also takes predictions with a copies axis ``[B, K, classes]``.

    With ``[B, K, classes]`` predictions (``AugmentationCopies`` in training) each copy is scored against
    its example's label and the loss is ``[B, K]``; DP training averages it over K per example before
    clipping (augmentation multiplicity, De et al. 2022). ``[B, classes]`` predictions (inference) are
    scored as by ``SparseCategoricalCrossentropy``.
    """

    def call(self, y_true, y_pred):
        """Per-copy cross-entropy ``[B, K]`` for ``[B, K, classes]`` predictions, else ``[B]``."""
        y_pred = tf.convert_to_tensor(y_pred)
        if y_pred.shape.rank == 3:
            y_true = tf.reshape(tf.cast(y_true, tf.int64), [-1, 1])
            y_true = tf.tile(y_true, [1, tf.shape(y_pred)[1]])
        return super().call(y_true, y_pred)
