"""DPVD-AC accountant of Ermis & Cemgil (2017a), made sound for every epsilon.

Per step (Ermis & Cemgil 2017a, Section 4.1): the Gaussian mechanism's (eps0, delta0)-DP, amplified by Poisson
subsampling at rate q (Li, Qardaji & Su 2012, Thm. 1; Ermis & Cemgil (2017a, Thm. 3)) to
(log(1 + q (e^eps0 - 1)), q delta0), then T-fold advanced composition (Dwork & Roth 2014, Thm. 3.20;
Ermis & Cemgil (2017a, Thm. 1)): eps = sqrt(2 T log(1/delta')) eps_step + T eps_step (e^eps_step - 1)
at delta = T delta_step + delta'.
Heterogeneous steps use the same bound with sum of eps_i^2 (the Azuma step of Thm. 3.20's proof), and the
basic composition sum eps_i at delta = sum delta_i is used when smaller.

Difference from the paper: eps0 comes from the exact analytic Gaussian mechanism (Balle & Wang 2018, Thm. 8),
delta0 = Phi(1/(2s) - eps0 s) - e^eps0 Phi(-1/(2s) - eps0 s) for noise multiplier s, instead of the classical
sigma = sqrt(2 log(1.25/delta0)) / eps0, which is only valid for eps0 < 1 (Ermis & Cemgil 2017a, Thm. 2). The
analytic
form is valid for all eps0 and at least as tight wherever the classical one applies. It is the (eps, delta)
curve of (1/s)-GDP (Dong, Roth & Su 2019), so it is computed by ``tfdpbnn.privacy.gdp.gdp_epsilon``.

``delta_prime``: the delta' of advanced composition. None (default) tries delta' = f * target_delta for f in
``DELTA_PRIME_FRACTIONS`` and reports the smallest epsilon (each split is a valid guarantee at the same total
delta); a float fixes delta' (it must be smaller than the target delta).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import NeighboringRelation

from tfdpbnn._validation import check_open_unit
from tfdpbnn.privacy._base import EventAccountant
from tfdpbnn.privacy.gdp import gdp_epsilon

DELTA_PRIME_FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def amplify(epsilon: float, delta: float, sample_rate: float) -> tuple[float, float]:
    """Poisson-subsampling amplification (Li, Qardaji & Su 2012, Theorem 1).

    ``log(1 + q (e^eps - 1))``, written ``eps + log(q + (1 - q) e^-eps)`` for a large ``eps`` (the first form
    overflows past eps = 709; a weak mechanism is amplified to about ``eps + log q``).
    """
    if epsilon <= 1.0:
        return math.log1p(sample_rate * math.expm1(epsilon)), sample_rate * delta
    return epsilon + math.log(sample_rate + (1.0 - sample_rate) * math.exp(-epsilon)), sample_rate * delta


def advanced_composition(epsilons: np.ndarray, counts: np.ndarray, delta_prime: float) -> float:
    """Epsilon of composing counts[i] copies of epsilons[i]-DP steps (Dwork & Roth 2014, Thm. 3.20)."""
    advanced = (math.sqrt(2.0 * math.log(1.0 / delta_prime) * float(np.sum(counts * epsilons ** 2)))
                + float(np.sum(counts * epsilons * np.expm1(epsilons))))
    return min(advanced, float(np.sum(counts * epsilons)))


class AdvancedCompositionAccountant(EventAccountant):
    """Ermis & Cemgil's (2017a) DPVD-AC analysis: Gaussian (eps0, delta0), amplification, Thm. 3.20.

    Amplification by subsampling: Li, Qardaji & Su (2012); Thm. 3.20: Dwork & Roth's (2014) advanced
    composition.

    Args:
      neighboring_relation: add/remove (default) or replace-one (Gaussian events only).
      delta_prime: advanced composition's delta'; None optimizes it over ``DELTA_PRIME_FRACTIONS`` of the
        target delta, a float in (0, 1) fixes it.
    The target delta is split as delta' plus an equal share per step.
    """

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE,
                 delta_prime: float | None = None):
        super().__init__(neighboring_relation)
        if delta_prime is not None:
            check_open_unit("delta_prime", delta_prime)
        self.delta_prime = delta_prime
        self._blocks: list[tuple[float, float, int]] = []  # (sample rate, noise multiplier, steps)

    def _add_gaussian(self, sigma: float, count: int) -> None:
        self._blocks.append((1.0, sigma, count))

    def _add_poisson_gaussian(self, q: float, sigma: float, count: int) -> None:
        self._blocks.append((q, sigma, count))

    def _epsilon_at_split(self, target_delta: float, delta_prime: float) -> float:
        counts = np.array([b[2] for b in self._blocks], dtype=np.float64)
        delta_step = (target_delta - delta_prime) / float(np.sum(counts))
        eps = []
        for q, sigma, _ in self._blocks:
            delta0 = delta_step / q
            if delta0 >= 1.0:
                eps.append(0.0)
                continue
            # The Gaussian mechanism with noise multiplier s is exactly (1/s)-GDP (Balle & Wang's curve).
            eps.append(amplify(gdp_epsilon(1.0 / sigma, delta0), delta0, q)[0])
        return advanced_composition(np.array(eps), counts, delta_prime)

    def _epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` (a guaranteed upper bound)."""
        if self.delta_prime is not None:
            if self.delta_prime >= target_delta:
                raise ValueError(f"target_delta must be larger than delta_prime={self.delta_prime:g} "
                                 f"(allowed range ({self.delta_prime:g}, 1)); got {target_delta!r}")
            return self._epsilon_at_split(target_delta, self.delta_prime)
        return min(self._epsilon_at_split(target_delta, f * target_delta) for f in DELTA_PRIME_FRACTIONS)

    def _delta(self, target_epsilon: float) -> float:
        """Smallest delta (1e-6 relative) with epsilon <= ``target_epsilon``, by bisection on log delta."""
        lo = math.log(self.delta_prime) if self.delta_prime is not None else math.log(1e-300)
        hi = math.log1p(-1e-12)
        if self.get_epsilon(math.exp(hi)) > target_epsilon:
            return 1.0
        for _ in range(200):
            if hi - lo < 1e-6:
                break
            mid = 0.5 * (lo + hi)
            above_prime = math.exp(mid) > (self.delta_prime or 0.0)
            if above_prime and self.get_epsilon(math.exp(mid)) <= target_epsilon:
                hi = mid
            else:
                lo = mid
        return float(math.exp(hi))
