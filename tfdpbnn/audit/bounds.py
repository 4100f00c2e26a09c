"""Lower bounds on epsilon from canary scores, each at a stated confidence (default 95%).

* ``multi_run_epsilon``: the distinguishing audit of Jagielski, Ullman & Oprea 2020 and Nasr et al. 2021,
  2023. Runs WITH and WITHOUT the canary give scores; the test "in iff score
  >= t" has false positive rate FPR and false negative rate FNR. Any (epsilon, delta)-DP mechanism satisfies
  FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta (Kairouz, Oh & Viswanath 2015, Theorem 2.1),
  so with Clopper-Pearson upper bounds FPR_ub, FNR_ub (each at level alpha/2)

      epsilon >= max(log((1 - delta - FNR_ub) / FPR_ub), log((1 - delta - FPR_ub) / FNR_ub))

  with probability >= 1 - alpha over the runs.
* ``one_run_epsilon``: Steinke, Nasr & Jagielski 2023 ("Privacy auditing with one (1) training run"). m
  canaries, each included independently with probability 1/2; the auditor guesses "in" for its k+ highest
  scores and "out" for its k- lowest (r = k+ + k- guesses) and counts v correct guesses. For an
  eps-DP algorithm (their main theorem, Section 3) P[V >= v] <= f(v) := P[Binomial(r, p) >= v],
  p = e^eps / (1 + e^eps); for (eps, delta)-DP (their Corollary 5.4, computed as their Appendix D does)

      P[V >= v] <= f(v) + 2 m delta max_{i = 1..v} (f(v - i) - f(v)) / i.

  The bound is the largest eps whose p-value is still <= alpha.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, special, stats

from tfdpbnn._validation import check_open_unit


def _check_confidence(confidence) -> float:
    return check_open_unit("confidence", confidence)


def _check_delta(delta) -> float:
    delta = float(delta)
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return delta


def clopper_pearson_upper(successes, trials, alpha):
    """One-sided Clopper-Pearson (1934) upper bound p with P[Binomial(trials, p) <= successes] = alpha.

    Vectorized over ``successes``; 1 where ``successes == trials``.
    """
    k = np.asarray(successes, dtype=float)
    n = float(trials)
    with np.errstate(invalid="ignore"):
        upper = stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, upper)


def clopper_pearson_lower(successes, trials, alpha):
    """One-sided Clopper-Pearson lower bound: ``1 - clopper_pearson_upper(trials - successes, ...)``."""
    return 1.0 - clopper_pearson_upper(np.asarray(trials) - np.asarray(successes), trials, alpha)


def _epsilon_from_rates(fpr_ub, fnr_ub, delta):
    """max(log((1 - delta - FNR)/FPR), log((1 - delta - FPR)/FNR)), 0 where neither is positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr_ub, 0.0)) - np.log(fpr_ub)
        b = np.log(np.maximum(1.0 - delta - fpr_ub, 0.0)) - np.log(fnr_ub)
    eps = np.nan_to_num(np.fmax(a, b), nan=0.0, neginf=0.0)
    return np.maximum(eps, 0.0)


@dataclasses.dataclass(frozen=True)
class MultiRunResult:
    """Result of ``multi_run_epsilon``: the lower bound and what it was computed from."""

    epsilon: float
    threshold: float
    false_positives: int
    false_negatives: int
    num_in: int
    num_out: int
    fpr_upper: float
    fnr_upper: float
    confidence: float
    delta: float
    threshold_strategy: str


def _counts(in_sorted, out_sorted, thresholds):
    """(FN, FP) of the test "in iff score >= t" at each threshold t."""
    fn = np.searchsorted(in_sorted, thresholds, side="left")
    fp = len(out_sorted) - np.searchsorted(out_sorted, thresholds, side="left")
    return fn, fp


def _split_runs(in_scores, out_scores, fraction, seed):
    """Random split of each kind of run: ((in, out) to choose the threshold, (in, out) to bound)."""
    fraction = check_open_unit("split_fraction", fraction)
    rng = np.random.default_rng(seed)
    in_perm, out_perm = rng.permutation(in_scores), rng.permutation(out_scores)
    ki, ko = int(len(in_perm) * fraction), int(len(out_perm) * fraction)
    if min(ki, ko, len(in_perm) - ki, len(out_perm) - ko) < 1:
        raise ValueError("threshold='split' needs at least 2 runs with and 2 without the canary")
    return (in_perm[:ki], out_perm[:ko]), (in_perm[ki:], out_perm[ko:])


