"""Renyi-DP of private hyperparameter selection (Papernot & Steinke 2022) and of naive composition.

A search runs a randomized algorithm Q (one trial: draw hyperparameters, train with DP, score) K times and
outputs only the best trial. Papernot & Steinke (2022, "Hyperparameter tuning with Renyi differential
privacy", ICLR; arXiv 2110.03620) bound the Renyi DP of the whole search from the RDP of one trial when K
is random:

- K ~ truncated negative binomial D_{eta, gamma} (their Definition 1; eta in (-1, inf), gamma in (0, 1)):
  P[K = k] = (1 - gamma)^k / (gamma^(-eta) - 1) * prod_{l=0}^{k-1} (l + eta) / (l + 1) for k >= 1 (eta != 0),
  P[K = k] = (1 - gamma)^k / (k log(1 / gamma)) (eta = 0, the logarithmic distribution; eta = 1 is the
  geometric distribution). If Q is (lambda, eps)-RDP and (lambda_hat, eps_hat)-RDP, the search is
  (lambda, eps')-RDP with (their Theorem 2)
      eps' = eps + (1 + eta) (1 - 1/lambda_hat) eps_hat + (1 + eta) log(1/gamma) / lambda_hat
             + log(E[K]) / (lambda - 1),
  E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta)) (eta != 0), (1/gamma - 1) / log(1/gamma) (eta = 0).
  We take the best lambda_hat among the orders evaluated.
- K ~ Poisson(mu) (K = 0 outputs nothing): if Q is (lambda, eps)-RDP and (eps_hat, delta_hat)-DP with
  e^eps_hat <= 1 + 1/(lambda - 1), the search is (lambda, eps')-RDP with (their Theorem 6)
      eps' = eps + mu delta_hat + log(mu) / (lambda - 1).
  We take eps_hat = log(1 + 1/(lambda - 1)) and delta_hat from Q's RDP curve (Canonne, Kamath & Steinke
  2020's conversion, dp-accounting's ``compute_delta``).

RDP is non-decreasing in the order, so every curve is finally replaced by its running minimum from the
right (eps'(lambda) <= eps'(lambda') for lambda <= lambda'), as dp-accounting does.

The baseline, naive composition, runs a fixed list of trials and releases all of them: RDP adds up (Mironov
2017, Prop. 1). One trial of a search that draws its hyperparameters from a fixed list is a mixture over the
list with data-independent weights; the Renyi divergence is jointly quasi-convex, so the trial is RDP with
the largest curve of the list (``trial_rdp``).
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

from tfdpbnn._validation import check_open_unit, check_positive
from tfdpbnn.privacy._rdp_conversion import ORDERS, check_curve, curve_epsilon

#: (epsilon, delta)-DP of an RDP curve (``tfdpbnn.privacy._rdp_conversion.curve_epsilon``).
epsilon = curve_epsilon


def _monotone(orders, rdp):
    """Running minimum from the right in order: a valid curve is non-decreasing in lambda."""
    idx = np.argsort(orders)
    out = np.empty_like(rdp)
    out[idx] = np.minimum.accumulate(rdp[idx][::-1])[::-1]
    return out


@dataclasses.dataclass(frozen=True)
class TruncatedNegativeBinomial:
    """The number of trials K ~ D_{eta, gamma} of Papernot & Steinke (2022), Definition 1 (K >= 1).

    ``eta`` in (-1, inf) (0: logarithmic, 1: geometric), ``gamma`` in (0, 1). ``from_mean`` picks gamma
    for a target E[K].
    """

    eta: float
    gamma: float

    def __post_init__(self):
        if not (isinstance(self.eta, int | float) and math.isfinite(self.eta) and self.eta > -1):
            raise ValueError(f"eta must be a finite number > -1; got {self.eta!r}")
        check_open_unit("gamma", self.gamma)

    @classmethod
    def from_mean(cls, mean: float, eta: float = 0.0) -> TruncatedNegativeBinomial:
        """The distribution with shape ``eta`` whose E[K] is ``mean`` (> 1).

        gamma is found by bisection (the mean decreases in gamma).
        """
        check_positive("mean", mean)
        if mean <= 1:
            raise ValueError(f"mean must be > 1 (K >= 1 always; mean 1 needs gamma = 1); got {mean}")
        lo, hi = 1e-12, 1.0 - 1e-12
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if cls(eta, mid).mean() > mean:
                lo = mid
            else:
                hi = mid
        return cls(eta, hi)  # E[K] <= mean

    def mean(self) -> float:
        """E[K] (Papernot & Steinke 2022, Definition 1)."""
        eta, g = self.eta, self.gamma
        if eta == 0:
            return (1.0 / g - 1.0) / math.log(1.0 / g)
        return eta * (1.0 - g) / (g * (1.0 - g ** eta))

    def pmf(self, k: int) -> float:
        """P[K = k] for an integer k >= 1 (0 for k < 1)."""
        if k < 1:
            return 0.0
        eta, g = self.eta, self.gamma
        if eta == 0:
            return (1.0 - g) ** k / (k * math.log(1.0 / g))
        # For -1 < eta < 0 the first factor (l = 0) and gamma^(-eta) - 1 are both negative: the ratio is > 0.
        # |prod_{l<k} (l + eta) / (l + 1)| = |Gamma(k + eta) / (Gamma(eta) Gamma(k + 1))|
        log_prod = math.lgamma(k + eta) - math.lgamma(eta) - math.lgamma(k + 1)
        return math.exp(k * math.log1p(-g) + log_prod - math.log(abs(g ** (-eta) - 1.0)))

    def sample(self, rng: np.random.Generator) -> int:
        """One draw of K (inverse CDF with the ratio p_{k+1} / p_k = (1 - gamma)(k + eta) / (k + 1))."""
        u = rng.uniform()
        k, p = 1, self.pmf(1)
        cumulative = p
        while cumulative < u and k < 10**7:
            p *= (1.0 - self.gamma) * (k + self.eta) / (k + 1)
            k += 1
            cumulative += p
        return k


@dataclasses.dataclass(frozen=True)
class PoissonTrials:
    """The number of trials K ~ Poisson(mu) of Papernot & Steinke (2022), Theorem 6 (K = 0: no output)."""

    mu: float

    def __post_init__(self):
        check_positive("mu", self.mu)

    def mean(self) -> float:
        """E[K] = mu."""
        return float(self.mu)

    def pmf(self, k: int) -> float:
        """P(K = k) = mu^k e^-mu / k! (0 for k < 0)."""
        return 0.0 if k < 0 else math.exp(k * math.log(self.mu) - self.mu - math.lgamma(k + 1))

    def sample(self, rng: np.random.Generator) -> int:
        """One draw of K ~ Poisson(mu) from ``rng``."""
        return int(rng.poisson(self.mu))


def selection_rdp(orders, rdp, distribution) -> np.ndarray:
    """RDP curve of the random-stopping search (best of K runs of one trial whose curve is ``rdp``).

    ``distribution``: ``TruncatedNegativeBinomial`` (Papernot & Steinke 2022, Theorem 2, minimized over
    lambda_hat in ``orders``) or ``PoissonTrials`` (their Theorem 6). Returns eps'(lambda) at ``orders``.
    """
    orders, rdp = check_curve(orders, rdp)
    if isinstance(distribution, TruncatedNegativeBinomial):
        eta, gamma = distribution.eta, distribution.gamma
        # (1 + eta) * min over lambda_hat of [(1 - 1/lambda_hat) eps_hat + log(1/gamma) / lambda_hat]
        hat = (1.0 + eta) * np.min((1.0 - 1.0 / orders) * rdp + math.log(1.0 / gamma) / orders)
        out = rdp + hat + math.log(distribution.mean()) / (orders - 1.0)
    elif isinstance(distribution, PoissonTrials):
        mu = distribution.mu
        out = np.empty_like(rdp)
        for i, lam in enumerate(orders):
            eps_hat = math.log1p(1.0 / (lam - 1.0))  # e^eps_hat = 1 + 1/(lambda - 1), the theorem's limit
            delta_hat, _ = compute_delta(orders, rdp, eps_hat)
            out[i] = rdp[i] + mu * delta_hat + math.log(mu) / (lam - 1.0)
    else:
        raise ValueError("distribution must be a TruncatedNegativeBinomial or PoissonTrials; got "
                         f"{distribution!r}")
    return _monotone(orders, out)


def trial_rdp(curves) -> np.ndarray:
    """RDP of one trial that picks one of several candidates at random, data-independently.

    The largest of their curves at each order (joint quasi-convexity of the Renyi divergence).
    """
    curves = np.asarray(curves, dtype=np.float64)
    if curves.ndim != 2 or curves.shape[0] == 0:
        raise ValueError("curves must be a non-empty 2-D array [candidates, orders]; got shape "
                         f"{curves.shape}")
    return curves.max(axis=0)


def composed_rdp(curves) -> np.ndarray:
    """RDP of releasing every run (naive composition, Mironov 2017 Prop. 1): the sum of the curves."""
    curves = np.asarray(curves, dtype=np.float64)
    if curves.ndim != 2 or curves.shape[0] == 0:
        raise ValueError(f"curves must be a non-empty 2-D array [runs, orders]; got shape {curves.shape}")
    return curves.sum(axis=0)


def training_rdp(noise_multiplier: float, sample_rate: float, steps: int, sampling: str = "poisson",
                 neighboring: str = "add_or_remove", orders=ORDERS) -> np.ndarray:
    """RDP curve of one DP-SGD training run, from dp-accounting's ``RdpAccountant``.

    The run is the event ``tfdpbnn.privacy.dp_sgd_event`` builds.
    """
    from tfdpbnn.privacy.budget import NEIGHBORING, SENSITIVITY, dp_sgd_event

    if neighboring not in NEIGHBORING:
        raise ValueError(f"neighboring must be one of {tuple(NEIGHBORING)}; got {neighboring!r}")
    event = dp_sgd_event(noise_multiplier / SENSITIVITY[neighboring], sample_rate, steps, sampling)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders), neighboring_relation=NEIGHBORING[neighboring])
    acc.compose(event)
    return np.asarray(acc.rdp, dtype=np.float64)


def gaussian_rdp(noise_multiplier: float, orders=ORDERS) -> np.ndarray:
    """RDP of a Gaussian mechanism of sensitivity 1 (e.g. a noisy count): lambda / (2 s^2).

    Mironov (2017), Prop. 7.
    """
    check_positive("noise_multiplier", noise_multiplier)
    return np.asarray(orders, dtype=np.float64) / (2.0 * noise_multiplier ** 2)
