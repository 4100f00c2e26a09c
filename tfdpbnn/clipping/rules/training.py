"""The training-branch check shared by the rules of the sampling layers (local reparameterization)."""

from __future__ import annotations

import tensorflow as tf


def training_reason(kwargs) -> str | None:
    """``None`` when the call runs the training branch (``training=True``), else the reason to fall back.

    The variance rules hold for the training branch only: there the layer samples its pre-activation by
    local reparameterization, whose per-example gradients they compute.
    """
    training = kwargs.get("training")
    static = tf.get_static_value(training) if training is not None else None
    if static is True or static == 1:
        return None
    return f"training={training!r}: the fast rule needs the training branch (training=True)"


class SampledPreactivation:
    """What a local-reparameterization rule keeps from the forward pass.

    The layer input ``x``, the sampled noise ``sqrt(v) xi = z - mean`` and the variance ``v`` it was drawn
    with (eps included).
    """

    def __init__(self, x, noise, var):
        self.x, self.noise, self.var = x, noise, var
