"""Post-processing of the released DP iterates: their moving average, and a posterior fitted to them.

Every iterate of a DP optimizer is already covered by its privacy statement (each step's update is the
released noisy gradient; the sequence of weights is a function of the released gradients and the public
initialization). So any function of the iterates costs no privacy (post-processing, Dwork & Roth 2014,
Proposition 2.1):

- ``IterateAverage``: an exponential moving average of the weights after every step (Polyak averaging while
  t / (t + 1) < decay), loaded into the model when training ends. De et al. (2022, sec. 3.1) report that it
  raises DP-SGD's accuracy at a fixed epsilon.
- ``IterateMoments``: a diagonal Gaussian fitted to the first and second moments of the iterates after a
  burn-in, SWAG-diagonal (Maddox et al. 2019, sec. 3.2): theta ~ N(mean, scale * diag(E[theta^2] -
  mean^2)). ``sample(k)`` returns weight snapshots for ``tfdpbnn.uncertainty.mc_predict(...,
  weight_snapshots=...)``; ``iterates`` keeps the last ``max_iterates`` thinned iterates themselves (an
  ensemble of iterates, the same list type).

Both are Keras callbacks that read ``model.trainable_variables`` after each training batch; neither reads
data, so ``optimizer.privacy_statement()`` is the same with or without them.
"""

from __future__ import annotations

import collections
import numbers

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_nonnegative_int, check_positive_int, check_real


class IterateAverage(tf.keras.callbacks.Callback):
    """Exponential moving average of the trainable weights of the DP iterates (De et al. 2022, sec. 3.1).

    After step t the average a becomes ``r a + (1 - r) w_t`` with r = min(``decay``, t / (t + 1)) (Polyak
    averaging at first), starting from the weights at ``on_train_begin``. When training ends the average is
    loaded into the model (``swap_at_end=True``, the default) and the last iterate is kept in
    ``last_iterate``. Post-processing of the released iterates: no privacy cost.
    """

    def __init__(self, decay: float = 0.9, swap_at_end: bool = True):
        super().__init__()
        self.decay = check_real("decay", decay, low=0.0, high=1.0, high_open=True)
        if not isinstance(swap_at_end, bool):
            raise ValueError(f"swap_at_end must be True or False, got {swap_at_end!r}")
        self.swap_at_end = swap_at_end
        self.average = None
        self.last_iterate = None
        self.steps = 0

    def on_train_begin(self, logs=None):
        """Start the average at the model's current trainable weights."""
        self.steps = 0
        self.average = [np.array(w.numpy(), dtype=np.float64) for w in self.model.trainable_variables]

    def on_train_batch_end(self, batch, logs=None):
        """Fold the weights after this step into the average."""
        self.steps += 1
        rate = min(self.decay, self.steps / (self.steps + 1.0))
        for a, w in zip(self.average, self.model.trainable_variables, strict=True):
            a *= rate
            a += (1.0 - rate) * w.numpy()

    def on_train_end(self, logs=None):
        """Keep the last iterate and, if ``swap_at_end``, load the average into the model."""
        self.last_iterate = [w.numpy() for w in self.model.trainable_variables]
        if self.swap_at_end:
            self.swap_in()

    def swap_in(self):
        """Assign the averaged weights to the model's trainable variables."""
        if self.average is None:
            raise ValueError("IterateAverage.swap_in: no average yet (pass the callback to model.fit first)")
        for a, w in zip(self.average, self.model.trainable_variables, strict=True):
            w.assign(a.astype(tf.as_dtype(w.dtype).as_numpy_dtype))
        watch = getattr(getattr(self.model, "optimizer", None), "_dp_write_watch", None)
        if watch is not None:  # the average of the DP iterates: post-processing, accepted by the state checks
            watch.note_post_processing()


