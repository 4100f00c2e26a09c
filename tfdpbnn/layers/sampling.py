"""The one switch that turns weight/activation sampling on at inference (MC prediction).

Stochastic layers of ``tfdpbnn.layers`` sample when ``training`` is true **or** when the Python flag set by
``mc_sampling()`` is on. The flag is read when the layer's ``call`` runs, i.e. at trace time inside a
``tf.function``: a function traced inside ``with mc_sampling():`` keeps sampling whenever it is called later
(this is how the ``mc_predict`` signature of ``tfdpbnn.export_saved_model`` is built), and a function traced
outside it never samples at inference.
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

_STATE = threading.local()


def mc_sampling_active() -> bool:
    """True inside ``with mc_sampling():`` (on this thread)."""
    return getattr(_STATE, "depth", 0) > 0


@contextlib.contextmanager
def mc_sampling():
    """Context manager: stochastic layers sample at inference (``training=False``) while it is open.

    Only the stochastic part is switched on: e.g. ``PublicBatchNormalization`` and Keras layers behave as at
    inference. Used by ``tfdpbnn.uncertainty.mc_predict`` and the exported ``mc_predict`` signature.
    """
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def select(training, train_fn, infer_fn, mc_fn=None):
    """Return ``train_fn()`` in training, else ``mc_fn()`` under ``mc_sampling()``, else ``infer_fn()``.

    ``training`` may be None (inference), a Python bool/int, or a boolean tensor (then ``tf.cond``).
    ``mc_fn`` defaults to ``train_fn``.
    """
    mc_fn = train_fn if mc_fn is None else mc_fn
    rest = mc_fn if mc_sampling_active() else infer_fn
    if training is None:
        return rest()
    if isinstance(training, (bool, int)):
        return train_fn() if training else rest()
    return tf.__internal__.smart_cond.smart_cond(training, train_fn, rest)
