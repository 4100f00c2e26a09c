"""One thin adapter per Keras major version; everything else of tfdpbnn is written once.

``current()`` is the adapter of the Keras that ``tf.keras`` is (``tfdpbnn._keras_version.KERAS_MAJOR``):

- ``keras2``: tensorflow-privacy's vectorized Keras 2 optimizers are the base classes of tfdpbnn's
  optimizers (as before); the Keras 2 private names stay in ``tfdpbnn._private_api``.
- ``keras3``: base classes of tfdpbnn's own on ``keras.optimizers.SGD``/``Adam`` (tensorflow-privacy has
  none for Keras 3), and the Keras 3 private names (the compiled loss, the loss tracker) tfdpbnn needs.

Both adapters expose ``optimizer_bases()`` -> ``(sgd_base, adam_base)``; the DP mechanism, the clipping
rules, the accountants and the record do not depend on which one runs.
"""

from __future__ import annotations

import importlib

from tfdpbnn import _keras_version


def current():
    """The adapter module of the Keras ``tf.keras`` is in this process."""
    return importlib.import_module(f"tfdpbnn._adapters.keras{_keras_version.KERAS_MAJOR}")


def optimizer_bases():
    """``(sgd_base, adam_base)``: the Keras optimizer classes tfdpbnn's DP optimizers subclass here."""
    return current().optimizer_bases()