def _best_threshold(in_scores, out_scores, delta, alpha, pessimistic=False):
    """The threshold maximizing the bound on these runs.

    ``pessimistic``: score every threshold at level alpha / (number of thresholds), which keeps a threshold
    chosen on one split from resting on a handful of extreme runs (it only chooses t; the bound itself is
    computed on the other split at level alpha).
    """
    in_sorted, out_sorted = np.sort(in_scores), np.sort(out_scores)
    thresholds = np.unique(np.concatenate([in_sorted, out_sorted]))
    if pessimistic:
        alpha = alpha / len(thresholds)
    fn, fp = _counts(in_sorted, out_sorted, thresholds)
    eps = _epsilon_from_rates(clopper_pearson_upper(fp, len(out_sorted), alpha / 2),
                              clopper_pearson_upper(fn, len(in_sorted), alpha / 2), delta)
    i = int(np.argmax(eps))
    return float(thresholds[i]), eps, thresholds


def multi_run_epsilon(in_scores, out_scores, delta=0.0, confidence=0.95, threshold="split",
                      split_fraction=0.5, seed=0) -> MultiRunResult:
    """Lower bound on epsilon from the scores of runs with (``in_scores``) and without the canary.

    Jagielski et al. 2020 with Clopper-Pearson intervals (Nasr et al. 2021): the test
    "canary in iff score >= t" is evaluated on independent runs; FPR and FNR get one-sided Clopper-Pearson
    upper bounds at level (1 - confidence)/2 each, and epsilon >= max(log((1 - delta - FNR)/FPR),
    log((1 - delta - FPR)/FNR)) (Kairouz et al. 2015, Theorem 2.1) holds with probability >= ``confidence``.

    Args:
      in_scores: one score per run with the canary (higher = more evidence the canary was in); runs
        independent.
      out_scores: one score per run without the canary, on the same scale; runs independent.
      delta: the delta of the claim being tested (0 <= delta < 1).
      confidence: probability that the returned value is a valid lower bound.
      threshold: a float (fixed before seeing the scores); "split" (choose t on a random ``split_fraction``
        of the runs of each kind, bound on the rest); or "bonferroni" (every distinct score, confidence
        split over them by a union bound).
      split_fraction: fraction of the runs used to choose t with "split".
      seed: seed of the random split.
    """
    in_scores = np.asarray(in_scores, dtype=float).ravel()
    out_scores = np.asarray(out_scores, dtype=float).ravel()
    if in_scores.size == 0 or out_scores.size == 0:
        raise ValueError("in_scores and out_scores must each hold at least one score")
    if not (np.all(np.isfinite(in_scores)) and np.all(np.isfinite(out_scores))):
        raise ValueError("in_scores and out_scores must be finite")
    delta = _check_delta(delta)
    alpha = 1.0 - _check_confidence(confidence)
    if isinstance(threshold, str):
        if threshold == "split":
            (in_sel, out_sel), (in_scores, out_scores) = _split_runs(in_scores, out_scores, split_fraction,
                                                                     seed)
            t, _, _ = _best_threshold(in_sel, out_sel, delta, alpha, pessimistic=True)
            level = alpha
        elif threshold == "bonferroni":
            in_sorted, out_sorted = np.sort(in_scores), np.sort(out_scores)
            thresholds = np.unique(np.concatenate([in_sorted, out_sorted]))
            level = alpha / len(thresholds)
            fn, fp = _counts(in_sorted, out_sorted, thresholds)
            eps = _epsilon_from_rates(clopper_pearson_upper(fp, len(out_sorted), level / 2),
                                      clopper_pearson_upper(fn, len(in_sorted), level / 2), delta)
            t = float(thresholds[int(np.argmax(eps))])
        else:
            raise ValueError(f"threshold must be a float, 'split' or 'bonferroni', got {threshold!r}")
    else:
        t, level = float(threshold), alpha
    fn = int(np.sum(in_scores < t))
    fp = int(np.sum(out_scores >= t))
    fpr_ub = float(clopper_pearson_upper(fp, len(out_scores), level / 2))
    fnr_ub = float(clopper_pearson_upper(fn, len(in_scores), level / 2))
    eps = float(_epsilon_from_rates(np.array(fpr_ub), np.array(fnr_ub), delta))
    strategy = threshold if isinstance(threshold, str) else "fixed"
    return MultiRunResult(eps, t, fp, fn, len(in_scores), len(out_scores), fpr_ub, fnr_ub, 1.0 - alpha,
                          delta, strategy)


def max_multi_run_epsilon(num_in, num_out, delta=0.0, confidence=0.95) -> float:
    """The largest bound ``multi_run_epsilon`` can return with a fixed threshold: no error on either side.

    A test that separates the runs perfectly still has FPR_ub = 1 - (alpha/2)^(1/num_out); this is the
    ceiling that the number of runs puts on any multi-run audit.
    """
    alpha = 1.0 - _check_confidence(confidence)
    return float(_epsilon_from_rates(clopper_pearson_upper(0, num_out, alpha / 2),
                                     clopper_pearson_upper(0, num_in, alpha / 2), _check_delta(delta)))


