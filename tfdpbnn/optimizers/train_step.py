"""Route ``model.fit``'s train step to a DP optimizer's own step.

Keras 2.15's ``Model.train_step`` reduces the loss to a scalar before the optimizer sees it, leaving nothing
to clip per example. ``install()`` (run once when ``tfdpbnn.optimizers`` is imported) wraps
``tf.keras.Model.train_step``: when the compiled optimizer is a tfdpbnn DP optimizer the step is
``optimizer.dp_train_step(model, data)`` (per-example clipping, noise, update, metrics); any other optimizer
gets Keras's original step unchanged. ``Model.fit`` is wrapped too, to refuse input whose sampling the
optimizer's accounting does not cover (``check_fit_input``). Models that override ``train_step`` themselves
keep their own step and must pass a per-example loss vector to ``optimizer.minimize`` (a scalar raises
``ValueError``).
"""

from __future__ import annotations

import functools

import tensorflow as tf

_original_train_step = None
_original_fit = None


def check_fit_input(optimizer, x, batch_size):
    """Refuse a ``model.fit`` input whose sampling the optimizer's accounting does not cover.

    - sampling="poisson": ``x`` must come from ``tfdpbnn.data.poisson_batches`` at the optimizer's sample
      rate (a different rate raises; an untagged dataset, e.g. after ``.prefetch()``, warns).
    - sampling="shuffle" with arrays: the fit batch size (Keras's default is 32) must not exceed the
      optimizer's ``batch_size``, else an epoch has fewer steps than the accounting's epoch and epsilon
      would be under-reported.
    """
    import warnings

    rate = getattr(x, "_tfdpbnn_poisson_sample_rate", None)
    is_dataset = isinstance(x, tf.data.Dataset)
    if optimizer.sampling == "poisson":
        if rate is not None:
            if abs(rate - optimizer.sample_rate) > 1e-9 * max(1.0, optimizer.sample_rate):
                raise ValueError(
                    f"x: batches were Poisson-sampled at rate {rate} but the optimizer accounts for sample "
                    f"rate {optimizer.sample_rate} (batch_size / num_examples); make them equal")
        elif is_dataset:
            warnings.warn("x: the optimizer accounts for Poisson sampling; epsilon is valid only if this "
                          "dataset draws its batches as tfdpbnn.data.poisson_batches does (at rate "
                          f"{optimizer.sample_rate})", UserWarning, stacklevel=3)
        else:
            raise ValueError(
                "x: the optimizer was built with sampling='poisson', but model.fit on arrays draws shuffled "
                "fixed-size batches; pass tfdpbnn.data.poisson_batches(x, y, sample_rate=...) or build the "
                "optimizer with sampling='shuffle'")
    elif not is_dataset and x is not None:
        fit_batch = 32 if batch_size is None else batch_size
        if fit_batch > optimizer.batch_size:
            raise ValueError(
                f"batch_size: model.fit uses batches of {fit_batch} but the optimizer accounts for "
                f"batch_size={optimizer.batch_size}; larger batches mean fewer steps per epoch than the "
                "accounting assumes. Pass the same batch_size to both.")


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

    global _original_fit
    _original_fit = tf.keras.Model.fit

    @functools.wraps(_original_fit)
    def fit(self, x=None, y=None, batch_size=None, *args, **kwargs):
        from tfdpbnn.optimizers.base import DPOptimizerMixin

        optimizer = getattr(self, "optimizer", None)
        if isinstance(optimizer, DPOptimizerMixin):
            check_fit_input(optimizer, x, batch_size)
        return _original_fit(self, x, y, batch_size, *args, **kwargs)

    tf.keras.Model.fit = fit
