"""Route ``model.fit``'s train step to a DP optimizer's own step.

Keras 2.15's ``Model.train_step`` reduces the loss to a scalar before the optimizer sees it, leaving nothing
to clip per example. ``install()`` (run once when ``tfdpbnn.optimizers`` is imported) wraps
``tf.keras.Model.train_step``: when the compiled optimizer is a tfdpbnn DP optimizer the step is
``optimizer.dp_train_step(model, data)`` (per-example clipping, noise, update, metrics); any other optimizer
gets Keras's original step unchanged. Models that override ``train_step`` themselves keep their own step and
must pass a per-example loss vector to ``optimizer.minimize`` (a scalar raises ``ValueError``).
"""

from __future__ import annotations

import functools

import tensorflow as tf

_original_train_step = None


def install() -> None:
    """Install the train-step hook on ``tf.keras.Model`` (idempotent)."""
    global _original_train_step
    current = tf.keras.Model.train_step
    if getattr(current, "_tfdpbnn_hook", False):
        return
    _original_train_step = current

    @functools.wraps(current)
    def train_step(self, data):
        from tfdpbnn.optimizers.base import DPOptimizerMixin

        optimizer = getattr(self, "optimizer", None)
        if isinstance(optimizer, DPOptimizerMixin):
            return optimizer.dp_train_step(self, data)
        return _original_train_step(self, data)

    train_step._tfdpbnn_hook = True
    tf.keras.Model.train_step = train_step
