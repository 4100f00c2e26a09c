"""Test oracle: the exact privacy profile of the Gaussian mechanism (Balle & Wang 2018, Theorem 8).

Written here from the closed form with ``scipy.stats.norm`` and a plain bisection, independently of the
library's GDP duality (``tfdpbnn.privacy.gdp``, log-space ``log_ndtr`` and Brent's method), so tests that
compare the two can fail.
"""

from __future__ import annotations

import math

from scipy import stats


def gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) for noise multiplier s."""
    s = noise_multiplier
    upper = stats.norm.cdf(0.5 / s - epsilon * s)
    return float(upper - math.exp(epsilon) * stats.norm.cdf(-0.5 / s - epsilon * s))


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """Smallest epsilon with ``gaussian_delta(s, epsilon) <= delta``, by bisection to 1e-13 relative."""
    if gaussian_delta(noise_multiplier, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(noise_multiplier, hi) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-13 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_delta(noise_multiplier, mid) > delta else (lo, mid)
    return hi
