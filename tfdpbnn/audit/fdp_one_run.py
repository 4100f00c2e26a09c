"""The f-DP one-run audit (Mahloujifar, Melis & Chaudhuri 2024, "Auditing f-differential privacy in one run").

Same experiment as Steinke, Nasr & Jagielski (2023) (``tfdpbnn.audit.one_run_epsilon``): m canaries, each
included independently with probability 1/2, one training run, the auditor guesses "in" for the canaries
with the highest scores (k guesses, c correct). Steinke et al. test an (epsilon, delta) claim; Mahloujifar
et al. test an f-DP claim, a whole tradeoff curve f (Dong, Roth & Su 2019), which bounds the probability
of c correct guesses more tightly when the mechanism is Gaussian-like. Their bound ("audit with r, h and a
cap", Section 4) is computed by a recursion over the number of correct guesses: with significance alpha,
``r = alpha c / m`` and ``h = alpha (k - c) / m``; for i = c - 1, ..., 0:
``h' = max(h, f(1 - r))``, ``r' = min(1, r + i / (k - i) (h' - h))``; the claim is rejected when the final
``r + h`` exceeds ``k / m``.

Here the claims are mu-GDP (``f(x) = Phi(Phi^-1(1 - x) - mu)``), the exact tradeoff curve of a full-batch
DP step (the step audit's claim) and of the canary model used to measure the estimators' power. For a
Poisson-subsampled run the accountant's curve is not Gaussian; a GDP claim is then not the accountant's
claim (docs/audit.md, "What the one-run audit can see").
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import optimize, stats

from tfdpbnn.audit.bounds import GUESS_FRACTIONS, _check_confidence, _check_delta, check_canary_scores


def gdp_tradeoff(mu: float):
    """The tradeoff curve of mu-GDP, ``f(x) = Phi(Phi^-1(1 - x) - mu)`` (Dong, Roth & Su 2019, eq. 2.3)."""
    return lambda x: float(stats.norm.cdf(stats.norm.ppf(1.0 - x) - mu))


def fdp_claim_rejected(tradeoff, num_canaries, num_guesses, num_correct, alpha) -> bool:
    """Whether ``num_correct`` of ``num_guesses`` correct guesses reject the f-DP claim at level ``alpha``.

    Mahloujifar, Melis & Chaudhuri (2024), the recursion of Section 4 (module docstring): under an f-DP
    mechanism, k guesses are all correct-or-better than ``num_correct`` with probability at most alpha
    only if the recursion ends with ``r + h <= k / m``.
    """
    m, k, c = int(num_canaries), int(num_guesses), int(num_correct)
    if not 0 <= c <= k <= m or m < 1:
        raise ValueError(f"need 0 <= num_correct <= num_guesses <= num_canaries, got {c}, {k}, {m}")
    if k == 0 or c == 0:
        return False
    r, h = alpha * c / m, alpha * (k - c) / m
    for i in range(c - 1, -1, -1):
        h_new = max(h, tradeoff(1.0 - r))
        if h_new == h:  # neither h nor r can change any more
            break
        r, h = min(1.0, r + i / (k - i) * (h_new - h)), h_new
    return r + h > k / m


def gdp_mu_from_counts(num_canaries, num_guesses, num_correct, confidence=0.95) -> float:
    """Largest mu whose mu-GDP claim the counts reject at level 1 - ``confidence`` (0 if none)."""
    alpha = 1.0 - _check_confidence(confidence)

    def rejected(mu):
        return fdp_claim_rejected(gdp_tradeoff(mu), num_canaries, num_guesses, num_correct, alpha)

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejected(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 64:  # pragma: no cover - a perfect score on astronomically many canaries
            return math.inf
    return float(optimize.bisect(lambda mu: 0.5 - rejected(mu), lo, hi, xtol=1e-4))


@dataclasses.dataclass(frozen=True)
class FdpOneRunResult:
    """Result of ``one_run_gdp_bound``: the largest mu-GDP claim rejected and its epsilon at ``delta``."""

    mu: float
    epsilon: float
    num_canaries: int
    num_guesses: int
    num_correct: int
    confidence: float
    delta: float


def one_run_gdp_bound(scores, included, delta, confidence=0.95, guesses=None) -> FdpOneRunResult:
    """Lower bound on mu (and on the epsilon of a mu-GDP claim) from ONE run with m canaries.

    Mahloujifar, Melis & Chaudhuri (2024) with the GDP family of claims. The guesses are "in" for the k
    highest scores, k in ``guesses`` (default m/100, m/50, m/20, m/10, m/5, m/2), paid for by a union bound
    as in ``tfdpbnn.audit.one_run_epsilon``; the result holds at ``confidence`` overall.
    """
    from tfdpbnn.privacy.gdp import gdp_epsilon

    scores, included = check_canary_scores(scores, included)
    m = scores.size
    delta = _check_delta(delta)
    alpha = 1.0 - _check_confidence(confidence)
    if guesses is None:
        guesses = sorted({max(1, int(m * f)) for f in GUESS_FRACTIONS})
    guesses = [int(k) for k in guesses]
    if any(not 1 <= k <= m for k in guesses):
        raise ValueError(f"guesses: each k must be in [1, {m}], got {guesses}")
    order = np.argsort(scores, kind="stable")[::-1]
    best = FdpOneRunResult(0.0, 0.0, m, 0, 0, 1.0 - alpha, delta)
    for k in guesses:
        correct = int(np.sum(included[order[:k]]))
        mu = gdp_mu_from_counts(m, k, correct, 1.0 - alpha / len(guesses))
        if mu > best.mu:
            best = FdpOneRunResult(mu, float(gdp_epsilon(mu, delta)) if mu > 0 else 0.0, m, k, correct,
                                   1.0 - alpha, delta)
    return best


__all__ = ["FdpOneRunResult", "fdp_claim_rejected", "gdp_mu_from_counts", "gdp_tradeoff", "one_run_gdp_bound"]
