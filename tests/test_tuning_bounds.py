"""Papernot & Steinke (2022) bounds against their closed forms and dp-accounting's implementation."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from tfdpbnn.privacy import dp_sgd_event
from tfdpbnn.tuning import bounds
from tfdpbnn.tuning.bounds import PoissonTrials, TruncatedNegativeBinomial

DENSE = np.concatenate([np.linspace(1.01, 10, 900), np.linspace(10.05, 2000, 40000)])


@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 3.0])
def test_tnb_pmf_sums_to_one_and_has_the_papers_mean(eta):
    d = TruncatedNegativeBinomial(eta, 0.1)
    ks = np.arange(1, 3000)
    p = np.array([d.pmf(int(k)) for k in ks])
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    assert (ks * p).sum() == pytest.approx(d.mean(), rel=1e-9)
    # Definition 1's special cases: eta = 1 geometric, eta = 0 logarithmic.
    if eta == 1.0:
        assert p[:5] == pytest.approx([0.1 * 0.9 ** (k - 1) for k in range(1, 6)], rel=1e-12)
    if eta == 0.0:
        assert p[:5] == pytest.approx([0.9 ** k / (k * math.log(10)) for k in range(1, 6)], rel=1e-12)
        assert d.mean() == pytest.approx(9 / math.log(10), rel=1e-12)


@pytest.mark.parametrize("dist", [TruncatedNegativeBinomial(0.0, 0.1), TruncatedNegativeBinomial(-0.5, 0.02),
                                  TruncatedNegativeBinomial.from_mean(4.0, eta=1.0), PoissonTrials(3.0)])
def test_sampled_trial_counts_have_the_stated_mean(dist):
    rng = np.random.default_rng(0)
    k = np.array([dist.sample(rng) for _ in range(4000)])
    # 4000 draws: the sample mean is within 5 standard errors of E[K] (fixed seed).
    assert abs(k.mean() - dist.mean()) < 5 * k.std() / math.sqrt(len(k))
    assert k.min() >= (0 if isinstance(dist, PoissonTrials) else 1)


def test_from_mean_inverts_the_mean():
    for eta in (-0.5, 0.0, 2.0):
        d = TruncatedNegativeBinomial.from_mean(6.0, eta=eta)
        assert d.mean() == pytest.approx(6.0, rel=1e-9) and d.mean() <= 6.0


def _running_min_right(values):
    return np.minimum.accumulate(values[::-1])[::-1]


@pytest.mark.parametrize("eta", [0.0, 1.0, -0.5])
def test_tnb_bound_on_a_gaussian_matches_the_closed_form(eta):
    # Theorem 2 with eps(lambda) = rho lambda: min over lambda_hat of (lambda_hat - 1) rho + L / lambda_hat
    # is 2 sqrt(rho L) - rho at lambda_hat = sqrt(L / rho), L = log(1 / gamma).
    rho, d = 0.01, TruncatedNegativeBinomial(eta, 0.05)
    ours = bounds.selection_rdp(DENSE, rho * DENSE, d)
    closed = rho * DENSE + (1 + eta) * (2 * math.sqrt(rho * math.log(20)) - rho) \
        + math.log(d.mean()) / (DENSE - 1)
    closed = _running_min_right(closed)  # RDP is non-decreasing in the order
    assert np.all(ours >= closed - 1e-12)  # a grid minimum is never below the continuous one
    assert np.max(ours - closed) < 1e-5


def test_tnb_bound_on_pure_dp_matches_the_closed_form():
    # eps-DP is (lambda, eps)-RDP at every order; with L = log(1/gamma) > eps the best lambda_hat is the
    # largest order Lam, so eps' = eps + (1 + eta) (eps + (L - eps) / Lam) + log(E[K]) / (lambda - 1), which
    # tends to the paper's (2 + eta) eps + log(E[K]) / (lambda - 1) as Lam grows.
    eps, d = 0.5, TruncatedNegativeBinomial(0.5, 0.1)
    orders = bounds.ORDERS
    lam_max = orders.max()
    closed = eps + 1.5 * (eps + (math.log(10) - eps) / lam_max) + math.log(d.mean()) / (orders - 1)
    ours = bounds.selection_rdp(orders, np.full_like(orders, eps), d)
    np.testing.assert_allclose(ours, _running_min_right(closed), rtol=1e-12)


def _subsampled_gaussian():
    event = dp_sgd_event(3.0, 0.1, 50)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(bounds.ORDERS))
    acc.compose(event)
    return event, np.asarray(acc.rdp)


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_tnb_bound_agrees_with_dp_accounting(eta):
    event, rdp = _subsampled_gaussian()
    d = TruncatedNegativeBinomial.from_mean(5.0, eta=eta)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(bounds.ORDERS))
    acc.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(event, d.mean(), eta))
    np.testing.assert_allclose(bounds.selection_rdp(bounds.ORDERS, rdp, d), acc.rdp, rtol=1e-6)


def test_poisson_bound_agrees_with_dp_accounting_theorem_6():
    event, rdp = _subsampled_gaussian()
    acc = dp_accounting.rdp.RdpAccountant(orders=list(bounds.ORDERS))
    acc.compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(event, 4.0, math.inf))
    theirs = np.asarray(acc.rdp)
    ours = bounds.selection_rdp(bounds.ORDERS, rdp, PoissonTrials(4.0))
    # eps + mu delta_hat + log(mu) / (lambda - 1) at each order; ours also takes the running minimum.
    np.testing.assert_allclose(ours, _running_min_right(theirs), rtol=1e-9)
    assert bounds.epsilon(bounds.ORDERS, ours, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_selection_and_composition_exceed_one_trial():
    _, rdp = _subsampled_gaussian()
    one = bounds.epsilon(bounds.ORDERS, rdp, 1e-5)
    for d in (TruncatedNegativeBinomial.from_mean(2.0), PoissonTrials(2.0)):
        assert bounds.epsilon(bounds.ORDERS, bounds.selection_rdp(bounds.ORDERS, rdp, d), 1e-5) > one
    assert bounds.epsilon(bounds.ORDERS, bounds.composed_rdp([rdp, rdp]), 1e-5) > one
    np.testing.assert_allclose(bounds.trial_rdp([rdp, 2 * rdp]), 2 * rdp)


@pytest.mark.parametrize("kwargs,name", [(dict(eta=-1.0, gamma=0.5), "eta"),
                                         (dict(eta=0.0, gamma=1.0), "gamma")])
def test_bad_distribution_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TruncatedNegativeBinomial(**kwargs)


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="orders"):
        bounds.selection_rdp([1.0, 2.0], [0.1, 0.2], PoissonTrials(1.0))
    with pytest.raises(ValueError, match="distribution"):
        bounds.selection_rdp([2.0], [0.1], "geometric")
    with pytest.raises(ValueError, match="mu"):
        PoissonTrials(0.0)
