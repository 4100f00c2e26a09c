"""Zero-concentrated DP accountant (Bun & Steinke 2016), sound under Poisson subsampling via truncated CDP.

Gaussian mechanism with noise multiplier s (noise std / L2 sensitivity Delta): rho = Delta^2 / (2 sigma^2)
= 1 / (2 s^2) (Bun & Steinke 2016, Prop. 1.6); composition adds rho (Lemma 1.7).

A Poisson-subsampled Gaussian is NOT rho-zCDP for any finite rho that subsampling would make small,
and approximate DP does not imply zCDP, so Ermis & Cemgil's (2017a, 2017b) "amplify the per-step (epsilon,
delta), then
treat it as a Gaussian's zCDP" shortcut is not a guarantee (docs/soundness.md, finding 2; see
``tfdpbnn.privacy.paper``).
Instead we use truncated CDP (Bun, Dwork, Rothblum & Steinke 2018): a mechanism is (rho, omega)-tCDP when
its Renyi divergence of every order alpha in (1, omega] is at most rho * alpha. For the subsampled Gaussian
we read, for each omega on a grid, rho(omega) = max over grid orders alpha <= omega of eps_RDP(alpha) / alpha,
where eps_RDP is the exact Renyi curve of the Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019,
as computed by dp-accounting).
(rho, omega)-tCDP composes by adding rho at equal omega; a plain Gaussian is (rho, inf)-tCDP. Conversion to
(epsilon, delta) uses the RDP bound of Canonne, Kamath & Steinke 2020 at orders alpha <= omega, and the
classical rho + 2 sqrt(rho log(1/delta)) (Bun & Steinke 2016, Prop. 1.3) where it applies, taking the smaller.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
from dp_accounting import NeighboringRelation

from tfdpbnn.privacy._base import EventAccountant
from tfdpbnn.privacy._rdp_conversion import epsilon_from_rdp, log_delta_from_rdp

# Orders alpha on which the subsampled Gaussian's Renyi curve is evaluated (also the omega grid).
TRUNCATION_ORDERS = np.unique(np.concatenate([
    np.linspace(1.05, 2.0, 20), np.linspace(2.1, 12.0, 100), np.arange(12.5, 64.0, 0.5),
    np.arange(64.0, 256.0, 4.0), np.array([256.0, 320.0, 384.0, 512.0, 768.0, 1024.0])]))
# Dense orders for pure zCDP (omega = inf): the optimal order 1 + sqrt(log(1/delta)/rho) can be large.
_PURE_ORDERS = np.unique(np.concatenate([TRUNCATION_ORDERS, np.geomspace(1024.0, 1e8, 400)]))


#: Integer orders at which dp-accounting's Renyi curve is read: every integer up to 64 and the grid's orders
#: above it (all integers).
_INTEGER_ORDERS = np.unique(np.concatenate([np.arange(2.0, 65.0),
                                            TRUNCATION_ORDERS[TRUNCATION_ORDERS >= 64]]))


#: Fractional orders below this are read from dp-accounting's series too, as its own ``RdpAccountant`` reads
#: its default orders (fractional up to 10.9); above it only the integer orders are read.
_FRACTIONAL_READ_BELOW = 11.0


def subsampled_gaussian_rdp(q: float, sigma: float, count: int) -> np.ndarray:
    """Upper bounds on the Renyi divergence of ``count`` Poisson-subsampled Gaussians at the grid's orders.

    Read from dp-accounting (Mironov, Talwar & Zhang 2019, Sec. 3.3) at integer orders, where its sum has
    positive terms. Its series for fractional orders subtracts nearly equal terms and fails at high orders
    (measured: -59 at orders 52.5 to 63.5 for s = 15, q = 0.5, 100 steps, where the integer orders around
    them give 3.0 to 3.7), so it is read only below ``_FRACTIONAL_READ_BELOW``, the range of
    dp-accounting's own default orders. Every fractional order alpha between integer orders a < alpha < b is
    also bounded by convexity: (alpha - 1) D_alpha is the log of a moment generating function, convex in
    alpha (van Erven & Harremoes 2014, Thm. 11), so it is at most the chord through (a - 1) D_a and
    (b - 1) D_b, with (1 - 1) D_1 = 0 below 2; the smaller of the two bounds is kept. A value that is not
    finite and >= 0 is taken as unknown (inf).
    """
    def read(orders):
        rdp = dp_accounting.rdp.RdpAccountant(orders=list(orders)).compose(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), count).rdp
        rdp = np.asarray(rdp, dtype=float)
        return np.where(np.isfinite(rdp) & (rdp >= 0.0), rdp, np.inf)

    at = read(_INTEGER_ORDERS)
    orders = np.concatenate([[1.0], _INTEGER_ORDERS])
    log_moment = np.concatenate([[0.0], (_INTEGER_ORDERS - 1.0) * at])  # (alpha - 1) D_alpha
    upper = np.searchsorted(orders, TRUNCATION_ORDERS, side="left")  # the first order >= alpha
    lower = np.where(orders[upper] == TRUNCATION_ORDERS, upper, upper - 1)
    span = orders[upper] - orders[lower]
    weight = np.divide(TRUNCATION_ORDERS - orders[lower], span, out=np.zeros_like(span), where=span > 0)
    with np.errstate(invalid="ignore"):  # 0 * inf where alpha is an order of the grid: its own value
        chord = np.where(weight > 0, (1.0 - weight) * log_moment[lower] + weight * log_moment[upper],
                         log_moment[lower])
    bound = chord / (TRUNCATION_ORDERS - 1.0)
    series = (weight > 0) & (TRUNCATION_ORDERS < _FRACTIONAL_READ_BELOW)
    bound[series] = np.minimum(bound[series], read(TRUNCATION_ORDERS[series]))
    return bound


class ZCDPAccountant(EventAccountant):
    """zCDP accountant (Bun & Steinke 2016), truncated CDP for Poisson-subsampled Gaussians (Bun et al. 2018).

    Supports ``GaussianDpEvent`` (rho = 1/(2 s^2), exact zCDP) and ``PoissonSampledDpEvent`` of a Gaussian
    (add/remove adjacency; a sound (rho, omega)-tCDP bound read off the exact Renyi curve), plus their
    compositions. ``get_epsilon`` is a guaranteed upper bound. At each order alpha <= omega its Renyi bound is
    at least the exact one, but its orders start at 1.05 and are denser than dp-accounting's defaults, so it
    can be below dp-accounting's RDP epsilon (measured: 0.046 against 0.103 for 10 steps at q = 0.001,
    s = 3, delta = 1e-5).
    """

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE):
        super().__init__(neighboring_relation)
        self._rho = 0.0
        self._trunc_rho = np.zeros_like(TRUNCATION_ORDERS)
        self._truncated = False

    def _add_gaussian(self, sigma: float, count: int) -> None:
        self._rho += count / (2.0 * sigma * sigma)

    def _add_poisson_gaussian(self, q: float, sigma: float, count: int) -> None:
        if q == 1.0:
            self._add_gaussian(sigma, count)
            return
        rdp = subsampled_gaussian_rdp(q, sigma, count)
        # The Renyi divergence is nondecreasing in the order (Mironov 2017), so the smallest value at any
        # order >= alpha bounds the one at alpha: the curve is replaced by that envelope (inf where unknown).
        rdp = np.minimum.accumulate(rdp[::-1])[::-1]
        self._trunc_rho += np.maximum.accumulate(rdp / TRUNCATION_ORDERS)
        self._truncated = True

    @property
    def rho(self) -> float | None:
        """Total rho of the composed events when they are exactly zCDP (Gaussians only), else None."""
        if self._non_private:
            return math.inf
        return None if self._truncated else self._rho

    @property
    def tcdp_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(omega grid, rho(omega)): the composed events are (rho(omega), omega)-tCDP for every pair."""
        return TRUNCATION_ORDERS.copy(), self._rho + self._trunc_rho

    def _rho_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """Orders and an (omega x alpha) matrix of rho(omega) * alpha, inf where alpha > omega."""
        if not self._truncated:
            return _PURE_ORDERS, (self._rho * _PURE_ORDERS)[None, :]
        rho = self._rho + self._trunc_rho
        mat = rho[:, None] * TRUNCATION_ORDERS[None, :]
        mat[np.triu_indices(len(TRUNCATION_ORDERS), k=1)] = np.inf
        return TRUNCATION_ORDERS, mat

    def _epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta``: min over omega and alpha <= omega of the RDP conversion."""
        orders, mat = self._rho_matrix()
        eps = float(np.min(epsilon_from_rdp(orders[None, :], mat, target_delta)))
        if not self._truncated:  # classical closed form at the exact optimal order (Prop. 1.3)
            eps = min(eps, self._rho + 2.0 * math.sqrt(self._rho * math.log(1.0 / target_delta)))
        return max(eps, 0.0)

    def _delta(self, target_epsilon: float) -> float:
        """Delta at ``target_epsilon``: min over omega and alpha <= omega of the RDP conversion."""
        orders, mat = self._rho_matrix()
        with np.errstate(invalid="ignore"):
            log_delta = float(np.nanmin(log_delta_from_rdp(orders[None, :], mat, target_epsilon)))
        return float(min(1.0, math.exp(min(log_delta, 0.0))))
