"""The step audit: many runs of a few full-batch DP steps of a method, with and without a white-box canary.

Nasr et al. 2023 ("Tight auditing of differentially private machine learning": Dirac gradient canary,
multi-run audit), through the optimizer users compile.

The method's model (``experiment.build_method_model``, tiny sizes) gets one Dirac gradient canary
(``with_gradient_canaries``: its clipped gradient is exactly ``-C e_j`` on a coordinate no other example
touches); its optimizer is the user-facing one, its noise calibrated by the PLD accountant to ``epsilon``
for ``steps`` full-batch steps (``tfdpbnn.privacy.calibrate_noise``, as ``target_epsilon`` does; the
optimizer's own epsilon for those steps is reported beside it), so the claim is exactly mu-GDP with ``mu =
sqrt(steps) / sigma``. One step of a run is what ``dp_train_step`` does: ``optimizer.mechanism.clip_model``
on the batch (with or without the canary), then ``optimizer._dp_gradients`` (the method's own update
direction: the mechanism's one noise draw, DP-SGLD's ``n / B`` scale and prior term, SI-DPSGD's layer
noise). The runs are vectorized: the clipped sum is tiled ``runs`` times, so one call of the method's
``_dp_gradients`` draws the noise of all runs at once (one fused draw of the real mechanism, one independent
row per run). A run's score is the canary coordinate of its released gradient summed over its steps
(SGD-type updates move that coordinate by ``-lr`` times it; Adam's moments are post-processing of it).

Run k with the canary and run k without it form a pair (independent noise draws); ``paired_shift_bound``
turns the K pairs into an exact lower bound on mu (noncentral t, ``tfdpbnn.audit.shift``), and
``gdp_lower_bound`` / ``multi_run_epsilon`` into assumption-free Clopper-Pearson bounds on the same runs.
The audit FLAGS a claim when the mu lower bound (confidence 0.999 by default) exceeds the claimed mu, and
states its power: the probability it would have flagged a 1.5x sensitivity error.

The weights are not updated between a run's steps: the canary's clipped gradient does not depend on them
(its loss is linear in its own coordinate), so its coordinate's released sum is that of a real SGD run.
The Bayesian layers' stochastic forward pass is drawn once per world (it never touches the canary
coordinate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
import warnings

import numpy as np
import tensorflow as tf

from tfdpbnn.audit import mutations
from tfdpbnn.audit.bounds import gdp_lower_bound, multi_run_epsilon
from tfdpbnn.audit.canaries import canary_losses, gradient_canary_data, with_gradient_canaries
from tfdpbnn.audit.shift import paired_shift_bound, paired_shift_power

METHODS = ("dpsgd", "dpadam", "dpvd", "dpsgld", "sidp-ln", "sidp-bn", "dpbbp", "dpmcdropout")
#: Sizes of the audited model: the canary coordinate's law does not depend on them.
NUM_FEATURES, NUM_CLASSES, HIDDEN, NUM_REAL = 8, 3, 4, 15
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@dataclasses.dataclass(frozen=True)
class StepAuditResult:
    """One step audit: the claim, the measured bounds, the decision and the power (``step_audit``)."""

    method: str
    broken: str | None
    steps: int
    runs: int
    noise_multiplier: float
    claimed_mu: float
    claimed_epsilon: float
    library_epsilon: float
    mu_hat: float
    mu_lower: float
    epsilon_lower: float
    tradeoff_mu_lower: float
    clopper_pearson_epsilon_lower: float
    flagged: bool
    power_1_5x: float
    confidence: float
    delta: float
    seconds: float

    def as_dict(self) -> dict:
        """The result as a JSON-ready dict."""
        return dataclasses.asdict(self)


@functools.lru_cache(maxsize=64)
def _calibrated_sigma(epsilon, delta, steps) -> float:
    """Sigma of ``steps`` full-batch steps at (epsilon, delta): what the optimizers' PLD calibration gives."""
    from tfdpbnn.privacy import calibrate_noise

    return float(calibrate_noise(epsilon, delta, 1.0, steps, accountant="pld", sampling="shuffle"))


def _optimizer(method, epsilon, delta, num_examples, steps, seed):
    """The method's optimizer for ``steps`` full-batch steps, its noise calibrated to (epsilon, delta).

    Its noise is replayable from ``seed`` (``debug_noise_seed``), so an audit is reproducible: the audit
    measures the mechanism, whose noise law does not depend on where the key came from.
    """
    from tfdpbnn import optimizers as O

    sigma = _calibrated_sigma(float(epsilon), float(delta), int(steps))
    common = dict(delta=delta, num_examples=num_examples, batch_size=num_examples, epochs=steps,
                  sampling="shuffle", accountant="pld", debug_noise_seed=int(seed))
    if method == "dpsgld":
        lr = O.sgld_learning_rate(sigma, 1.0, num_examples, num_examples)
        return O.DPSGLDOptimizer(1.0, learning_rate=lr, **common)
    if method == "dpadam":
        return O.DPAdamOptimizer(1.0, sigma, learning_rate=0.01, **common)
    cls = {"dpvd": O.DPVDOptimizer, "sidp-ln": O.SIDPOptimizer, "sidp-bn": O.SIDPOptimizer}.get(
        method, O.DPSGDOptimizer)
    return cls(1.0, sigma, learning_rate=0.1, **common)


