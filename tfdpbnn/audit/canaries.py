"""Canaries: the examples whose influence on training an audit measures.

Gradient-space (white-box) canaries, after Nasr et al. 2023 ("Tight auditing of differentially private
machine learning", the "Dirac canary"): an adversary who may insert an arbitrary gradient inserts
one whose clipped value is ``-C e_j`` on a single coordinate ``j`` that no other example touches, and reads
coordinate ``j`` of the model updates. ``with_gradient_canaries(model, m)`` realizes this with an ordinary
Keras model, so the audit runs the user's ``compile``/``fit`` path unchanged: a second input
``canary_input`` (an integer index in [0, m]) and a second output ``gain * w[index]`` from an
``Embedding(m + 1, 1)`` (zero-initialized; row 0 is "no canary"; ``noisy=True`` uses a one-hot encoding and
a ``NoisyDense`` instead). Canary j is the example with index j, canary-output target ``TARGET`` and loss
weight 1 on that output (mean absolute error), loss weight 0 on the task output; its per-example gradient is
``-gain e_j`` with ``gain > C``, so clipping makes it exactly ``-C e_j``. Real examples have index 0 and
weight 0 on the canary output, so they never move w. An EXCLUDED canary stays in the data with index 0 and
every loss weight 0: it contributes an exactly zero gradient, the zero-out neighbour of add/remove
adjacency (the noised sum is the same as without the example; the divisor is the constant B).

Input-space (black-box) canaries: mislabeled examples (Jagielski et al. 2020; Steinke et al. 2023, Section
6): held-out inputs given a wrong label; the score is minus the trained model's loss on them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_positive_int

#: Target of the canary output (mean absolute error): far above any reachable prediction, so the gradient
#: of |TARGET - gain w_j| with respect to w_j is -gain throughout training.
TARGET = 1e6
TASK, CANARY = "task", "canary"


class UnclippedCanaryLoss(tf.keras.layers.Layer):
    """A DELIBERATELY BROKEN layer for audit experiments: ``add_loss(-scale * sum(inputs))``.

    DP optimizers add ``model.losses`` after clipping (they must not depend on the data); a term that does
    is never clipped. Put after the canary output it gives each included canary an unclipped gradient of
    ``-scale * gain`` on its coordinate: a clip norm that is not enforced.
    """

    def __init__(self, scale, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, inputs):
        """Add the loss ``-scale * sum(inputs)`` (never clipped) and return ``inputs`` unchanged."""
        self.add_loss(-self.scale * tf.reduce_sum(inputs))
        return inputs

    def get_config(self):
        """The layer's config with ``scale``, for Keras serialization."""
        return {**super().get_config(), "scale": self.scale}


def with_gradient_canaries(model, num_canaries, l2_norm_clip, gain_factor=10.0, noisy=False,
                           unclipped_scale=None):
    """``model`` with a canary input and output (module docstring).

    Inputs ``{"features", "canary_input"}``, outputs ``{"task", "canary"}``. The canary weights are
    ``canary_weights(audit_model)``.

    Args:
      model: any Keras model taking one input tensor (the user's model, unchanged).
      num_canaries: m >= 1.
      l2_norm_clip: the optimizer's clip norm C; a canary's gradient has norm ``gain_factor * C``.
      gain_factor: > 1, so every canary gradient is clipped to exactly C.
      noisy: a ``tfdpbnn.layers.NoisyDense`` canary output (SI-DPSGD: its weights are then released as
        samples mu + s xi like the model's other noisy layers).
      unclipped_scale: BROKEN configurations only: also add ``UnclippedCanaryLoss(unclipped_scale)``.
    """
    m = check_positive_int("num_canaries", num_canaries)
    if not l2_norm_clip > 0:
        raise ValueError(f"l2_norm_clip must be > 0, got {l2_norm_clip!r}")
    if not gain_factor > 1:
        raise ValueError(f"gain_factor must be > 1 (canary gradients must be clipped), got {gain_factor!r}")
    features = tf.keras.Input(model.input_shape[1:], name="features")
    index = tf.keras.Input((1,), dtype=tf.int32, name="canary_input")
    if noisy:
        from tfdpbnn.layers import NoisyDense

        one_hot = tf.keras.layers.CategoryEncoding(m + 1, output_mode="one_hot")(index)
        w = NoisyDense(1, use_bias=False, kernel_initializer="zeros", name="canary_weights")(one_hot)
    else:
        w = tf.keras.layers.Embedding(m + 1, 1, embeddings_initializer="zeros", name="canary_weights")(index)
        w = tf.keras.layers.Reshape((1,))(w)
    out = tf.keras.layers.Rescaling(gain_factor * float(l2_norm_clip))(w)
    if unclipped_scale is not None:
        out = UnclippedCanaryLoss(unclipped_scale, name="unclipped_canary_loss")(out)
    task = tf.keras.layers.Activation("linear", name=TASK)(model(features))
    out = tf.keras.layers.Activation("linear", name=CANARY)(out)
    return tf.keras.Model({"features": features, "canary_input": index}, {TASK: task, CANARY: out})


