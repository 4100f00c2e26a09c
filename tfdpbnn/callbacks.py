"""Keras callbacks for DP training: privacy spent in the logs, a budget stop, posterior snapshots."""

from __future__ import annotations

import collections
import numbers

import tensorflow as tf


def _dp_optimizer(model):
    from tfdpbnn.optimizers.base import DPOptimizerMixin

    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, DPOptimizerMixin):
        raise ValueError("model: PrivacyCallback needs a model compiled with a tfdpbnn DP optimizer, got "
                         f"{type(optimizer).__name__}")
    return optimizer


class PrivacyCallback(tf.keras.callbacks.Callback):
    """Write the epsilon spent so far into the Keras logs each epoch, and optionally stop at a budget.

    ``logs["epsilon"]`` is the optimizer's ``epsilon(delta, accountant)`` after the epoch (so ``History`` and
    ``TensorBoard`` show it; list this callback BEFORE ``TensorBoard``). ``all_sound=True`` adds
    ``epsilon_<name>`` for every accountant ``tfdpbnn.privacy.sound_accountants()`` names.
    ``stop_at_epsilon``: before training, the largest number of steps whose epsilon stays within the budget
    is found once; training stops after that step, so no step exceeding the budget ever runs.

    Args:
      delta: the delta in (0, 1) epsilon is reported for.
      accountant: a ``tfdpbnn.privacy`` accountant name; default the optimizer's.
      all_sound: also log epsilon by each sound accountant.
      stop_at_epsilon: a budget > 0, or None.
    """

    def __init__(self, delta, accountant=None, all_sound=False, stop_at_epsilon=None):
        super().__init__()
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if stop_at_epsilon is not None and (isinstance(stop_at_epsilon, bool) or not isinstance(
                stop_at_epsilon, numbers.Real) or not stop_at_epsilon > 0):
            raise ValueError(f"stop_at_epsilon must be a number > 0 or None, got {stop_at_epsilon!r}")
        if accountant is not None:
            from tfdpbnn import privacy

            if accountant not in privacy.available_accountants():
                raise ValueError(f"accountant must be one of {tuple(privacy.available_accountants())}, "
                                 f"got {accountant!r}")
        self.delta = float(delta)
        self.accountant = accountant
        self.all_sound = bool(all_sound)
        self.stop_at_epsilon = stop_at_epsilon
        self.max_steps = None
        self.stopped_at_step = None

    def _max_steps(self, optimizer) -> int:
        """Largest T with epsilon(T) <= budget (epsilon grows with T: exponential then binary search)."""

        def within(steps):
            return optimizer.epsilon_after(steps, delta=self.delta, accountant=self.accountant) \
                <= self.stop_at_epsilon

        if not within(1):
            return 0
        lo, hi = 1, 2
        while within(hi):
            lo, hi = hi, hi * 2
            if hi > 10 ** 9:
                return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if within(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def on_train_begin(self, logs=None):
        optimizer = _dp_optimizer(self.model)
        if self.stop_at_epsilon is not None:
            self.max_steps = self._max_steps(optimizer)
            if optimizer.steps >= self.max_steps:
                raise ValueError(
                    f"stop_at_epsilon: the budget {self.stop_at_epsilon} allows {self.max_steps} steps and "
                    f"{optimizer.steps} were already taken; one more step would exceed it")

    def on_train_batch_end(self, batch, logs=None):
        if self.max_steps is not None:
            steps = int(self.model.optimizer.iterations.numpy())
            if steps >= self.max_steps:
                self.model.stop_training = True
                self.stopped_at_step = steps

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        optimizer = _dp_optimizer(self.model)
        logs["epsilon"] = optimizer.epsilon(delta=self.delta, accountant=self.accountant)
        if self.all_sound:
            from tfdpbnn import privacy

            for name in privacy.sound_accountants():
                logs[f"epsilon_{name}"] = optimizer.epsilon(delta=self.delta, accountant=name)


class PosteriorSampler(tf.keras.callbacks.Callback):
    """Keep thinned weight snapshots of DP-SGLD after burn-in: posterior samples (Zhang et al. 2022, section
    3.1).

    After step ``burn_in``, every ``thinning``-th step's ``model.get_weights()`` is kept; at most the last
    ``max_samples`` are. ``samples`` is the list ``tfdpbnn.uncertainty.mc_predict`` accepts as weight
    snapshots. Snapshots are post-processing of the DP iterates: they cost no privacy.
    """

    def __init__(self, burn_in=0, thinning=1, max_samples=100):
        super().__init__()
        if isinstance(burn_in, bool) or not isinstance(burn_in, numbers.Integral) or burn_in < 0:
            raise ValueError(f"burn_in must be an integer >= 0, got {burn_in!r}")
        if isinstance(thinning, bool) or not isinstance(thinning, numbers.Integral) or thinning < 1:
            raise ValueError(f"thinning must be an integer >= 1, got {thinning!r}")
        if isinstance(max_samples, bool) or not isinstance(max_samples, numbers.Integral) or max_samples < 1:
            raise ValueError(f"max_samples must be an integer >= 1, got {max_samples!r}")
        self.burn_in = int(burn_in)
        self.thinning = int(thinning)
        self.max_samples = int(max_samples)
        self._samples = collections.deque(maxlen=self.max_samples)
        self.sampled_steps = collections.deque(maxlen=self.max_samples)

    @property
    def samples(self):
        """The kept snapshots, oldest first (each a ``model.get_weights()`` list)."""
        return list(self._samples)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step > self.burn_in and (step - self.burn_in) % self.thinning == 0:
            self._samples.append(self.model.get_weights())
            self.sampled_steps.append(step)