def _canary_coordinate(grads, var_list):
    """Row 1 (canary 1; row 0 is "no canary") of the canary weights' released gradient, one per run."""
    for g, v in zip(grads, var_list, strict=True):
        if "canary_weights" in getattr(v, "path", v.name):     # Keras 3: the layer's name is in ``path``
            g = tf.convert_to_tensor(g)
            return tf.reshape(g, [tf.shape(g)[0], -1])[:, 1]
    raise ValueError("model: no canary_weights variable among the trainable variables")


def _clipped_tiled(optimizer, model, data, runs):
    """One step's clipped sum of ``data`` (what ``dp_train_step`` computes), tiled ``runs`` times."""
    inputs, targets, weights = data
    var_list = model.trainable_variables
    optimizer._dp_before_step(model)
    clipped = optimizer.mechanism.clip_model(model, inputs, targets, weights, var_list=var_list)
    return dataclasses.replace(clipped, clipped_sum=[
        tf.tile(tf.convert_to_tensor(g)[None], [runs] + [1] * len(g.shape)) for g in clipped.clipped_sum])


def _released(optimizer, model, tiled, steps):
    """The canary coordinate of each run's released gradient, summed over ``steps`` steps: [runs]."""
    var_list = model.trainable_variables
    total = 0.0
    for _ in range(steps):
        # The same clipped sum each step (full batches of the same data): a copy of its tensors per release,
        # which the mechanism takes once each; the audit measures the noise of ``steps`` releases.
        step = dataclasses.replace(tiled, clipped_sum=[tf.identity(g) for g in tiled.clipped_sum])
        grads = optimizer._dp_gradients(step, var_list)
        total += tf.cast(_canary_coordinate(grads, var_list), tf.float64)
    return total.numpy()