def canary_weights(audit_model) -> np.ndarray:
    """The m canary weights w of a ``with_gradient_canaries`` model.

    SI-DPSGD: the mean mu, or the released sample after ``release_weights``.
    """
    layer = audit_model.get_layer("canary_weights")
    return layer.trainable_weights[0].numpy().reshape(-1)[1:].astype(np.float64)


def canary_losses(task_loss):
    """``model.compile(loss=...)`` for a ``with_gradient_canaries`` model.

    The user's loss on the task output, mean absolute error on the canary output.
    """
    return {TASK: task_loss, CANARY: tf.keras.losses.MeanAbsoluteError()}


def gradient_canary_data(x, y, included):
    """Training inputs for a ``with_gradient_canaries`` model: the real (x, y), then one row per canary.

    ``included``: boolean per canary. Returns ``(inputs, targets, sample_weights)`` dicts of
    arrays for ``tfdpbnn.data.poisson_batches(inputs, targets, sample_weight=...)`` or ``model.fit``.
    """
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y)
    included = np.asarray(included)
    if included.dtype != bool or included.ndim != 1 or included.size < 1:
        raise ValueError("included must be a non-empty 1-D boolean array (one entry per canary)")
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    n, m = len(x), included.size
    features = np.concatenate([x, np.zeros((m,) + x.shape[1:], np.float32)])
    index = np.zeros((n + m, 1), np.int32)
    index[n:, 0] = np.where(included, np.arange(1, m + 1), 0)
    labels = np.concatenate([y, np.zeros((m,) + y.shape[1:], y.dtype)])
    target = np.full((n + m, 1), TARGET, np.float32)
    task_weight = np.concatenate([np.ones(n, np.float32), np.zeros(m, np.float32)])
    canary_weight = np.concatenate([np.zeros(n, np.float32), included.astype(np.float32)])
    return ({"features": features, "canary_input": index}, {TASK: labels, CANARY: target},
            {TASK: task_weight, CANARY: canary_weight})


def sample_inclusion(num_canaries, seed) -> np.ndarray:
    """Each canary included independently with probability 1/2 (Steinke et al. 2023)."""
    return np.random.default_rng(seed).random(int(num_canaries)) < 0.5


def mislabeled_canaries(x_pool, y_pool, num_classes, num_canaries, seed):
    """Input-space canaries: held-out inputs with a wrong label (Jagielski et al. 2020).

    ``num_canaries`` inputs from ``(x_pool, y_pool)``, each with a label drawn uniformly among the wrong ones.
    Returns ``(x, y_wrong)``.
    """
    x_pool, y_pool = np.asarray(x_pool), np.asarray(y_pool)
    if not 1 <= num_canaries <= len(x_pool):
        raise ValueError(f"num_canaries must be in [1, {len(x_pool)}] (the pool size), got {num_canaries!r}")
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(x_pool), size=num_canaries, replace=False)
    shift = rng.integers(1, num_classes, size=num_canaries)
    return x_pool[idx], ((y_pool[idx].astype(np.int64) + shift) % num_classes).astype(y_pool.dtype)