def one_run_p_value(num_canaries, num_guesses, num_correct, epsilon, delta=0.0) -> float:
    """P[V >= v] bound of Steinke, Nasr & Jagielski 2023 (Section 3; with delta, Corollary 5.4, Appendix D).

    ``f(v) = P[Binomial(r, p) >= v]``, ``p = e^eps / (1 + e^eps)``; returns
    ``min(1, f(v) + 2 m delta max_{1 <= i <= v} (f(v - i) - f(v)) / i)`` (m canaries, r guesses, v correct).
    """
    m, r, v = int(num_canaries), int(num_guesses), int(num_correct)
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= num_correct <= num_guesses <= num_canaries, got {v}, {r}, {m}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    delta = _check_delta(delta)
    p = float(special.expit(epsilon))
    f_v = float(stats.binom.sf(v - 1, r, p))
    if delta == 0 or v == 0:
        return min(1.0, f_v)
    i = np.arange(1, v + 1)
    gaps = (stats.binom.sf(v - i - 1, r, p) - f_v) / i
    return min(1.0, f_v + 2.0 * m * delta * float(np.max(gaps)))


def one_run_epsilon_from_counts(num_canaries, num_guesses, num_correct, delta=0.0, confidence=0.95) -> float:
    """Largest epsilon rejected at level 1 - ``confidence`` by ``one_run_p_value`` (0 if none is).

    The p-value is increasing in epsilon, so the bound is found by
    bisection (Brent's method) on ``p_value(eps) = alpha``.
    """
    alpha = 1.0 - _check_confidence(confidence)

    def excess(eps):
        return alpha - one_run_p_value(num_canaries, num_guesses, num_correct, eps, delta)

    if num_guesses == 0 or excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2.0
        if hi > 1e4:  # pragma: no cover - needs astronomically many correct guesses
            return math.inf
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-6))


@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """Result of ``one_run_epsilon``."""

    epsilon: float
    num_canaries: int
    num_guesses: int
    num_correct: int
    k_plus: int
    k_minus: int
    confidence: float
    delta: float


#: The guess sizes a one-run audit tries by default, as fractions of the number of canaries m.
GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def check_canary_scores(scores, included):
    """``(scores, included)`` of a one-run audit as flat float / bool arrays, after checking them."""
    scores = np.asarray(scores, dtype=float).ravel()
    included = np.asarray(included).ravel()
    if scores.shape != included.shape or scores.size == 0:
        raise ValueError("scores and included must be non-empty and of the same length")
    if included.dtype != bool:
        raise ValueError(f"included must be boolean, got dtype {included.dtype}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite")
    return scores, included


def one_run_epsilon(scores, included, delta=0.0, confidence=0.95, guesses=None) -> OneRunResult:
    """Lower bound on epsilon from ONE run with m canaries (Steinke, Nasr & Jagielski 2023).

    Args:
      scores: one score per canary (higher = more evidence it was included).
      included: boolean per canary; each must have been included independently with probability 1/2.
      delta: delta of the claim tested.
      confidence: the bound holds with this probability.
      guesses: list of (k_plus, k_minus) pairs to try: guess "in" for the k_plus highest scores and "out" for
        the k_minus lowest. Default: k_plus = k_minus in {m/100, m/50, m/20, m/10, m/5, m/2} (distinct, >= 1)
        and one-sided k_plus in the same grid. Trying several is paid for by a union bound (each is tested
        at level (1 - confidence) / len(guesses)), so the result holds at ``confidence`` overall.
    """
    scores, included = check_canary_scores(scores, included)
    m = scores.size
    delta = _check_delta(delta)
    alpha = 1.0 - _check_confidence(confidence)
    if guesses is None:
        ks = sorted({max(1, int(m * f)) for f in GUESS_FRACTIONS})
        guesses = [(k, k) for k in ks if 2 * k <= m] + [(k, 0) for k in ks]
    guesses = [(int(kp), int(km)) for kp, km in guesses]
    for kp, km in guesses:
        if kp < 0 or km < 0 or kp + km == 0 or kp + km > m:
            raise ValueError(f"guesses: need k_plus, k_minus >= 0 and 1 <= k_plus + k_minus <= {m}, got "
                             f"({kp}, {km})")
    order = np.argsort(scores, kind="stable")
    level = 1.0 - alpha / len(guesses)
    best = OneRunResult(0.0, m, 0, 0, 0, 0, 1.0 - alpha, delta)
    for kp, km in guesses:
        correct = int(np.sum(included[order[m - kp:]])) if kp else 0
        correct += int(np.sum(~included[order[:km]])) if km else 0
        eps = one_run_epsilon_from_counts(m, kp + km, correct, delta, level)
        if eps > best.epsilon:
            best = OneRunResult(eps, m, kp + km, correct, kp, km, 1.0 - alpha, delta)
    return best


