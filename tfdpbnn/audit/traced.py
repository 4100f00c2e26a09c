"""The traced-step audit: the released update of the compiled train function ``model.fit`` runs.

The step audit (``tfdpbnn.audit.step``) calls the optimizer's mechanism eagerly on one canary coordinate;
this audit drives the SAME traced function that ``fit`` calls (``model.make_train_function()`` on Keras 2
and Keras 3's TensorFlow trainer: the ``tf.function`` around ``Model.train_step``, which dispatches to
``optimizer.dp_train_step``), on a copy
of the user's compiled model with a copy of its DP optimizer, one crafted batch per call, and reads what
each call released from the weights and the optimizer's slots:

* SGD family (DP-SGD, DPVD, SI-DPSGD, DP-BBP, DP-MC dropout, DP-SGLD: ``w <- w - eta g``): without
  momentum, ``g = (w_before - w_after) / eta``; the copy's ``eta`` is set so the update is of order 1,
  keeping the float32 rounding of ``w + eta g`` far below the noise (``eta`` is post-processing of ``g``;
  DP-SGLD's noise multiplier is fixed by its constructor, ``sgld_noise_multiplier``). With momentum the
  slot, zeroed before every call, holds ``-eta g`` exactly.
* Adam family: the first-moment slot ``m``, zeroed before every call, holds ``(1 - beta_1) g``; so
  ``g = m / (1 - beta_1)`` (the second moment and the bias correction act after it: post-processing).

Every call starts from the same snapshot (weights, non-trainable state, slots), so each call is one
independent traced step from the same point, at a step counter (``iterations``) drawn for it from 0 to
``MAX_STEP`` (a release that changes after some step is seen at both); the noise seed is whatever the
traced function draws at that call. ``g`` is then ``s (sum_i clip_C(g_i) + z) + r(w)``, with the method's
declared scale ``s`` (``1 / B``; DP-SGLD ``n / B``, Zhang et al. 2022, Algorithm 2),
``z ~ N(0, (sigma C)^2 I)`` (Abadi et al. 2016, Algorithm 1) and ``r(w)`` the data-independent
regularization (KL terms, priors), the same at every call from the snapshot. ``r`` is read from a call
with sigma set to 0 on a zero-weight example.

Checks (``TracedAudit.run``), each with its false-alarm rate (the total is ``alpha``, Bonferroni) and power:

1. **Noise** (sigma > 0, one example of sample weight 0, so no data reaches the release): per trainable
   variable, ``sum z^2 / (sigma C s)^2`` is chi-square with ``K d`` degrees of freedom (K calls, d
   coordinates): two-sided test of the declared standard deviation, power against 0.9x stated; the
   per-coordinate mean over calls (chi-square with d): noise that is not fresh at every call; the
   correlation of coordinates at every offset of the flattened draw (all offsets at once by FFT),
   power against a correlation 0.1 stated; the correlation between calls at lags 1..``max_lag``.
2. **Sensitivity** (sigma 0): one example's contribution to the released sum, ``g(D + {x}) - g(D)`` (the
   same batch with x at sample weight w, of ``SAMPLE_WEIGHTS``, and at weight 0), for crafted examples
   (inputs at scales from 0 to 1000 with every label, then a random-search ascent on the contribution
   norm), alone (D empty) or among other rows D (``CONTEXTS``); flagged above ``C s`` by more than a
   float32 tolerance. The largest found per variable is reported, and the variables no example reached.
3. **Accounting**: ``optimizer.epsilon_after(T)`` against dp-accounting's epsilon computed here from the
   declared sigma, ``q = B / n``, sampling and T (an independent composition), flagged when the optimizer
   reports less.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings

import numpy as np
import tensorflow as tf

from tfdpbnn import _adapters
from tfdpbnn._private_api import sublayers

#: What each check can and cannot see (printed by ``TracedAuditResult.summary``).
SEES = {
    "noise": ("the noise of every trainable variable in the released update of fit's traced step: its "
              "standard deviation against the declared sigma C s, freshness at every call, correlation "
              "between coordinates at any offset of the flattened draw and between calls, at step "
              "counters from 0 to 2^20",
              "dependence that is not a fixed offset in the draw (e.g. a permuted duplicate of a few "
              "coordinates); noise that depends on the data (the check feeds none); the sampling of batches"),
    "sensitivity": ("any crafted example whose contribution to the released sum exceeds C s, in every layer "
                    "type of the model, through the traced step's clipping, alone in the batch and among "
                    "other rows (of weight 0; of weight 1 where the step at sigma 0 is deterministic), so "
                    "clipping that couples a batch's rows is seen, at sample weights 1, 10 and 1000 (a "
                    "weight applied after clipping)",
                    "examples the search did not try: it is a search, not a proof; variables no crafted "
                    "example reached are listed; rows of weight 1 around the example when the step is "
                    "random (stochastic layers)"),
    "accounting": ("whether the optimizer's planned epsilon matches an independent dp-accounting composition "
                   "of its declared sigma, q = B / n, sampling and steps",
                   "whether the declared q is the pipeline's real rate (the sampling audit, --mode sampling, "
                   "tests that)"),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One statistic of one check: ``flagged`` when it crossed ``threshold`` (``detail`` says which way)."""

    check: str
    variable: str
    statistic: str
    value: float
    threshold: float
    flagged: bool
    detail: str = ""


