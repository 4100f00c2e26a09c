"""Vectorized Renyi-DP to (epsilon, delta) conversion (Canonne, Kamath & Steinke 2020, Prop. 12).

The same bound dp-accounting's RDP accountant uses: an (alpha, r)-RDP mechanism is (epsilon, delta)-DP with
epsilon = r + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1); the delta form inverts it.
Shared by the zCDP accountant (where r = rho * alpha) and the benchmarks. Also the Renyi orders of the
RDP curves of a private search (``ORDERS``) and their conversion (``curve_epsilon``), read by the search
(``tfdpbnn.tuning.bounds``) and by the record of a searched model (``tfdpbnn.record.other_releases``).
"""

from __future__ import annotations

import dp_accounting
import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from tfdpbnn._validation import check_open_unit

#: Renyi orders on which every curve of a private search is evaluated (dp-accounting's default grid).
ORDERS = np.asarray(DEFAULT_RDP_ORDERS, dtype=np.float64)


def check_curve(orders, rdp):
    """``(orders, rdp)`` as float64 arrays; refused unless 1-D, of one length, orders > 1, rdp >= 0."""
    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    if orders.ndim != 1 or orders.shape != rdp.shape or orders.size == 0:
        raise ValueError(f"orders and rdp must be 1-D arrays of the same non-zero length; got shapes "
                         f"{orders.shape} and {rdp.shape}")
    if np.any(orders <= 1):
        raise ValueError(f"orders must all be > 1; got min {orders.min()}")
    if np.any(np.isnan(rdp)) or np.any(rdp < 0):
        raise ValueError("rdp must be >= 0 (inf allowed) at every order")
    return orders, rdp


def curve_epsilon(orders, rdp, delta: float) -> float:
    """(epsilon, delta)-DP of an RDP curve (dp-accounting's conversion, Canonne, Kamath & Steinke 2020)."""
    orders, rdp = check_curve(orders, rdp)
    check_open_unit("delta", delta)
    return rdp_epsilon(orders, rdp, delta)


def rdp_epsilon(orders, rdp, delta: float) -> float:
    """``dp_accounting.rdp.compute_epsilon(orders, rdp, delta)[0]``, the same bound computed on arrays.

    dp-accounting's conversion (Canonne, Kamath & Steinke 2020, Prop. 12) loops over the orders in Python
    (about 0.3 ms for its 156 default orders); here each order's epsilon is the same expression with the same
    cases: 0 where ``delta**2 + expm1(-rdp) > 0`` (the KL bound), the Prop. 12 bound for orders above 1.01,
    else infinite; the smallest, at least 0. Inputs dp-accounting refuses (delta <= 0, orders below 1,
    negative rdp, unequal lengths) go to it, and it raises or answers as it does.
    """
    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    if (not delta > 0 or orders.shape != rdp.shape or orders.ndim != 1 or orders.size == 0
            or np.any(orders < 1) or np.any(rdp < 0) or np.any(np.isnan(rdp))):
        return float(dp_accounting.rdp.compute_epsilon(orders, rdp, delta)[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bound = rdp + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0)
        eps = np.where(delta ** 2 + np.expm1(-rdp) > 0, 0.0, np.where(orders > 1.01, bound, np.inf))
    return float(max(0.0, eps[int(np.argmin(eps))]))


def conversion_terms(orders, delta: float) -> tuple | None:
    """What ``rdp_epsilon`` computes from the orders and ``delta`` alone, for ``rdp_epsilon_with``.

    ``(offset, shift, delta ** 2)``: per order alpha, ``log1p(-1 / alpha)`` and ``log(delta alpha) / (alpha -
    1)`` where alpha > 1.01, and 0 and -inf elsewhere, so that ``rdp + offset - shift`` is Prop. 12's bound
    above 1.01 (the same floats, summed in the same order as ``rdp_epsilon``) and infinite at and below it
    (``rdp_epsilon``'s other case). Read-only arrays. None for the inputs ``rdp_epsilon`` hands to
    dp-accounting (delta <= 0, an order below 1, no orders).
    """
    orders = np.asarray(orders, dtype=np.float64)
    if not delta > 0 or orders.ndim != 1 or orders.size == 0 or np.any(orders < 1):
        return None
    above = orders > 1.01
    with np.errstate(divide="ignore", invalid="ignore"):
        offset = np.where(above, np.log1p(-1.0 / orders), 0.0)
        shift = np.where(above, np.log(delta * orders) / (orders - 1.0), -np.inf)
    offset.setflags(write=False)
    shift.setflags(write=False)
    return offset, shift, float(delta) ** 2


def rdp_epsilon_with(terms, orders, rdp, delta: float) -> float:
    """``rdp_epsilon(orders, rdp, delta)`` from ``terms = conversion_terms(orders, delta)``: the same value.

    Half the array operations (the terms of the orders and ``delta`` are computed once, and the orders'
    checks with them): the ledger converts an RDP curve at every epoch end. ``delta**2 + expm1(-rdp) > 0``
    is tested as ``expm1(-rdp) > -delta**2`` (the same comparison: a rounded sum has the sign of the exact
    one). A curve ``rdp_epsilon`` would hand to dp-accounting (a negative or NaN value, another length) and
    ``terms`` None go to ``rdp_epsilon``.
    """
    rdp = np.asarray(rdp, dtype=np.float64)
    if terms is None or rdp.shape != terms[0].shape or not (rdp >= 0).all():
        return rdp_epsilon(orders, rdp, delta)
    offset, shift, delta_squared = terms
    with np.errstate(over="ignore", invalid="ignore"):
        eps = rdp + offset - shift
        eps[np.expm1(-rdp) > -delta_squared] = 0.0
    return float(max(0.0, eps.min()))


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
