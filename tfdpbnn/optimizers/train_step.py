"""Route ``model.fit``'s train step to a DP optimizer's own step, and account for what ``fit`` really feeds.

Keras 2.15's ``Model.train_step`` reduces the loss to a scalar before the optimizer sees it, leaving nothing
to clip per example. ``install()`` (run once when ``tfdpbnn.optimizers`` is imported) wraps
``tf.keras.Model.train_step``: when the compiled optimizer is a tfdpbnn DP optimizer the step is
``optimizer.dp_train_step(model, data)`` (per-example clipping, noise, update, metrics); any other optimizer
gets Keras's original step unchanged. ``Model.fit`` is wrapped too: with a DP optimizer it first calls
``optimizer.begin_training`` (checks the input and the model, opens the privacy-ledger phase), warns when
the planned training exceeds the optimizer's budget, and puts ``DPTrainingMonitor`` (budget stop, Poisson
test of the realized batch sizes, epsilon in the logs) and any ``PrivacyCallback`` at the front of the
callbacks, so that ``History`` and ``TensorBoard`` see epsilon. Models that override ``train_step``
themselves must pass a per-example loss vector to ``optimizer.minimize`` (a scalar raises ``ValueError``).
"""

from __future__ import annotations

import functools
import inspect
import math

import tensorflow as tf

_original_train_step = None
_original_fit = None


def _planned_steps(model, x, arguments):
    """Steps ``fit`` will run (None when the input's length is unknown)."""
    from tfdpbnn.optimizers import fit_checks

    epochs = int(arguments.get("epochs", 1)) - int(arguments.get("initial_epoch", 0))
    per_epoch = arguments.get("steps_per_epoch")
    if per_epoch is None:
        if isinstance(x, tf.data.Dataset):
            card = int(x.cardinality().numpy())
            per_epoch = card if card > 0 else None
        else:
            rows = fit_checks._num_rows(x)
            if rows is not None:
                train = int(math.floor(rows * (1.0 - float(arguments.get("validation_split") or 0.0))))
                batch = arguments.get("batch_size") or 32
                per_epoch = int(math.ceil(train / batch))
    if per_epoch is None:
        return None
    return max(0, epochs) * int(per_epoch)


def _dp_fit_arguments(model, optimizer, arguments):
    """Check and prepare one DP ``fit`` call; returns the arguments to pass on."""
    from tfdpbnn.callbacks import DPTrainingMonitor, PrivacyCallback

    x = arguments.get("x")
    optimizer.begin_training(model, x, arguments.get("y"), batch_size=arguments.get("batch_size"),
                             validation_split=arguments.get("validation_split") or 0.0,
                             shuffle=arguments.get("shuffle", True))
    optimizer.warn_if_plan_exceeds_budget(_planned_steps(model, x, arguments))
    callbacks = arguments.get("callbacks")
    if isinstance(callbacks, tf.keras.callbacks.CallbackList):
        callbacks = list(callbacks.callbacks)
    callbacks = list(callbacks or [])
    privacy = [c for c in callbacks if isinstance(c, PrivacyCallback)]
    others = [c for c in callbacks if not isinstance(c, PrivacyCallback | DPTrainingMonitor)]
    description = optimizer._dp_ledger.open_description()
    whole_passes = (isinstance(x, tf.data.Dataset) and arguments.get("steps_per_epoch") is None
                    and description["kind"] == "shuffle")
    arguments["callbacks"] = [DPTrainingMonitor(check_passes=whole_passes)] + privacy + others
    return arguments


def install() -> None:
    """Install the train-step and fit hooks on ``tf.keras.Model`` (idempotent)."""
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

    global _original_fit
    _original_fit = tf.keras.Model.fit
    signature = inspect.signature(_original_fit)

    @functools.wraps(_original_fit)
    def fit(self, *args, **kwargs):
        from tfdpbnn.optimizers.base import DPOptimizerMixin

        optimizer = getattr(self, "optimizer", None)
        if not isinstance(optimizer, DPOptimizerMixin):
            return _original_fit(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        extra = arguments.pop("kwargs", {}) or {}
        arguments = _dp_fit_arguments(self, optimizer, arguments)
        return _original_fit(self, **arguments, **extra)

    tf.keras.Model.fit = fit