@dataclasses.dataclass
class TracedAuditResult:
    """The traced-step audit of one model (``traced_audit``): findings, powers and what was not seen."""

    optimizer: str
    noise_multiplier: float
    l2_norm_clip: float
    scale: float
    calls: int
    findings: list
    largest_contribution: float
    largest_by_variable: dict
    unreached: list
    powers: dict
    alpha: float
    seconds: float
    notes: list = dataclasses.field(default_factory=list)

    @property
    def flagged(self) -> bool:
        """Whether any statistic crossed its threshold."""
        return any(f.flagged for f in self.findings)

    @property
    def flags(self) -> list:
        """The findings that crossed their thresholds."""
        return [f for f in self.findings if f.flagged]

    def as_dict(self) -> dict:
        """The result as a JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["flagged"] = self.flagged
        return out

    def summary(self) -> str:
        """A human-readable report: flags, the largest values, the powers, what each check can/cannot see."""
        lines = [f"traced-step audit of {self.optimizer}: sigma {self.noise_multiplier:.4g}, C "
                 f"{self.l2_norm_clip:.4g}, declared scale s {self.scale:.4g}, {self.calls} traced calls "
                 f"({self.seconds:.1f} s); false-alarm rate <= {self.alpha:g}"]
        worst_std = [f for f in self.findings if f.statistic == "std ratio"]
        if worst_std:
            low = min(worst_std, key=lambda f: f.value)
            lines.append(f"noise: smallest std / declared {low.value:.4f} ({low.variable})")
        lines.append(f"sensitivity: largest one-example contribution {self.largest_contribution:.4f} x C s")
        for name, p in self.powers.items():
            lines.append(f"power: {name}: {p:.3f}" if isinstance(p, float) else f"power: {name}: {p}")
        if self.unreached:
            lines.append("sensitivity: no crafted example reached " + ", ".join(self.unreached))
        lines.extend(self.notes)
        for check, (can, cannot) in SEES.items():
            lines.append(f"{check} sees: {can}; cannot see: {cannot}")
        for f in self.flags:
            lines.append(f"FLAGGED {f.check}: {f.variable}: {f.statistic} {f.value:.4g} (threshold "
                         f"{f.threshold:.4g}) {f.detail}")
        lines.append("FLAGGED" if self.flagged else "passed: no statistic crossed its threshold")
        return "\n".join(lines)


def _declared_scale(optimizer) -> float:
    """The scale s the method's update rule declares: n / B for DP-SGLD, 1 / B otherwise."""
    from tfdpbnn.optimizers import DPSGLDOptimizer

    if isinstance(optimizer, DPSGLDOptimizer):
        return optimizer.num_examples / optimizer.batch_size
    return 1.0 / optimizer.batch_size


def _copy(model, optimizer):
    """A copy of ``model`` (same weights) compiled with a fresh copy of its DP optimizer (no ledger).

    Compiled by XLA when ``model`` is (``jit_compile=True``), so the step audited is the one ``fit`` runs.
    """
    try:
        copy = tf.keras.models.clone_model(model)
    except Exception as err:  # clone_model raises several types for models it cannot rebuild
        raise ValueError(f"model: the traced audit runs on a copy made by tf.keras.models.clone_model, which "
                         f"failed ({err}); use a Sequential or functional model of serializable layers") \
            from err
    copy.set_weights(model.get_weights())
    config = optimizer.get_config()
    for key in ("privacy_ledger", "target_epsilon"):
        config.pop(key, None)
    config.update(initial_steps=0, sampling="shuffle")  # the copy's input is arrays; the step is the same
    opt = type(optimizer).from_config(config)
    # The step fit runs: compiled by XLA when the model is (jit_compile=True); its code may take other paths.
    jit = getattr(model, "jit_compile", False) is True
    copy.compile(optimizer=opt, loss=model.loss, jit_compile=jit)
    return copy, opt


#: The largest step counter a call starts from (``TracedStep.draw_step``).
MAX_STEP = 2 ** 20


