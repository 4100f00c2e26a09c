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

import copy
import importlib

from tfdpbnn import _keras_version


def current():
    """The adapter module of the Keras ``tf.keras`` is in this process."""
    return importlib.import_module(f"tfdpbnn._adapters.keras{_keras_version.KERAS_MAJOR}")


def optimizer_bases():
    """``(sgd_base, adam_base)``: the Keras optimizer classes tfdpbnn's DP optimizers subclass here."""
    return current().optimizer_bases()


def keras_batch_save_decision(callback, batch, base) -> bool | None:
    """Keras's own ``_should_save_on_batch(batch)`` of ``callback`` (a ``base``), decided on a shallow copy.

    The method adds the batches seen since the callback's last batch end to its integer counters and says
    whether they reached ``save_freq``; run on a copy, it leaves the callback's own counters as they are.
    None where Keras's decision is not the one ``callback`` makes (its class has a batch hook or decision
    of its own) or ``base`` has no such method.
    """
    decide = getattr(base, "_should_save_on_batch", None)
    kind = type(callback)
    if decide is None or kind.on_train_batch_end is not base.on_train_batch_end or getattr(
            kind, "_should_save_on_batch", None) is not decide:
        return None
    try:
        return bool(decide(copy.copy(callback), batch))
    except (AttributeError, TypeError):  # counters Keras no longer has
        return None