class IterateMoments(tf.keras.callbacks.Callback):
    """A diagonal Gaussian over the weights fitted to the DP iterates (SWAG-diagonal, Maddox et al. 2019).

    After step ``burn_in``, every ``thinning``-th iterate updates running first and second moments of each
    trainable weight; the last ``max_iterates`` of them are also kept (``iterates``). ``sample(k, seed)``
    draws k weight lists theta = mean + sqrt(``scale`` * var) * z, z ~ N(0, I), var = E[theta^2] - mean^2
    (floored at 0), for ``mc_predict(model, x, weight_snapshots=...)``. Non-trainable weights keep the
    model's values at the end of training. Post-processing of the released iterates: no privacy cost.
    """

    def __init__(self, burn_in: int = 0, thinning: int = 1, max_iterates: int = 20, scale: float = 1.0):
        super().__init__()
        self.burn_in = check_nonnegative_int("burn_in", burn_in)
        self.thinning = check_positive_int("thinning", thinning)
        self.max_iterates = check_positive_int("max_iterates", max_iterates)
        self.scale = check_real("scale", scale, low=0.0)
        self.count = 0
        self._first = self._second = None
        self._iterates = collections.deque(maxlen=self.max_iterates)
        self._base = None
        self._positions = None

    def on_train_begin(self, logs=None):
        """Reset the moments; remember where each trainable variable sits in ``model.get_weights()``."""
        position = {id(w): i for i, w in enumerate(self.model.weights)}
        self._positions = [position[id(w)] for w in self.model.trainable_variables]
        self.count = 0
        self._step = 0
        self._first = [np.zeros(w.shape, np.float64) for w in self.model.trainable_variables]
        self._second = [np.zeros(w.shape, np.float64) for w in self.model.trainable_variables]
        self._iterates.clear()

    def on_train_batch_end(self, batch, logs=None):
        """After burn-in, fold every ``thinning``-th iterate into the moments."""
        self._step += 1
        if self._step <= self.burn_in or (self._step - self.burn_in) % self.thinning:
            return
        values = [w.numpy().astype(np.float64) for w in self.model.trainable_variables]
        self.count += 1
        for m1, m2, v in zip(self._first, self._second, values, strict=True):
            m1 += (v - m1) / self.count
            m2 += (v * v - m2) / self.count
        self._iterates.append(values)

    def on_train_end(self, logs=None):
        """Keep the model's final weights as the base of the snapshots (non-trainable weights)."""
        self._base = self.model.get_weights()

    def _check_fitted(self):
        if self.count == 0 or self._base is None:
            raise ValueError("IterateMoments: no iterate was collected (fit the model with this callback for "
                             f"more than burn_in={self.burn_in} steps)")

    def _snapshot(self, trainable):
        weights = list(self._base)
        for i, value in zip(self._positions, trainable, strict=True):
            weights[i] = value.astype(weights[i].dtype)
        return weights

    @property
    def mean(self):
        """The mean of the collected iterates, as a ``model.get_weights()`` list."""
        self._check_fitted()
        return self._snapshot(self._first)

    @property
    def variance(self):
        """The per-weight variance of the collected iterates (trainable variables' order)."""
        self._check_fitted()
        return [np.maximum(m2 - m1 * m1, 0.0) for m1, m2 in zip(self._first, self._second, strict=True)]

    @property
    def iterates(self):
        """The last ``max_iterates`` collected iterates, each a ``model.get_weights()`` list (an ensemble)."""
        self._check_fitted()
        return [self._snapshot(values) for values in self._iterates]

    def sample(self, num_samples: int, seed=None):
        """``num_samples`` weight lists from N(mean, scale * diag(variance)), for ``mc_predict``."""
        num_samples = check_positive_int("num_samples", num_samples)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"seed must be None or an integer, got {seed!r}")
        rng = np.random.default_rng(seed)
        std = [np.sqrt(self.scale * v) for v in self.variance]
        return [self._snapshot([m + s * rng.standard_normal(m.shape) for m, s in zip(self._first, std,
                                                                                      strict=True)])
                for _ in range(num_samples)]


__all__ = ["IterateAverage", "IterateMoments"]