class TracedStep:
    """Calls of ``fit``'s traced train function on a copy of a compiled DP model, from one snapshot.

    Args:
      model: a compiled model whose optimizer is a tfdpbnn DP optimizer.
      x_example, y_example: one example's input and label (batch dimension 1), fixing the traced shapes.

    ``released(x, y, w)`` restores the snapshot, runs one traced call on the batch and returns the released
    gradient (module docstring), one array per trainable variable.
    """

    def __init__(self, model, x_example, y_example):
        from tfdpbnn.optimizers import SIDPOptimizer
        from tfdpbnn.optimizers.keras_integration import dp_optimizer_of

        adapter = _adapters.current()
        original = dp_optimizer_of(model)
        if original is None:
            raise ValueError("model: compile it with a tfdpbnn DP optimizer first")
        if isinstance(original, SIDPOptimizer) and original.paper_mean_update:
            raise ValueError("model: SIDPOptimizer(paper_mean_update=True) releases noisy weights around a "
                             "mean updated without noise; its epsilon is not DP-SGD's, and this audit does "
                             "not audit it")
        self.original = original
        self.model, self.optimizer = _copy(model, original)
        opt = self.optimizer
        n, b = opt.num_examples, opt.batch_size
        self.scale = _declared_scale(original)
        self.noise_multiplier = original.noise_multiplier
        self.clip = original.l2_norm_clip
        x_example = np.asarray(x_example)
        y_example = np.asarray(y_example)
        self.x_example, self.y_example = x_example[:1], y_example[:1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            opt.begin_training(self.model, np.broadcast_to(self.x_example, (n,) + x_example.shape[1:]),
                               np.broadcast_to(self.y_example, (n,) + y_example.shape[1:]), batch_size=b)
        self.train_function = adapter.train_function(self.model)
        # One iterator for every call, reading the batch from variables: no read-ahead (every tf.data
        # optimization and autotuning off), so each call consumes the batch assigned just before it.
        # The batch axis left open: the sensitivity check puts a crafted example among other rows.
        self._batch = [tf.Variable(a, trainable=False, shape=tf.TensorShape([None]).concatenate(a.shape[1:]))
                       for a in (self.x_example, self.y_example, np.zeros(1, np.float32))]
        batch = self._batch
        options = tf.data.Options()
        options.autotune.enabled = False
        options.experimental_optimization.apply_default_optimizations = False
        options.experimental_optimization.inject_prefetch = False
        self._iterator = iter(tf.data.Dataset.from_tensors(0).repeat().map(
            lambda _: tuple(v.read_value() for v in batch)).with_options(options))
        self.variables = list(self.model.trainable_variables)
        self.names = [adapter.variable_name(v) for v in self.variables]
        self._rule = self._update_rule()
        config = opt.get_config()
        self.vary_steps = not (config.get("use_ema") and config.get("ema_overwrite_frequency"))
        self.calls = 0
        self._call(self.x_example, self.y_example, np.zeros(1, np.float32))  # traces, creates the slots
        slots = [adapter.optimizer_slot(opt, v, s) for v in self.variables
                 for s in adapter.optimizer_slot_names(opt)]
        for s in slots:
            s.assign(tf.zeros_like(s))
        state = list(self.model.variables) + slots + [opt.iterations]
        self._snapshot = [tf.constant(v.numpy()) for v in state]
        self._initial = list(self._snapshot)
        trainable = {id(v) for v in self.variables}
        self._trainable_at = [i for i, v in enumerate(state) if id(v) in trainable]

        @tf.function
        def restore(values):
            for v, value in zip(state, values, strict=True):
                v.assign(value)

        self._restore = restore

    def set_weights_point(self, values=None):
        """Start every following call from trainable weights ``values`` (None: the model's own weights)."""
        snapshot = list(self._initial)
        if values is not None:
            for i, value in zip(self._trainable_at, values, strict=True):
                snapshot[i] = tf.constant(value, snapshot[i].dtype)
        self._snapshot = snapshot

    def _update_rule(self):
        """How ``released`` reads ``g`` after one call: "sgd", "momentum" or "adam" (module docstring)."""
        opt = self.optimizer
        config = opt.get_config()
        if config.get("decay"):
            raise ValueError(f"optimizer: decay={config['decay']!r}; the traced audit needs a constant "
                             "learning rate")
        if isinstance(config.get("learning_rate"), dict) or isinstance(
                opt.learning_rate, tf.keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError("optimizer: a learning-rate schedule; the traced audit needs a constant "
                             "learning rate (the released gradient is read from the update)")
        names = set(_adapters.current().optimizer_slot_names(opt))
        if "beta_1" in config:
            return "adam"
        if config.get("nesterov"):
            raise ValueError("optimizer: nesterov=True; the traced audit reads SGD with or without plain "
                             "momentum, and Adam")
        return "momentum" if config.get("momentum") or "momentum" in names else "sgd"

    def set_update_size(self, typical):
        """Set the copy's learning rate so that ``eta * typical`` is about 1 (SGD without momentum)."""
        if self._rule in ("sgd", "momentum"):
            self.optimizer.learning_rate = float(1.0 / typical)

    def set_noise(self, on: bool):
        """Sigma as declared (True) or 0 (False) for the following calls."""
        self.optimizer._dp_noise_multiplier.assign(self.noise_multiplier if on else 0.0)

    def _call(self, x, y, w):
        for v, a in zip(self._batch, (x, y, w), strict=True):
            v.assign(np.asarray(a, v.dtype.as_numpy_dtype))
        watch = getattr(self.optimizer, "_dp_write_watch", None)
        if watch is not None:  # the audit sets the weights before each call, on purpose
            watch.disarm()
        self.train_function(self._iterator)
        self.calls += 1

    def draw_step(self, rng):
        """A step counter for one call: 0 (one call in eight) or log-uniform in ``[1, MAX_STEP]``.

        None (the snapshot's) for an optimizer that overwrites the weights with averages every so many
        steps (Keras 3's ``use_ema`` with ``ema_overwrite_frequency``): its update is read from the weights.
        """
        if not self.vary_steps:
            return None
        if rng.random() < 0.125:
            return 0
        return int(math.exp(rng.uniform(0.0, math.log(MAX_STEP))))

    def released(self, x, y, w, step=None):
        """The released gradient of one traced call on the batch ``(x, y, w)``: list of float64 arrays.

        ``step``: the optimizer's step counter (``iterations``) the call starts from (None: the snapshot's),
        so that a release that depends on the step (less noise after some step) is seen.
        """
        self._restore(self._snapshot)
        if step is not None:
            self.optimizer.iterations.assign(step)
        before = [v.numpy().astype(np.float64) for v in self.variables]
        self._call(x, y, np.asarray(w, np.float32))
        opt, slot = self.optimizer, _adapters.current().optimizer_slot
        if self._rule == "adam":
            beta_1 = float(np.asarray(opt.beta_1))
            return [slot(opt, v, "m").numpy().astype(np.float64) / (1.0 - beta_1) for v in self.variables]
        eta = float(np.asarray(opt.learning_rate))
        if self._rule == "momentum":
            return [-slot(opt, v, "momentum").numpy().astype(np.float64) / eta for v in self.variables]
        return [(b - v.numpy().astype(np.float64)) / eta for b, v in zip(before, self.variables, strict=True)]


def _chi2_two_sided(dof, alpha):
    from scipy import stats

    lo, hi = stats.chi2.ppf(alpha / 2, dof), stats.chi2.isf(alpha / 2, dof)
    return lo, hi


def std_power(dof, alpha, factor=0.9) -> float:
    """Power of the two-sided chi-square std test (level ``alpha``) against noise of ``factor`` x declared."""
    from scipy import stats

    lo, hi = _chi2_two_sided(dof, alpha)
    f2 = factor * factor
    return float(stats.chi2.cdf(lo / f2, dof) + stats.chi2.sf(hi / f2, dof))


def noise_checks(noise, names, stddev, alpha, max_lag=8, min_pairs=16):
    """The noise statistics of ``noise`` (list per variable of [K, ...] arrays, the data-free releases).

    Returns ``(findings, powers)``. ``alpha`` is split evenly over the four statistics and, within each,
    over the variables, offsets or lags (Bonferroni).
    """
    from scipy import stats

    k = noise[0].shape[0]
    flat = [np.asarray(z, np.float64).reshape(k, -1) / stddev for z in noise]
    findings, per = [], alpha / 4
    m = len(flat)
    dims = [f.shape[1] for f in flat]
    for name, u, d in zip(names, flat, dims, strict=True):
        s = float(np.sum(u * u))
        lo, hi = _chi2_two_sided(k * d, per / m)
        ratio = math.sqrt(s / (k * d))
        findings.append(Finding("noise", name, "std ratio", ratio, math.sqrt(lo / (k * d)),
                                not lo <= s <= hi,
                                f"(declared {stddev:.4g}; accepted {math.sqrt(lo / (k * d)):.4f}-"
                                f"{math.sqrt(hi / (k * d)):.4f})"))
        mean = k * float(np.sum(np.mean(u, axis=0) ** 2))
        crit = float(stats.chi2.isf(per / m, d))
        findings.append(Finding("noise", name, "mean over calls chi2", mean, crit, mean > crit,
                                f"(d = {d}: noise repeated across traced calls)"))
    # Coordinates: every offset h of the flattened draw (trainable-variable order), standardized by each
    # variable's own std so this statistic does not repeat the std test.
    est = [u / max(math.sqrt(float(np.mean(u * u))), 1e-30) for u in flat]
    big = np.concatenate(est, axis=1)
    total = big.shape[1]
    offsets = np.arange(1, max(1, total - min_pairs + 1))
    if len(offsets):
        size = 1 << int(math.ceil(math.log2(2 * total)))
        spectrum = np.zeros(size // 2 + 1)
        for row in big:
            spectrum += np.abs(np.fft.rfft(row, size)) ** 2
        auto = np.fft.irfft(spectrum, size)[offsets]
        z = auto / np.sqrt(k * (total - offsets))
        crit = float(stats.norm.isf(per / (2 * len(offsets))))
        worst = int(np.argmax(np.abs(z)))
        findings.append(Finding("noise", "all variables", "max |z| coordinate correlation",
                                float(abs(z[worst])), crit, bool(abs(z[worst]) > crit),
                                f"(offset {int(offsets[worst])} of {total}: correlation "
                                f"{auto[worst] / (k * (total - offsets[worst])):.3g})"))
    lags = range(1, min(max_lag, k - 1) + 1)
    if len(lags):
        crit = float(stats.norm.isf(per / (2 * len(lags))))
        zs = [float(np.sum(big[lag:] * big[:-lag])) / math.sqrt((k - lag) * total) for lag in lags]
        worst = int(np.argmax(np.abs(zs)))
        rho = zs[worst] / math.sqrt((k - worst - 1) * total)
        findings.append(Finding("noise", "all variables", "max |z| correlation between calls",
                                abs(zs[worst]), crit, abs(zs[worst]) > crit,
                                f"(lag {worst + 1}: correlation {rho:.3g})"))
    smallest = min(dims)
    powers = {"std 0.9x declared (smallest variable)": std_power(k * smallest, per / m)}
    if len(offsets):
        zc = float(stats.norm.isf(per / (2 * len(offsets))))
        # Correlation rho on every pair at offset h: E z = rho sqrt(K (D - h)); offsets up to D / 2.
        powers["correlation 0.1 on every pair at one offset <= half the draw"] = float(
            stats.norm.sf(zc - 0.1 * math.sqrt(k * (total - total // 2))))
    if len(lags):
        zl = float(stats.norm.isf(per / (2 * len(lags))))
        powers["correlation 0.1 between consecutive calls"] = float(
            stats.norm.sf(zl - 0.1 * math.sqrt((k - 1) * total)))
    return findings, powers


def calls_for_power(dims, alpha, power=0.99, factor=0.9, low=64, high=20000) -> int:
    """Fewest calls K whose std test of the smallest variable has ``power`` against ``factor`` x declared."""
    per = alpha / 4 / len(dims)
    d = min(dims)
    lo, hi = low, high
    if std_power(hi * d, per, factor) < power:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if std_power(mid * d, per, factor) >= power:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _labels(model, y_example, rng, count):
    """``count`` labels shaped like ``y_example``: every class of a classifier, else scaled normals."""
    y = np.asarray(y_example)
    out_dim = int(model.output_shape[-1]) if model.output_shape[-1] is not None else 1
    if out_dim > 1 and y.shape[1:] in ((), (1,)):  # sparse class labels: every class
        return [np.full_like(y, c) for c in range(out_dim)]
    if out_dim > 1 and y.shape[-1] == out_dim:  # one-hot: every class
        return [np.eye(out_dim, dtype=y.dtype)[[c]].reshape(y.shape) for c in range(out_dim)]
    return [(rng.normal(size=y.shape) * scale).astype(y.dtype) for scale in (0.0, 1.0, 10.0, 100.0)]


def _inputs(model, x_example, rng, scales):
    """Candidate single-example inputs shaped like ``x_example``: scaled normals, or random ids."""
    x = np.asarray(x_example)
    if np.issubdtype(x.dtype, np.integer):
        vocab = [layer.input_dim for layer in sublayers(model)
                 if isinstance(layer, tf.keras.layers.Embedding)]
        high = min(vocab) if vocab else int(x.max()) + 1
        return [rng.integers(0, high, size=x.shape).astype(x.dtype) for _ in scales] + [np.zeros_like(x)]
    out = []
    for scale in scales:
        out.append((rng.normal(size=x.shape) * scale).astype(x.dtype))
        out.append((x * scale).astype(x.dtype))
    return out


#: The rows around a crafted example in the sensitivity check: alone in the batch; among rows of sample
#: weight 0 (no data of theirs reaches the release, whatever the step draws, so the check holds for
#: stochastic layers too); among rows of weight 1 (only where the step at sigma 0 is deterministic: the
#: difference of two calls is then the example's contribution alone). A step whose clipping couples the rows
#: of a batch (clip factors from the batch's mean norm, or from the norm of the batch's summed gradient) is
#: per-example clipping for a batch of one.
CONTEXTS = ("alone", "zero-weight rows", "weighted rows")

#: Sample weights of the crafted example: each example's loss times its weight is clipped to C, so no weight
#: moves the sum by more than C s; weights applied after clipping (to the clipped gradients or their sum)
#: would move it by w C s, which weight 1 alone does not show.
SAMPLE_WEIGHTS = (1.0, 10.0, 1000.0)


@dataclasses.dataclass
class _Context:
    """A batch around one crafted example: other rows (inputs, labels, weights), the example at ``position``.

    ``x`` None: the example alone.
    """

    name: str
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    w: np.ndarray | None = None
    position: int = 0

    def batch(self, x, y, w):
        """The batch with the example ``(x, y)`` of weight ``w`` (arrays of batch 1) at its position."""
        w = np.full(1, w, np.float32)
        if self.x is None:
            return x, y, w
        p = self.position
        return tuple(np.concatenate([a[:p], b, a[p:]]) for a, b in ((self.x, x), (self.y, y), (self.w, w)))


def _rows(step, rng, labels, count, weight):
    """A context of ``count`` crafted rows (unit-scale inputs, random labels) of sample weight ``weight``."""
    x0 = step.x_example
    xs = np.concatenate([_inputs(step.model, x0, rng, (1.0,))[0] for _ in range(count)])
    ys = np.concatenate([labels[int(i)] for i in rng.integers(0, len(labels), count)])
    name = "zero-weight rows" if weight == 0 else "weighted rows"
    return _Context(name, xs, ys, np.full(count, weight, np.float32), int(rng.integers(0, count + 1)))


def _deterministic(step, context, rtol=1e-5) -> bool:
    """Whether two calls on the batch of ``context`` (the example at weight 0) release the same at sigma 0."""
    batch = context.batch(step.x_example, step.y_example, 0.0)
    a, b = step.released(*batch), step.released(*batch)
    bound = step.clip * step.scale
    return all(np.max(np.abs(u - v), initial=0.0) <= rtol * bound for u, v in zip(a, b, strict=True))


def sensitivity_checks(step, rng, candidates=120, ascent=60, rtol=2e-3, weight_points=(0.3, 1.0)):
    """One-example contributions at sigma 0 (module docstring).

    The search runs from the model's weights, then from random weight points (every trainable variable
    drawn ``N(0, scale^2)``, one point per ``weight_points`` scale): the clip bound must hold at any weights,
    and parameters such as a variance's log that start far from 0 contribute next to nothing at their
    initial values. Each crafted example is put alone in the batch, or among other rows (``CONTEXTS``), at a
    sample weight of ``SAMPLE_WEIGHTS``, and its contribution is the difference between the call with it at
    that weight and the same call with it at weight 0. Returns ``(findings, largest, by_variable,
    unreached, notes)``: the largest contribution norm over ``C s``, the largest per variable (same unit),
    the variables no crafted example reached, and what the search could not try.
    """
    step.set_noise(False)
    bound = step.clip * step.scale
    step.set_update_size(bound)
    x0, y0 = step.x_example, step.y_example
    labels = _labels(step.model, y0, rng, 4)
    inputs = _inputs(step.model, x0, rng, (0.0, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1000.0))
    by_var = np.zeros(len(step.variables))
    overall = 0.0
    rows = max(1, min(int(step.optimizer.batch_size) - 1, 15))
    notes = []
    points = [None] + [[rng.normal(size=v.shape) * scale for v in step.variables] for scale in weight_points]
    for point in points:
        step.set_weights_point(point)
        contexts = [_Context("alone"), _rows(step, rng, labels, rows, 0.0)]
        weighted = _rows(step, rng, labels, rows, 1.0)
        if _deterministic(step, weighted):
            contexts.append(weighted)
        elif not notes:
            notes.append("sensitivity: the step at sigma 0 is random (stochastic layers), so crafted "
                         "examples were not tried among rows of weight 1, only alone and among rows of "
                         "weight 0")
        found = _search(step, rng, inputs, labels, contexts, by_var, candidates, ascent)
        overall = max(overall, found)
    step.set_weights_point(None)
    step.set_noise(True)
    ratio = overall / bound
    findings = [Finding("sensitivity", "all variables", "largest contribution / (C s)", ratio, 1.0 + rtol,
                        ratio > 1.0 + rtol, f"(C s = {bound:.4g})")]
    largest = {name: float(v / bound) for name, v in zip(step.names, by_var, strict=True)}
    unreached = [name for name, v in largest.items() if v <= 1e-6]
    return findings, ratio, largest, unreached, notes


def _search(step, rng, inputs, labels, contexts, by_var, candidates, ascent) -> float:
    """The largest contribution norm found from the current weight point (updates ``by_var``)."""
    pool = [(x, y) for x in inputs for y in labels]
    order = rng.permutation(len(pool))[:candidates]
    best, best_norm = None, -1.0

    def contribution(x, y, context, weight):
        nonlocal best, best_norm
        at = step.draw_step(rng)  # both calls from one step counter
        g = step.released(*context.batch(x, y, weight), at)
        base = step.released(*context.batch(x, y, 0.0), at)
        norms = np.array([float(np.linalg.norm(a - b)) for a, b in zip(g, base, strict=True)])
        np.maximum(by_var, norms, out=by_var)
        total = float(np.sqrt(np.sum(norms ** 2)))
        if total > best_norm:
            best, best_norm = (x, y, context, weight), total
        return total

    for k, i in enumerate(order):  # every context with every weight, in turn
        context = contexts[k % len(contexts)]
        contribution(*pool[i], context, SAMPLE_WEIGHTS[(k // len(contexts)) % len(SAMPLE_WEIGHTS)])
    if best is not None and not np.issubdtype(np.asarray(step.x_example).dtype, np.integer):
        step_size = 0.5
        for _ in range(ascent):  # random search on the input around the best so far
            x, y, context, weight = best
            trial = (x * np.exp(rng.normal(size=x.shape) * step_size)
                     + rng.normal(size=x.shape) * step_size * (np.abs(x).mean() + 1e-3)).astype(x.dtype)
            if contribution(trial, y, context, weight) < best_norm:
                step_size *= 0.9
    return best_norm


def accounting_checks(optimizer, rtol=0.02):
    """The optimizer's ``epsilon_after(T)`` against dp-accounting composed here (module docstring).

    T: one epoch of ``ceil(n / B)`` steps, and ten. Flagged when the optimizer reports less than
    ``(1 - rtol)`` times the independent composition.
    """
    delta = optimizer.delta if optimizer.delta is not None else 1e-5
    per_epoch = math.ceil(optimizer.num_examples / optimizer.batch_size)
    if optimizer.noise_multiplier <= 0:
        return [Finding("accounting", "optimizer", "noise multiplier", 0.0, 0.0, True, "(no noise)")]
    return [_accounting_check(optimizer, steps, delta, rtol) for steps in (per_epoch, 10 * per_epoch)]


def _accounting_check(optimizer, steps, delta, rtol):
    import dp_accounting

    n, b = optimizer.num_examples, optimizer.batch_size
    per_epoch = math.ceil(n / b)
    sigma = optimizer.noise_multiplier
    sensitivity = 2.0 if optimizer.neighboring == "replace_one" else 1.0
    gaussian = dp_accounting.GaussianDpEvent(sigma / sensitivity)
    if optimizer.sampling == "shuffle":
        event = dp_accounting.SelfComposedDpEvent(gaussian, math.ceil(steps / per_epoch))
    else:
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(b / n, gaussian), steps)
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE if optimizer.neighboring == "replace_one"
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if optimizer.accountant == "pld":
        acc = dp_accounting.pld.PLDAccountant(relation)
    else:
        acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    independent = float(acc.compose(event).get_epsilon(delta))
    reported = float(optimizer.epsilon_after(steps, delta=delta))
    return Finding("accounting", "optimizer", "epsilon_after / independent", reported / independent,
                   1.0 - rtol, reported < independent * (1.0 - rtol),
                   f"({steps} steps: optimizer {reported:.4g}, dp-accounting {independent:.4g})")


def traced_audit(model, x_example, y_example, *, calls=None, alpha=1e-3, seed=0, candidates=120, ascent=60,
                 max_calls=4000) -> TracedAuditResult:
    """Audit the released update of ``model.fit``'s traced train step (module docstring).

    Args:
      model: a compiled model with a tfdpbnn DP optimizer (not modified: the audit runs on a copy).
      x_example: one example's input (batch dimension 1), fixing the input shape and dtype (integer ids:
        the crafted examples draw ids below the smallest ``Embedding`` vocabulary).
      y_example: its label (batch dimension 1): sparse class labels, one-hot labels or real targets.
      calls: traced calls of the noise check (default: the fewest with power 0.99 against 0.9x the declared
        std on the smallest variable).
      max_calls: the most calls the default may choose.
      alpha: false-alarm rate of the noise statistics together (Bonferroni).
      seed: seeds the crafted examples (the DP noise comes from the copied optimizer's own run key).
      candidates: crafted examples tried in the sensitivity check.
      ascent: random-search steps from the largest found (float inputs).
    """
    start = time.perf_counter()
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    step = TracedStep(model, x_example, y_example)
    dims = [int(np.prod(v.shape)) for v in step.variables]
    k = calls if calls is not None else calls_for_power(dims, alpha, high=max_calls)
    if k < 16:
        raise ValueError(f"calls must be >= 16, got {k}")
    findings, powers = [], {}
    if step.noise_multiplier > 0:
        step.set_noise(False)
        stddev = step.noise_multiplier * step.clip * step.scale
        step.set_update_size(stddev)
        zero = np.zeros(1, np.float32)
        base = step.released(step.x_example, step.y_example, zero)
        step.set_noise(True)
        runs = [step.released(step.x_example, step.y_example, zero, step.draw_step(rng)) for _ in range(k)]
        noise = [np.stack([r[i] for r in runs]) - base[i] for i in range(len(base))]
        nf, powers = noise_checks(noise, step.names, stddev, alpha)
        findings += nf
    else:
        findings.append(Finding("noise", "optimizer", "noise multiplier", 0.0, 0.0, True,
                                "(sigma 0: no privacy; the noise check needs sigma > 0)"))
    sf, largest, by_var, unreached, notes = sensitivity_checks(step, rng, candidates, ascent)
    findings += sf
    findings += accounting_checks(step.original)
    return TracedAuditResult(
        optimizer=type(step.original).__name__, noise_multiplier=step.noise_multiplier,
        l2_norm_clip=step.clip, scale=step.scale, calls=step.calls, findings=findings,
        largest_contribution=largest, largest_by_variable=by_var, unreached=unreached, powers=powers,
        alpha=alpha, seconds=time.perf_counter() - start, notes=notes)


def example_batch(model):
    """``(x, y)``: one zero example and label shaped for ``model`` (single input and output), for ``--model``.

    Integer inputs give id 0; the label is class 0 (sparse for a sparse loss, else one-hot for several
    outputs) or a zero target.
    """
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError("model: the traced audit of a saved model needs a single input and a single output; "
                         "call tfdpbnn.audit.traced.traced_audit(model, x_example, y_example) instead")
    spec = model.inputs[0]
    dtype = tf.as_dtype(spec.dtype).as_numpy_dtype          # Keras 3's input dtype is a str
    x = np.zeros((1,) + tuple(int(d) for d in spec.shape[1:]), dtype)
    out = int(model.outputs[0].shape[-1] or 1)
    loss = model.loss
    name = loss if isinstance(loss, str) else (getattr(loss, "name", None) or getattr(loss, "__name__", None)
                                               or type(loss).__name__)
    name = str(name).lower()
    if "sparse" in name:
        y = np.zeros((1,), np.int64)
    elif out > 1:
        y = np.eye(out, dtype=np.float32)[:1]
    else:
        y = np.zeros((1, 1), np.float32)
    return x, y


#: The method models of ``method_traced_audit``: n examples, expected batch B (n / B = 4, so DP-SGLD's n / B
#: scale is visible), 8 features, 4 hidden units, 3 classes.
METHOD_MODEL = {"num_examples": 64, "batch_size": 16, "num_features": 8, "hidden": 4, "num_classes": 3}


def method_model(method, epsilon=1.0, delta=1e-5, seed=0):
    """``(model, x_example, y_example)``: the tiny ``tfdpbnn train`` model of ``method``, compiled.

    The optimizer's noise is calibrated (RDP, shuffled batches) to ``epsilon`` for one epoch of
    ``METHOD_MODEL``'s ``n / B`` steps.
    """
    from tfdpbnn import optimizers as O
    from tfdpbnn.audit.experiment import build_method_model
    from tfdpbnn.audit.step import METHODS

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    size = METHOD_MODEL
    n, b = size["num_examples"], size["batch_size"]
    common = dict(num_examples=n, batch_size=b, delta=delta, epochs=1, target_epsilon=epsilon)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if method == "dpsgld":
            opt = O.DPSGLDOptimizer(1.0, **common)
        elif method == "dpadam":
            opt = O.DPAdamOptimizer(1.0, **common)
        else:
            cls = {"dpvd": O.DPVDOptimizer, "sidp-ln": O.SIDPOptimizer, "sidp-bn": O.SIDPOptimizer}.get(
                method, O.DPSGDOptimizer)
            opt = cls(1.0, learning_rate=0.1, **common)
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(8, size["num_features"])).astype(np.float32)
        model = build_method_model(method, n, size["hidden"], seed, x_public=x,
                                   num_features=size["num_features"], num_classes=size["num_classes"])
        model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, x[:1], np.array([1])


def method_traced_audit(method, epsilon=1.0, delta=1e-5, seed=0, **kwargs) -> TracedAuditResult:
    """``traced_audit`` of ``method_model(method, epsilon, delta, seed)`` (``kwargs``: ``traced_audit``'s)."""
    model, x, y = method_model(method, epsilon, delta, seed)
    return traced_audit(model, x, y, seed=seed, **kwargs)


__all__ = ["METHOD_MODEL", "Finding", "SEES", "TracedAuditResult", "TracedStep", "accounting_checks",
           "calls_for_power", "example_batch", "method_model", "method_traced_audit", "noise_checks",
           "sensitivity_checks", "std_power", "traced_audit"]
