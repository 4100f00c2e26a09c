"""Pre-activation taps for Keras layers that apply their activation inside ``call`` (Dense, Conv2D).

Keras' own layers have no public method returning the pre-activation, so the rules run the layer's ``call``
once with its public ``activation`` attribute set to the identity and apply the activation themselves: one
forward pass, the same outputs.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf


@contextlib.contextmanager
def linear_activation(layer):
    """Temporarily make ``layer.activation`` the identity, so its ``call`` returns the pre-activation."""
    own = "activation" in layer.__dict__
    saved = getattr(layer, "activation", None)
    object.__setattr__(layer, "activation", tf.keras.activations.linear)
    try:
        yield saved
    finally:
        if own:
            object.__setattr__(layer, "activation", saved)
        else:
            object.__delattr__(layer, "activation")


def call_preactivation(layer, call, inputs, *args, **kwargs):
    """``(outputs, z)``: the layer's output and its pre-activation, from one run of its own ``call``."""
    with linear_activation(layer) as activation:
        z = call(inputs, *args, **kwargs)
    outputs = activation(z) if activation is not None else z
    return outputs, z
