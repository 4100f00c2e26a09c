"""The step audit (tfdpbnn.audit.step_audit) for every method: the honest step passes and audits to at least
0.8x its claimed mu; every mechanism mutation (tfdpbnn.audit.mutations) is flagged.

Seeded; each audit's decision has error probability <= 0.001 (honest flagged) and its stated power against
1.5x (>= 0.99 here, from the noncentral t), so a seeded failure is a real change, not chance.
"""

import pytest

from tfdpbnn import _audit_hook
from tfdpbnn.audit import mutations
from tfdpbnn.audit.step import METHODS, step_audit

# Not in the fast tier (./scripts/test --fast): thousands of audited steps for every method.
pytestmark = pytest.mark.slow

RUNS = 4000  # pairs: power against 1.5x at claim epsilon 1 is 0.99 (asserted below)
# One mutation per method, so that every mutation runs through more than one method's optimizer.
MUTATION_FOR = {"dpsgd": "noise-2/3", "dpadam": "clip-1.5x", "dpvd": "noise-2/3", "dpsgld": "double-count",
                "sidp-ln": "unclipped-layer", "sidp-bn": "clip-1.5x", "dpbbp": "reused-seed",
                "dpmcdropout": "double-count"}


@pytest.mark.parametrize("method", METHODS)
def test_honest_passes_and_mutation_is_flagged(method):
    honest = step_audit(method, 1.0, runs=RUNS, seed=1)
    assert not honest.flagged
    assert honest.claimed_epsilon == pytest.approx(1.0, rel=0.02)  # sqrt(T)/sigma-GDP vs the PLD calibration
    assert honest.power_1_5x > 0.99
    assert honest.mu_lower <= honest.claimed_mu < honest.mu_hat + 0.1  # estimate sd about 0.022
    broken = step_audit(method, 1.0, runs=RUNS, seed=1, broken=MUTATION_FOR[method])
    assert broken.flagged
    assert _audit_hook.INJECTED is None  # the injection ended with the audit


@pytest.mark.parametrize("broken", sorted(mutations.STEP_MUTATIONS))
def test_every_mutation_is_flagged_at_claim_1(broken):
    assert step_audit("dpsgd", 1.0, runs=RUNS, seed=2, broken=broken).flagged


@pytest.mark.parametrize("epsilon", [2.0, 4.0])
def test_noise_two_thirds_is_flagged_at_claims_2_and_4(epsilon):
    assert not step_audit("dpsgd", epsilon, runs=RUNS, seed=3).flagged
    assert step_audit("dpsgd", epsilon, runs=RUNS, seed=3, broken="noise-2/3").flagged


def test_honest_step_audits_to_at_least_0_8_of_its_claim():
    # 20000 pairs of 3 full-batch steps: mu_lower / claimed mu about 0.87 (estimate sd 0.01 at mu 0.27).
    r = step_audit("dpvd", 1.0, runs=20000, steps=3, seed=4)
    assert not r.flagged and r.mu_lower >= 0.8 * r.claimed_mu
    assert r.library_epsilon == pytest.approx(1.0, rel=0.02)


def test_injection_is_scoped_and_checked():
    with pytest.raises(ValueError, match="name"), mutations.inject_bug("noise-1/2"):
        pass
    with pytest.raises(ValueError, match="argument"), mutations.inject_bug("unclipped-layer"):
        pass
    with mutations.inject_bug("clip-1.5x"):
        assert _audit_hook.audit_bug("clip-1.5x") == 1.5 and _audit_hook.audit_bug("noise-2/3") is None
    assert _audit_hook.INJECTED is None
