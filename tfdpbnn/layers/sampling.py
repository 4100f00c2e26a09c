"""The one switch that turns weight/activation sampling on at inference (MC prediction).

Stochastic layers of ``tfdpbnn.layers`` sample when ``training`` is true **or** inside
``with mc_sampling():``. The switch has a Python side, read when a layer's ``call`` runs (at trace time in a
``tf.function``), and a runtime side, a boolean variable that is true only while a block is open:

* eager calls inside the block sample; outside they do not;
* a function traced inside the block (``model.predict`` called there, or any ``tf.function``) contains a
  ``tf.cond`` on the variable, so it samples when called inside a block and is deterministic after the
  block closes (the switch does not leak into later predictions through Keras' cached functions);
* a function traced outside any block never samples at inference (trace it inside one to sample).

``sample_in_trace()`` is the export variant: functions traced inside it sample whenever they are called
(``tfdpbnn.export_saved_model`` builds the SavedModel's ``mc_predict`` signature that way).
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

_STATE = threading.local()
_LOCK = threading.Lock()
_OPEN = [0]  # open mc_sampling() blocks over all threads (drives the runtime variable)
_FLAG = []  # the runtime variable, created on first use


def _runtime_flag():
    if not _FLAG:
        with tf.init_scope():
            _FLAG.append(tf.Variable(False, trainable=False, name="tfdpbnn_mc_sampling",
                                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA))
    return _FLAG[0]


def mc_sampling_active() -> bool:
    """True inside ``with mc_sampling():`` (on this thread)."""
    return getattr(_STATE, "depth", 0) > 0


@contextlib.contextmanager
def mc_sampling():
    """Context manager: stochastic layers sample at inference (``training=False``) while it is open.

    Only the stochastic part is switched on: e.g. ``PublicBatchNormalization`` and Keras layers behave as at
    inference. Everything returns to deterministic inference when the block closes, including functions
    traced inside it (see the module docstring). Used by ``tfdpbnn.uncertainty.mc_predict``.
    """
    flag = _runtime_flag()
    with _LOCK:
        _OPEN[0] += 1
        flag.assign(True)
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        with _LOCK:
            _OPEN[0] -= 1
            if _OPEN[0] == 0:
                flag.assign(False)


@contextlib.contextmanager
def sample_in_trace():
    """Context manager for export: functions traced inside it sample at inference on every later call.

    There is no runtime switch (the SavedModel ``mc_predict`` signature of ``tfdpbnn.export_saved_model``).
    """
    _STATE.static = getattr(_STATE, "static", 0) + 1
    try:
        yield
    finally:
        _STATE.static -= 1


def _inference_fn(infer_fn, mc_fn):
    if getattr(_STATE, "static", 0) > 0:
        return mc_fn
    if not mc_sampling_active():
        return infer_fn
    if not tf.inside_function():
        return mc_fn
    flag = _runtime_flag()
    return lambda: tf.cond(flag, mc_fn, infer_fn)


def select(training, train_fn, infer_fn, mc_fn=None):
    """Return ``train_fn()`` in training, else ``mc_fn()`` under ``mc_sampling()``, else ``infer_fn()``.

    ``training`` may be None (inference), a Python bool/int, or a boolean tensor (then ``tf.cond``).
    ``mc_fn`` defaults to ``train_fn``.
    """
    mc_fn = train_fn if mc_fn is None else mc_fn
    rest = _inference_fn(infer_fn, mc_fn)
    if training is None:
        return rest()
    if isinstance(training, bool | int):
        return train_fn() if training else rest()
    return tf.__internal__.smart_cond.smart_cond(training, train_fn, rest)
