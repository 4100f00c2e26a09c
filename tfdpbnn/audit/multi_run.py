"""Multi-run white-box audit: many training runs with and without one Dirac gradient canary.

Jagielski et al. 2020 and Nasr et al. 2021/2023: train R times, the canary in every other run, score each run
by the canary coordinate's displacement (the auditor sees the initial and final weights), and bound epsilon
with ``multi_run_epsilon`` / ``gdp_lower_bound``. Every run is ``steps_per_run`` steps of the user's compiled
model and optimizer through ``model.fit``; one ``fit`` call runs them all, one run per Keras epoch: a
callback records the score at the end of each epoch and resets the weights to the same initial values and
the optimizer's step counter to 0. The optimizer must keep no other state (plain SGD-type updates), so a run
is exactly a fresh training run, and R runs cost R * steps_per_run train steps, not R graph compilations.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_positive_int
from tfdpbnn.audit.canaries import canary_weights, gradient_canary_data
from tfdpbnn.data.sampling import assert_sampling


def check_stateless(optimizer) -> None:
    """Refuse an optimizer with per-variable state (momentum, Adam moments): a reset could not clear it."""
    config = optimizer.get_config()     # slots exist only after the first step, the configuration before
    if "beta_1" in config or config.get("momentum"):
        raise ValueError("optimizer: it keeps per-variable state (momentum or Adam moments), so runs would "
                         "not be independent; the multi-run audit needs a plain SGD-type DP optimizer")


class _RunBoundaries(tf.keras.callbacks.Callback):
    """Records the canary displacement at each epoch end, then starts the next run from scratch."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer_ = optimizer
        self.scores = []

    def on_train_begin(self, logs=None):
        self.initial = self.model.get_weights()
        self.w0 = canary_weights(self.model)[0]
        check_stateless(self.optimizer_)
        self.optimizer_.iterations.assign(0)

    def on_epoch_end(self, epoch, logs=None):
        self.scores.append(canary_weights(self.model)[0] - self.w0)
        self.model.set_weights(self.initial)
        self.optimizer_.iterations.assign(0)
        watch = getattr(self.optimizer_, "_dp_write_watch", None)
        if watch is not None:  # the next run starts from the initial weights, on purpose
            watch.disarm()


def multi_run_scores(model, optimizer, x, y, num_runs, steps_per_run):
    """Scores of ``num_runs`` full-batch runs of ``steps_per_run`` steps; the canary is in the even ones.

    Args:
      model: a ``with_gradient_canaries(user_model, 1, ...)`` model compiled with ``optimizer`` and
        ``canary_losses(task_loss)``.
      optimizer: the model's DP optimizer, built with ``batch_size = num_examples = len(x) + 1``: every step
        is one full batch, so the run is a composition of ``steps_per_run`` Gaussian mechanisms.
      x: the real training inputs (the canary is appended as the last example).
      y: the real training labels.
      num_runs: R (even).
      steps_per_run: T.

    Returns ``(in_scores, out_scores)``: final minus initial canary weight of each run.
    """
    num_runs = check_positive_int("num_runs", num_runs)
    if num_runs < 2 or num_runs % 2:
        raise ValueError(f"num_runs must be an even integer >= 2, got {num_runs!r}")
    steps_per_run = check_positive_int("steps_per_run", steps_per_run)
    if optimizer.batch_size != len(x) + 1:
        raise ValueError(f"optimizer: batch_size must be len(x) + 1 = {len(x) + 1} (full batches), got "
                         f"{optimizer.batch_size}")
    with_canary = gradient_canary_data(x, y, np.array([True]))
    without = gradient_canary_data(x, y, np.array([False]))
    flags = np.repeat(np.arange(num_runs) % 2 == 0, steps_per_run)

    def batch(flag):
        return tuple(tf.nest.map_structure(lambda a, b: tf.where(flag, a, b), w, wo)
                     for w, wo in zip(with_canary, without, strict=True))

    # Every step is one full batch of the same len(x) + 1 examples: passes over the data, asserted.
    data = assert_sampling(tf.data.Dataset.from_tensor_slices(flags).map(batch), "shuffle",
                           num_examples=len(x) + 1)
    boundaries = _RunBoundaries(optimizer)
    model.fit(data, epochs=num_runs, steps_per_epoch=steps_per_run, verbose=0, callbacks=[boundaries])
    scores = np.asarray(boundaries.scores)
    return scores[0::2], scores[1::2]
