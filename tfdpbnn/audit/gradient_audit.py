"""``GradientCanaryAudit``: the one-run white-box audit of a model trained with ``compile``/``fit``.

Steinke, Nasr & Jagielski 2023 with Dirac gradient canaries (Nasr et al. 2023): m canaries,
each included with probability 1/2, are added to the training data of the user's own model and optimizer;
after ``model.fit`` the canary coordinates are scored and ``tfdpbnn.audit.one_run_epsilon`` turns the
correct guesses into a lower bound on epsilon. See ``docs/audit.md``.
"""

from __future__ import annotations

import math

import numpy as np

from tfdpbnn.audit import canaries as C
from tfdpbnn.audit.bounds import one_run_epsilon
from tfdpbnn.audit.fdp_one_run import one_run_gdp_bound
from tfdpbnn.audit.scores import UpdateRecorder, displacement_scores, likelihood_ratio_scores, update_unit


class GradientCanaryAudit:
    """One-run audit with m Dirac gradient canaries.

    Usage (``docs/audit.md``)::

        audit = GradientCanaryAudit(num_canaries=1000, seed=0)
        model = audit.wrap(user_model, l2_norm_clip=C)
        inputs, targets, weights = audit.data(x, y)   # n real examples, then the m canaries
        optimizer = tfdpbnn.DPSGDOptimizer(C, ..., num_examples=len(targets["task"]), ...)
        model.compile(optimizer=optimizer, loss=audit.losses(user_loss))
        model.fit(tfdpbnn.data.poisson_batches(inputs, targets, sample_rate=q, sample_weight=weights),
                  epochs=E, callbacks=[audit.recorder])
        result = audit.result(model, optimizer, delta=1e-5)   # OneRunResult

    Args:
      num_canaries: m.
      seed: seed of the inclusion draw (each canary in with probability 1/2), or ``included``: the
        inclusion vector itself (boolean, length m; the multi-run audit passes [True] / [False]).
      gain_factor: a canary's gradient norm is ``gain_factor * C`` before clipping (> 1 so it is clipped).
    """

    def __init__(self, num_canaries=1000, seed=0, included=None, gain_factor=10.0):
        if included is None:
            included = C.sample_inclusion(num_canaries, seed)
        self.included = np.asarray(included)
        if self.included.dtype != bool or self.included.ndim != 1 or self.included.size != num_canaries:
            raise ValueError(f"included must be a boolean vector of length num_canaries={num_canaries}")
        self.num_canaries = int(num_canaries)
        self.gain_factor = float(gain_factor)
        self.recorder = UpdateRecorder()
        self._initial = None

    def wrap(self, model, l2_norm_clip, noisy=False, unclipped_scale=None):
        """``tfdpbnn.audit.with_gradient_canaries(model, m, l2_norm_clip, ...)``.

        Also remembers the initial canary weights.
        """
        audit_model = C.with_gradient_canaries(model, self.num_canaries, l2_norm_clip, self.gain_factor,
                                               noisy=noisy, unclipped_scale=unclipped_scale)
        self._initial = C.canary_weights(audit_model)
        return audit_model

    def data(self, x, y):
        """``(inputs, targets, sample_weights)``: the real examples then the m canaries."""
        return C.gradient_canary_data(x, y, self.included)

    @staticmethod
    def losses(task_loss):
        """``model.compile(loss=...)`` for the wrapped model: ``tfdpbnn.audit.canary_losses(task_loss)``."""
        return C.canary_losses(task_loss)

    def scores(self, model, optimizer, score="auto"):
        """Per-canary scores: "likelihood_ratio", "displacement" or "auto" (the first that applies).

        "likelihood_ratio" uses every update (SGD-type optimizers with sigma > 0); "displacement" uses the
        final weights only.
        """
        if score not in ("auto", "likelihood_ratio", "displacement"):
            raise ValueError(f"score must be 'auto', 'likelihood_ratio' or 'displacement', got {score!r}")
        unit = update_unit(optimizer)
        weights = self.recorder.weights if self.recorder.num_recorded else None
        usable = unit is not None and weights is not None and optimizer.noise_multiplier > 0 \
            and len(weights) == optimizer.steps + 1
        if score == "likelihood_ratio" and not usable:
            raise ValueError("score='likelihood_ratio' needs audit.recorder in model.fit's callbacks, an "
                             "SGD-type optimizer without momentum or schedule, and noise_multiplier > 0")
        if score == "displacement" or not usable:
            return displacement_scores(self._initial, C.canary_weights(model)), "displacement"
        return likelihood_ratio_scores(weights, unit, optimizer.noise_multiplier,
                                       optimizer.sample_rate), "likelihood_ratio"

    def result(self, model, optimizer, delta, confidence=0.95, score="auto", estimator="steinke"):
        """``(result, score_name)``: the one-run lower bound on epsilon at ``confidence``.

        ``estimator="steinke"``: ``tfdpbnn.audit.one_run_epsilon`` (Steinke, Nasr & Jagielski 2023), a
        ``OneRunResult``. ``estimator="fdp"``: ``tfdpbnn.audit.one_run_gdp_bound`` (Mahloujifar, Melis &
        Chaudhuri 2024 with mu-GDP claims), a ``FdpOneRunResult`` whose ``mu`` compares with the run's exact
        claim ``sqrt(steps) / noise_multiplier`` (``claimed_mu``). Only for full-batch runs (sample rate 1):
        every step is then the Gaussian mechanism and T steps are exactly mu-GDP (Dong, Roth & Su 2019,
        Corollary 3.3); a subsampled run's tradeoff curve is not Gaussian, so a GDP claim is not its claim
        and the estimator is refused.
        """
        if estimator not in ("steinke", "fdp"):
            raise ValueError(f"estimator must be 'steinke' or 'fdp', got {estimator!r}")
        if estimator == "fdp":
            self.claimed_mu(optimizer)  # refuses subsampled runs before any work
        scores, name = self.scores(model, optimizer, score)
        if estimator == "fdp":
            return one_run_gdp_bound(scores, self.included, delta=delta, confidence=confidence), name
        return one_run_epsilon(scores, self.included, delta=delta, confidence=confidence), name

    @staticmethod
    def claimed_mu(optimizer) -> float:
        """The exact mu-GDP claim of a full-batch run: ``sqrt(steps) / noise_multiplier`` (sensitivity C).

        Dong, Roth & Su (2019), Corollary 3.3 (add/remove neighbours; "replace_one" doubles the sensitivity).
        Raises ValueError for a subsampled run (sample rate below 1), whose claim is not Gaussian.
        """
        if optimizer.sample_rate < 1.0:
            raise ValueError(
                f"estimator 'fdp': the run samples at q = {optimizer.sample_rate:.4g} < 1; its tradeoff "
                "curve (a subsampled Gaussian composition) is not mu-GDP, so the f-DP one-run audit with GDP "
                "claims does not apply. Audit a full-batch run (batch_size = num_examples) or use "
                "estimator='steinke'")
        sigma = float(optimizer.noise_multiplier)
        if sigma <= 0:
            return math.inf
        from tfdpbnn.privacy.budget import SENSITIVITY

        return SENSITIVITY[optimizer.neighboring] * math.sqrt(int(optimizer.steps)) / sigma
