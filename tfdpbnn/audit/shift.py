"""The mean-shift bound on mu for a Gaussian mechanism audited with paired runs (Dong, Roth & Su 2019).

A step of DP-SGD releases the canary coordinate as ``a + N(0, s^2)`` with the canary and ``N(0, s^2)``
without it; the pair of worlds is exactly ``mu``-GDP with ``mu = a / s`` (Dong, Roth & Su 2019, Theorem 2.7:
the tradeoff curve of N(0, 1) vs N(mu, 1)), and T such releases compose to ``sqrt(T) a / s`` (their
Corollary 3.3). With K independent pairs of runs (one with, one without the canary, independent noise), the
differences ``D_k`` are i.i.d. ``N(mu_T s', 2 s'^2)`` and the one-sample t statistic
``t = mean(D) / (sd(D) / sqrt(K))`` has the noncentral t distribution with ``K - 1`` degrees of freedom and
noncentrality ``mu_T sqrt(K / 2)`` (Student 1908; Johnson & Welch 1940). Inverting it gives an EXACT
one-sided confidence bound on mu for Gaussian noise of equal variance in both worlds, which is what the
mechanism claims; ``tfdpbnn.audit.gdp_lower_bound`` and ``multi_run_epsilon`` are the assumption-free
(Clopper-Pearson) bounds on the same runs. Pairing also exposes replayed noise: if both runs of a pair
draw the same noise, ``sd(D) = 0`` and the bound is infinite.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, stats

from tfdpbnn._validation import check_open_unit, check_positive

#: Above this t statistic the noncentral t is replaced by its normal approximation (scipy's nct loses
#: accuracy there; every such t refutes any claim a DP optimizer makes).
_LARGE_T = 1e3


@dataclasses.dataclass(frozen=True)
class ShiftBound:
    """The mean-shift estimate of mu from K paired runs and its one-sided lower confidence bound."""

    mu_hat: float
    mu_lower: float
    t_statistic: float
    pairs: int
    confidence: float


def _scale(pairs: int) -> float:
    return math.sqrt(pairs / 2.0)


def paired_shift_bound(differences, confidence=0.999) -> ShiftBound:
    """Lower bound on mu from K paired differences, exact for Gaussian noise (module docstring).

    Each difference is one pair's released canary coordinate without minus with the canary, oriented so that
    the canary's shift is positive.

    Args:
      differences: K >= 3 differences, one per pair of independent runs.
      confidence: the bound holds with at least this probability when the noise is Gaussian.
    """
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size < 3:
        raise ValueError(f"differences: need at least 3 pairs, got {d.size}")
    confidence = check_open_unit("confidence", confidence)
    k = d.size
    sd = float(np.std(d, ddof=1))
    mean = float(np.mean(d))
    if sd == 0.0:
        t = math.inf if mean > 0 else (-math.inf if mean < 0 else 0.0)
    else:
        t = mean / (sd / math.sqrt(k))
    mu_hat = mean * math.sqrt(2.0) / sd if sd > 0 else t
    alpha = 1.0 - confidence
    df = k - 1
    if not math.isfinite(t) or t > _LARGE_T:
        lower_nc = t - stats.norm.isf(alpha) * math.sqrt(1.0 + t * t / (2.0 * df)) if math.isfinite(t) else t
    elif stats.nct.sf(t, df, 0.0) >= alpha:
        lower_nc = 0.0
    else:
        # P_nc(T >= t) increases with nc: the smallest nc under which t is not in the upper alpha tail.
        lower_nc = optimize.brentq(lambda nc: stats.nct.sf(t, df, nc) - alpha, 0.0, t + 10.0, xtol=1e-10)
    return ShiftBound(mu_hat=float(mu_hat), mu_lower=max(0.0, float(lower_nc) / _scale(k)),
                      t_statistic=float(t), pairs=int(k), confidence=confidence)


def paired_shift_power(claimed_mu, pairs, factor=1.5, confidence=0.999) -> float:
    """The power: probability that ``paired_shift_bound`` refutes ``claimed_mu`` when the truth is larger.

    The truth is ``factor * claimed_mu`` (a sensitivity, or 1/noise, ``factor`` times the claim); the
    probability comes from the noncentral t. The claim is refuted when the lower bound exceeds
    ``claimed_mu``, i.e. when t exceeds the ``confidence`` quantile of its law under ``claimed_mu``.
    """
    claimed_mu = check_positive("claimed_mu", claimed_mu)
    factor = check_positive("factor", factor)
    confidence = check_open_unit("confidence", confidence)
    if int(pairs) < 3:
        raise ValueError(f"pairs must be >= 3, got {pairs!r}")
    df, s = int(pairs) - 1, _scale(int(pairs))
    t_crit = stats.nct.isf(1.0 - confidence, df, claimed_mu * s)
    return float(stats.nct.sf(t_crit, df, factor * claimed_mu * s))


__all__ = ["ShiftBound", "paired_shift_bound", "paired_shift_power"]
