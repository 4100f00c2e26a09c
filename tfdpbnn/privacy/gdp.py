"""Gaussian DP (GDP) accountant (Dong, Roth & Su 2019; Bu, Dong, Long & Su 2020; Zhang et al. 2022).

Gaussian mechanism with noise multiplier s (noise std / L2 sensitivity Delta) is exactly mu-GDP with
mu = Delta / sigma = 1 / s; mu-GDP mechanisms compose to sqrt(sum mu_i^2)-GDP (Dong et al. Cor. 2). Poisson
subsampling uses the central limit theorem of Zhang et al. (2022, Theorem 2) (Bu et al. 2020, Thm. 5): T steps
at
sampling rate q are approximately mu-GDP with mu = q sqrt(T (e^{1/s^2} - 1)). That is an APPROXIMATION, not
a bound: ``is_approximate`` becomes True and ``get_epsilon`` warns (``GDPApproximationWarning``) where the CLT
is known to under-report against PLD by more than 5% (rule in ``clt_may_underreport``, validated against PLD
by ``tests/test_privacy_gdp.py``). mu-GDP to (epsilon, delta) is the exact duality
delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong et al. Cor. 1).
"""

from __future__ import annotations

import math
import warnings

from dp_accounting import NeighboringRelation
from scipy import optimize, special

from tfdpbnn.privacy._base import EventAccountant


class GDPApproximationWarning(UserWarning):
    """The GDP central-limit approximation may under-report epsilon against PLD by more than 5%."""


def clt_may_underreport(sample_rate: float, noise_multiplier: float, steps: int) -> bool:
    """Cheap rule: False only where the CLT's epsilon was measured within 5% of PLD's (or above it).

    Measured at delta = 1e-5 on sigma in {0.6, 0.8, 1, 1.5, 2, 4} x q in {0.001, ..., 0.1} x steps in
    {10, ..., 10000} (benchmarks/gdp_clt_grid.py; PLD with discretization 1e-4). GDP/PLD grows with steps and
    with sigma, so the safe region is a staircase ``CLT_SAFE_REGION`` of (min sigma, min steps), restricted to
    the measured range of q; everything else warns. The tests re-check the boundary against PLD.
    """
    if not CLT_SAFE_SAMPLE_RATES[0] <= sample_rate <= CLT_SAFE_SAMPLE_RATES[1]:
        return True
    return not any(noise_multiplier >= s and steps >= t for s, t in CLT_SAFE_REGION)


# (min noise multiplier, min steps) pairs; worst measured GDP/PLD inside: 0.954 (sigma 4, 100 steps),
# 0.967 (sigma 2, 1000 steps), 0.961 (sigma 1, 10000 steps).
CLT_SAFE_REGION = ((4.0, 100), (2.0, 1000), (1.0, 10000))
CLT_SAFE_SAMPLE_RATES = (0.001, 0.1)


def _log_ndtr(x: float) -> float:
    return float(special.log_ndtr(x))


def gdp_delta(mu: float, epsilon: float) -> float:
    """Exact delta of mu-GDP at ``epsilon`` (Dong, Roth & Su 2019, Corollary 1)."""
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    a = _log_ndtr(-epsilon / mu + mu / 2.0)
    b = epsilon + _log_ndtr(-epsilon / mu - mu / 2.0)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 with delta(epsilon) <= ``delta`` for mu-GDP (inverse of ``gdp_delta``)."""
    if mu == 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: math.log(max(gdp_delta(mu, e), 1e-320)) - math.log(delta), 0.0, hi,
                                 xtol=1e-12, rtol=1e-12))


class GDPAccountant(EventAccountant):
    """mu-GDP accountant: exact for Gaussians, Zhang et al. (2022, Thm. 2) CLT for Poisson-subsampled ones.

    ``mu`` is the composed GDP parameter, ``is_approximate`` True once a CLT step was composed. Not in
    ``sound_accountants()``: for subsampled events its epsilon is an approximation, not an upper bound.
    """

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE):
        super().__init__(neighboring_relation)
        self._mu_sq = 0.0
        self._approximate = False
        self._risky_blocks: list[tuple[float, float, int]] = []

    def _add_gaussian(self, sigma: float, count: int) -> None:
        self._mu_sq += count / (sigma * sigma)

    def _add_poisson_gaussian(self, q: float, sigma: float, count: int) -> None:
        if q == 1.0:
            self._add_gaussian(sigma, count)
            return
        self._mu_sq += q * q * count * math.expm1(1.0 / (sigma * sigma))
        self._approximate = True
        if clt_may_underreport(q, sigma, count):
            self._risky_blocks.append((q, sigma, count))

    @property
    def mu(self) -> float:
        """The composed mu (inf after a non-private event)."""
        return math.inf if self._non_private else math.sqrt(self._mu_sq)

    @property
    def is_approximate(self) -> bool:
        """True when a central-limit (subsampled) step was composed: epsilon is then not a bound."""
        return self._approximate

    def _warn(self) -> None:
        if self._risky_blocks:
            q, sigma, count = self._risky_blocks[0]
            warnings.warn(
                f"GDP central-limit approximation (Zhang et al. 2022, Thm. 2) may under-report epsilon by "
                f"more "
                f"than "
                f"5% against PLD for sample_rate={q:g}, noise_multiplier={sigma:g}, steps={count} (measured "
                f"safe: (noise_multiplier, steps) >= one of {CLT_SAFE_REGION}, sample_rate in "
                f"{list(CLT_SAFE_SAMPLE_RATES)}); use 'pld' or 'rdp' for a guarantee.",
                GDPApproximationWarning, stacklevel=4)

    def _epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` by exact GDP duality (approximate if ``is_approximate``)."""
        self._warn()
        return gdp_epsilon(self.mu, target_delta)

    def _delta(self, target_epsilon: float) -> float:
        """Delta at ``target_epsilon`` by exact GDP duality (approximate if ``is_approximate``)."""
        self._warn()
        return gdp_delta(self.mu, target_epsilon)


__all__ = ["GDPAccountant", "GDPApproximationWarning", "clt_may_underreport", "gdp_delta", "gdp_epsilon"]