class StepAuditor:
    """One method's audited step at one claim, built once and audited any number of times.

    Builds the method's tiny model with one canary and its optimizer for ``steps`` full-batch steps at
    (``epsilon``, ``delta``) (module docstring); ``audit`` then draws fresh runs each time it is called, so
    repeated audits (power tables) cost the noise draws only.

    Args:
      method: one of ``METHODS``.
      epsilon: the budget the method's optimizer calibrates its noise to (PLD).
      delta: delta of the claim.
      steps: full-batch steps per run (the claim: ``sqrt(steps) / sigma``-GDP).
      seed: seeds the model (``tf.keras.utils.set_random_seed``) and the noise (``debug_noise_seed``).
    """

    def __init__(self, method="dpsgd", epsilon=1.0, delta=1e-5, steps=1, seed=0):
        from tfdpbnn.audit.experiment import build_method_model

        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        steps = int(steps)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        start = time.perf_counter()
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(NUM_REAL, NUM_FEATURES)).astype(np.float32)
        y = rng.integers(0, NUM_CLASSES, NUM_REAL)
        x_public = rng.normal(size=(8, NUM_FEATURES)).astype(np.float32)
        n = NUM_REAL + 1
        self.method, self.delta, self.steps, self.seed = method, float(delta), steps, seed
        self.canary_layer = "NoisyDense" if method.startswith("sidp") else "Embedding"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.optimizer = _optimizer(method, epsilon, delta, n, steps, seed)
            base = build_method_model(method, n, HIDDEN, seed, x_public=x_public, num_features=NUM_FEATURES,
                                      num_classes=NUM_CLASSES)
            self.model = with_gradient_canaries(base, 1, self.optimizer.l2_norm_clip,
                                                noisy=method.startswith("sidp"))
            self.model.compile(optimizer=self.optimizer, loss=canary_losses(LOSS))
            self.with_canary = gradient_canary_data(x, y, np.array([True]))
            self.without = gradient_canary_data(x, y, np.array([False]))
            self.optimizer.begin_training(self.model, self.with_canary[0], self.with_canary[1], batch_size=n)
        self.claimed_mu = math.sqrt(steps) / self.optimizer.noise_multiplier
        self.library_epsilon = float(self.optimizer.epsilon_after(steps))
        self._clipped = {}
        self.setup_seconds = time.perf_counter() - start
        tf.keras.utils.set_random_seed(seed)

    def runs(self, runs, broken=None, argument=None):
        """``(with, without)``: the canary coordinate's released sum in ``runs`` fresh runs of each world.

        ``broken``/``argument``: a mutation injected for these steps only (``tfdpbnn.audit.inject_bug``;
        "unclipped-layer" defaults to the canary's layer type).
        """
        if broken is not None and broken not in mutations.STEP_MUTATIONS:
            raise ValueError(f"broken must be None or one of {sorted(mutations.STEP_MUTATIONS)}, "
                             f"got {broken!r}")
        if broken == "unclipped-layer" and argument is None:
            argument = self.canary_layer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with mutations.inject_bug(broken, argument) if broken else contextlib.nullcontext():
                key = (broken, argument, int(runs))
                if key not in self._clipped:  # deterministic for the canary coordinate: clipped once
                    self._clipped = {key: [_clipped_tiled(self.optimizer, self.model, data, runs)
                                           for data in (self.with_canary, self.without)]}
                ins, outs = (_released(self.optimizer, self.model, tiled, self.steps)
                             for tiled in self._clipped[key])
        return ins, outs

    def audit(self, runs=20000, broken=None, argument=None, confidence=0.999,
              assumption_free=True) -> StepAuditResult:
        """Audit ``runs`` fresh pairs of runs (module docstring).

        ``assumption_free=False`` skips the Clopper-Pearson bounds (reported as NaN), which only inform.
        """
        from tfdpbnn.privacy.gdp import gdp_epsilon

        runs = int(runs)
        if runs < 3:
            raise ValueError(f"runs must be >= 3, got {runs}")
        start = time.perf_counter()
        ins, outs = self.runs(runs, broken, argument)
        # The canary's gradient is -gain e_j: with the canary the coordinate is lower; orient the scores up.
        shift = paired_shift_bound(outs - ins, confidence)
        tradeoff_mu = cp_epsilon = math.nan
        if assumption_free:
            tradeoff_mu = gdp_lower_bound(-ins, -outs, delta=self.delta, confidence=0.95, threshold="split",
                                          seed=self.seed).mu
            cp_epsilon = multi_run_epsilon(-ins, -outs, delta=self.delta, confidence=0.95, threshold="split",
                                           seed=self.seed).epsilon
        mu_lower, claimed = shift.mu_lower, self.claimed_mu
        return StepAuditResult(
            method=self.method, broken=broken, steps=self.steps, runs=runs,
            noise_multiplier=float(self.optimizer.noise_multiplier), claimed_mu=float(claimed),
            claimed_epsilon=float(gdp_epsilon(claimed, self.delta)), library_epsilon=self.library_epsilon,
            mu_hat=shift.mu_hat, mu_lower=mu_lower,
            epsilon_lower=float(gdp_epsilon(mu_lower, self.delta)) if math.isfinite(mu_lower) else math.inf,
            tradeoff_mu_lower=float(tradeoff_mu), clopper_pearson_epsilon_lower=float(cp_epsilon),
            flagged=bool(mu_lower > claimed), power_1_5x=paired_shift_power(claimed, runs, 1.5, confidence),
            confidence=float(confidence), delta=self.delta, seconds=time.perf_counter() - start)


def step_audit(method="dpsgd", epsilon=1.0, delta=1e-5, runs=20000, steps=1, broken=None, confidence=0.999,
               seed=0) -> StepAuditResult:
    """Audit ``steps`` full-batch steps of ``method`` at budget ``epsilon`` with ``runs`` pairs of runs.

    Args:
      method: one of ``METHODS``.
      epsilon: the budget the method's optimizer calibrates its noise to (its own accountant, PLD).
      delta: delta of the claim.
      runs: K pairs of runs (K with the canary, K without).
      steps: full-batch steps per run (the claim: ``sqrt(steps) / sigma``-GDP).
      broken: None (the honest code) or a key of ``tfdpbnn.audit.mutations.STEP_MUTATIONS``, injected for the
        audit's steps only.
      confidence: confidence of the bounds that decide (the mean-shift bound; 0.999: an honest method is
        flagged with probability at most 0.001).
      seed: seeds the model (``tf.keras.utils.set_random_seed``) and the noise (``debug_noise_seed``).

    ``seconds`` of the result includes building the model and optimizer.
    """
    if broken is not None and broken not in mutations.STEP_MUTATIONS:
        raise ValueError(f"broken must be None or one of {sorted(mutations.STEP_MUTATIONS)}, got {broken!r}")
    auditor = StepAuditor(method, epsilon, delta, steps, seed)
    result = auditor.audit(runs, broken, confidence=confidence)
    return dataclasses.replace(result, seconds=result.seconds + auditor.setup_seconds)


__all__ = ["METHODS", "StepAuditResult", "StepAuditor", "step_audit"]
