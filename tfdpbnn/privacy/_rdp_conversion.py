"""Vectorized Renyi-DP to (epsilon, delta) conversion (Canonne, Kamath & Steinke 2020, Prop. 12).

The same bound dp-accounting's RDP accountant uses: an (alpha, r)-RDP mechanism is (epsilon, delta)-DP with
epsilon = r + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1); the delta form inverts it.
Shared by the zCDP accountant (where r = rho * alpha) and the benchmarks.
"""

from __future__ import annotations

import numpy as np


def epsilon_from_rdp(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """Epsilon at ``delta`` for each (order, rdp) pair, elementwise; orders must be > 1."""
    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    eps = rdp + np.log1p(-1.0 / orders) - (np.log(delta) + np.log(orders)) / (orders - 1.0)
    return np.where(np.isnan(eps), np.inf, eps)


def log_delta_from_rdp(orders: np.ndarray, rdp: np.ndarray, epsilon: float) -> np.ndarray:
    """Log of delta at ``epsilon`` for each (order, rdp) pair, elementwise; orders must be > 1."""
    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    return (orders - 1.0) * (rdp - epsilon + np.log1p(-1.0 / orders)) - np.log(orders)
