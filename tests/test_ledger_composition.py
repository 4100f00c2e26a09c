"""The ledger's composition shortcuts give the same epsilons as composing every event (dp-accounting)."""

import math

import dp_accounting
import pytest

from tfdpbnn.record.ledger import _epsilon_of, largest_epsilon, merged_event


def _steps(sigma, q, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


def _independent(event, accountant):
    acc = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp"
           else dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4))
    return acc.compose(event).get_epsilon(1e-5)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_merged_event_has_the_epsilon_of_the_events_it_merges(accountant):
    runs = [_steps(4.0, 0.1, 30), _steps(4.0, 0.1, 30), dp_accounting.NoOpDpEvent(), _steps(2.0, 0.05, 10),
            dp_accounting.ComposedDpEvent([_steps(4.0, 0.1, 15), dp_accounting.GaussianDpEvent(20.0)])]
    event = dp_accounting.ComposedDpEvent(runs)
    merged = merged_event(event)
    # three distinct leaves, the repeated one with its total count 30 + 30 + 15
    assert len(merged.events) == 3
    counts = sorted(getattr(e, "count", 1) for e in merged.events)
    assert counts == [1, 10, 75]
    truth = _independent(event, accountant)
    assert _independent(merged, accountant) == pytest.approx(truth, rel=1e-6)
    # the library's value (adaptive PLD) is an upper bound within the discretization's slack
    ours = _epsilon_of(event, 1e-5, accountant, "add_or_remove")
    assert truth * 0.98 <= ours <= truth * 1.02


def test_largest_epsilon_is_the_largest_over_every_composition():
    base = [_steps(4.0, 0.1, 30)]
    compositions = [base, base + [_steps(4.0, 0.1, 30)], base + [_steps(1.0, 0.02, 5)],
                    [_steps(8.0, 0.2, 100)], base + [_steps(4.0, 0.1, 30), _steps(1.0, 0.02, 5)], []]
    for accountant in ("rdp", "pld"):
        brute = max(min(_epsilon_of(dp_accounting.ComposedDpEvent(c), 1e-5, accountant, "add_or_remove"),
                        _epsilon_of(dp_accounting.ComposedDpEvent(c), 1e-5, "rdp", "add_or_remove"))
                    for c in compositions)
        value = largest_epsilon(compositions, 1e-5, accountant, lambda i: "add_or_remove")
        assert value == pytest.approx(brute, rel=1e-9)
        # and an upper bound for the independent computation of the worst composition
        assert value >= 0.98 * max(_independent(dp_accounting.ComposedDpEvent(c), accountant)
                                   for c in compositions if c)
    assert largest_epsilon([], 1e-5, "pld", lambda i: "add_or_remove") is None
    non_private = [base, [dp_accounting.NonPrivateDpEvent()]]
    assert math.isinf(largest_epsilon(non_private, 1e-5, "pld", lambda i: "add_or_remove"))