@dataclasses.dataclass(frozen=True)
class GDPResult:
    """Result of ``gdp_lower_bound``: ``mu`` and the epsilon at ``delta`` of mu-GDP."""

    mu: float
    epsilon: float
    threshold: float
    fpr_upper: float
    fnr_upper: float
    confidence: float
    delta: float


def gdp_lower_bound(in_scores, out_scores, delta, confidence=0.95, threshold="split", split_fraction=0.5,
                    seed=0) -> GDPResult:
    """Lower bound on mu for any mu-GDP claim, and the epsilon at ``delta`` it implies (Nasr et al. 2023).

    Nasr et al. (2023) with Clopper-Pearson intervals; Dong, Roth & Su (2019). A mu-GDP mechanism has FNR >=
    G_mu(FPR) = Phi(Phi^-1(1 - FPR) - mu) for every test (Dong et al. 2019), so ``mu >= Phi^-1(1 - FPR_ub) -
    Phi^-1(FNR_ub)`` (and with the roles of the two worlds swapped) with probability >= ``confidence``. This
    refutes a GDP claim (the Gaussian mechanism; DP-SGD with full batches or shuffled batches, whose
    accounting is an exact Gaussian composition) at a tradeoff point hundreds of runs can resolve, where the
    (epsilon, delta) bound of ``multi_run_epsilon`` would need FPR near delta. ``epsilon`` = epsilon(delta) of
    mu-GDP (Dong et al. 2019, Corollary 2.13): a lower bound on the epsilon of a GDP claim, NOT of an
    arbitrary mechanism.
    ``threshold``: a float, "split" or "bonferroni", as for ``multi_run_epsilon``.
    """
    from tfdpbnn.privacy.gdp import gdp_epsilon

    in_scores = np.asarray(in_scores, dtype=float).ravel()
    out_scores = np.asarray(out_scores, dtype=float).ravel()
    if in_scores.size == 0 or out_scores.size == 0:
        raise ValueError("in_scores and out_scores must each hold at least one score")
    delta = check_open_unit("delta", delta)
    alpha = 1.0 - _check_confidence(confidence)

    def mus(ins, outs, level, pessimistic=False):
        in_sorted, out_sorted = np.sort(ins), np.sort(outs)
        thresholds = np.unique(np.concatenate([in_sorted, out_sorted]))
        if pessimistic:  # as in _best_threshold: only chooses t
            level = level / len(thresholds)
        fn, fp = _counts(in_sorted, out_sorted, thresholds)
        fpr = clopper_pearson_upper(fp, len(outs), level / 2)
        fnr = clopper_pearson_upper(fn, len(ins), level / 2)
        both = np.stack([stats.norm.isf(fpr) - stats.norm.ppf(fnr),
                         stats.norm.isf(fnr) - stats.norm.ppf(fpr)])
        return thresholds, np.max(both, axis=0)

    level = alpha
    if isinstance(threshold, str):
        if threshold == "split":
            (in_sel, out_sel), (in_scores, out_scores) = _split_runs(in_scores, out_scores, split_fraction,
                                                                     seed)
            thresholds, mu = mus(in_sel, out_sel, alpha, pessimistic=True)
            t = float(thresholds[int(np.argmax(mu))])
        elif threshold == "bonferroni":
            level = alpha / len(np.unique(np.concatenate([in_scores, out_scores])))
            thresholds, mu = mus(in_scores, out_scores, level)
            t = float(thresholds[int(np.argmax(mu))])
        else:
            raise ValueError(f"threshold must be a float, 'split' or 'bonferroni', got {threshold!r}")
    else:
        t = float(threshold)
    fn, fp = int(np.sum(in_scores < t)), int(np.sum(out_scores >= t))
    fpr_ub = float(clopper_pearson_upper(fp, len(out_scores), level / 2))
    fnr_ub = float(clopper_pearson_upper(fn, len(in_scores), level / 2))
    mu_lb = max(0.0, float(max(stats.norm.isf(fpr_ub) - stats.norm.ppf(fnr_ub),
                               stats.norm.isf(fnr_ub) - stats.norm.ppf(fpr_ub))))
    return GDPResult(mu_lb, float(gdp_epsilon(mu_lb, delta)), t, fpr_ub, fnr_ub, 1.0 - alpha, delta)
