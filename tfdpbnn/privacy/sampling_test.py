"""Are the realized batch sizes those of Poisson sampling at rate q? A sequential test, stated error rate.

Under Poisson sampling (each of n examples joins each batch independently with probability q; Abadi et al.
2016, Mironov et al. 2019) the batch sizes b_1..b_T are i.i.d. Binomial(n, q). Two statistics of the
realized sizes are tested, each with a bound that is exact, not asymptotic:

- the total S = sum_t b_t ~ Binomial(nT, q): two-sided exact binomial tail;
- the dispersion D = sum_t (b_t - nq)^2 / (nq(1-q)), which is about T under Poisson sampling, about 0 for
  fixed-size batches of nq, and large for batches of varying, non-binomial size: both tails are bounded by
  Chernoff's inequality with the exact moment generating function of one step's term,
  P(D <= d) <= min_{l>=0} exp(l d) E[exp(-l X)]^T and P(D >= d) <= min_{0<=l<1/2} exp(-l d) E[exp(l X)]^T.

The t-th check (after t steps) rejects when one of the three p-value bounds is below alpha / (3 t (t+1)).
Since sum_t 1 / (t (t+1)) = 1, the probability that a run with real Poisson batches is EVER stopped, however
often it is checked, is at most ``alpha`` (default 1e-6).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import optimize, special, stats

#: Probability that a truly Poisson-sampled run is ever flagged, over its whole length.
DEFAULT_FALSE_ALARM_RATE = 1e-6


@dataclasses.dataclass(frozen=True)
class PoissonTestResult:
    """Outcome of one check: the p-value bounds, the threshold, and whether sampling is rejected."""

    steps: int
    mean_batch_size: float
    expected_batch_size: float
    p_total: float
    p_dispersion_low: float
    p_dispersion_high: float
    threshold: float

    @property
    def rejected(self) -> bool:
        """True when the batches are clearly not Poisson at rate q."""
        return min(self.p_total, self.p_dispersion_low, self.p_dispersion_high) < self.threshold

    def describe(self) -> str:
        """What was observed, for the error message."""
        return (f"{self.steps} steps with mean batch size {self.mean_batch_size:.2f} against the expected "
                f"{self.expected_batch_size:.2f}; p-value bounds: total {self.p_total:.3g}, too-regular "
                f"sizes {self.p_dispersion_low:.3g}, too-variable sizes {self.p_dispersion_high:.3g}, "
                f"threshold {self.threshold:.3g}")


@functools.lru_cache(maxsize=32)
def _terms(n: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(log pmf, X) over b within 40 sd of nq, X = (b - nq)^2 / (nq(1-q)), b ~ Binomial(n, q)."""
    sd = math.sqrt(n * q * (1 - q))
    lo = max(0, math.floor(n * q - 40 * sd - 5))
    hi = min(n, math.ceil(n * q + 40 * sd + 5))
    b = np.arange(lo, hi + 1, dtype=np.float64)
    return stats.binom.logpmf(b, n, q), (b - n * q) ** 2 / (n * q * (1 - q))


def _log_mgf(lam: float, n: int, q: float) -> float:
    """log E[exp(lam X)] for one step's dispersion term X."""
    log_pmf, x = _terms(n, q)
    return float(special.logsumexp(log_pmf + lam * x))


def _chernoff_low(d: float, steps: int, n: int, q: float) -> float:
    """Bound on P(D <= d)."""
    if d >= steps:
        return 1.0

    def log_bound(log_lam):
        lam = math.exp(log_lam)
        return lam * d + steps * _log_mgf(-lam, n, q)

    res = optimize.minimize_scalar(log_bound, bounds=(-12.0, 12.0), method="bounded")
    return float(min(1.0, math.exp(min(0.0, res.fun))))


def _chernoff_high(d: float, steps: int, n: int, q: float) -> float:
    """Bound on P(D >= d)."""
    if d <= steps:
        return 1.0

    def log_bound(lam):
        return -lam * d + steps * _log_mgf(lam, n, q)

    res = optimize.minimize_scalar(log_bound, bounds=(0.0, 0.499), method="bounded")
    return float(min(1.0, math.exp(min(0.0, res.fun))))


def poisson_batch_test(num_examples: int, sample_rate: float, steps: int, total: float,
                       squared_deviation: float, false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
                       ) -> PoissonTestResult:
    """Test realized batch sizes against Binomial(n, q) after ``steps`` steps (module docstring).

    Args:
      num_examples: n.
      sample_rate: q in (0, 1).
      steps: T >= 1, the number of batches seen.
      total: sum of the realized batch sizes.
      squared_deviation: sum over steps of (b_t - n q)^2.
      false_alarm_rate: alpha, the probability over a whole run that real Poisson batches are rejected.
    """
    n, q, steps = int(num_examples), float(sample_rate), int(steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"false_alarm_rate must be in (0, 1), got {false_alarm_rate!r}")
    threshold = false_alarm_rate / (3.0 * steps * (steps + 1))
    mean = total / steps
    if q >= 1.0:  # every example in every batch: the size must be n exactly
        exact = 1.0 if abs(total - n * steps) < 0.5 else 0.0
        return PoissonTestResult(steps, mean, float(n), exact, 1.0, 1.0, threshold)
    total_int = int(round(total))
    big = n * steps
    p_total = min(1.0, 2.0 * min(stats.binom.cdf(total_int, big, q), stats.binom.sf(total_int - 1, big, q)))
    d = float(squared_deviation) / (n * q * (1 - q))
    return PoissonTestResult(steps, mean, n * q, float(p_total), _chernoff_low(d, steps, n, q),
                             _chernoff_high(d, steps, n, q), threshold)


__all__ = ["DEFAULT_FALSE_ALARM_RATE", "PoissonTestResult", "poisson_batch_test"]
