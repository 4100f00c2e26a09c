"""The sampling audit (tfdpbnn.audit.sampling): poisson_batches and the replicas' shards pass; a 1.5x rate
injected into them, an example placed in two replicas' shards, and fixed-size batches declared as Poisson are
flagged; the stated powers match the exact binomial law and a simulation."""

import numpy as np
import pytest
from scipy import stats

from tfdpbnn.audit.sampling import audit_participation, rate_test_power, sampling_audit

# Not in the fast tier (./scripts/test --fast): simulated sampling audits.
pytestmark = pytest.mark.slow


def test_poisson_batches_pass():
    r = sampling_audit(num_examples=2000, sample_rate=0.01, steps=300, seed=0)
    assert not r.flagged
    assert r.power_1_5x > 0.999  # 6000 expected participations against 9000


@pytest.mark.parametrize("broken", ["sample-rate-1.5x", "fixed-batches"])
def test_broken_pipelines_are_flagged(broken):
    assert sampling_audit(num_examples=2000, sample_rate=0.01, steps=300, broken=broken, seed=0).flagged


@pytest.mark.parametrize("replicas", [2, 3])
def test_replica_shards_pass_and_their_mutations_are_flagged(replicas):
    honest = sampling_audit(num_examples=600, sample_rate=0.05, steps=100, seed=1, replicas=replicas)
    assert not honest.flagged and honest.replicas == replicas
    assert honest.in_two_batches_of_a_step == 0 and honest.on_two_replicas == 0
    assert honest.power_shard_overlap == pytest.approx((1 - 0.95 ** 100) ** 2)
    overlap = sampling_audit(num_examples=600, sample_rate=0.05, steps=100, seed=1, replicas=replicas,
                             broken="shard-overlap")
    assert overlap.flagged and overlap.on_two_replicas == 1  # example 0: in shard 0 and in shard 1
    rate = sampling_audit(num_examples=600, sample_rate=0.05, steps=100, seed=1, replicas=replicas,
                          broken="sample-rate-1.5x")
    assert rate.flagged and rate.participations > 1.3 * rate.expected_participations
    # The injection ended with the audit: the same pipeline is honest again.
    again = sampling_audit(num_examples=600, sample_rate=0.05, steps=100, seed=1, replicas=replicas)
    assert not again.flagged


def test_an_example_twice_in_one_step_is_flagged_however_rare():
    # Honest Poisson batches except one step where example 3 reaches two replicas: flagged outright.
    rng = np.random.default_rng(2)
    n, q = 200, 0.05
    steps = [[np.flatnonzero((rng.random(n) < q) & (np.arange(n) % 2 == r)) for r in range(2)]
             for _ in range(50)]
    assert not audit_participation(steps, n, q).flagged
    steps[7] = [np.union1d(steps[7][0], [3]), np.union1d(steps[7][1], [3])]
    r = audit_participation(steps, n, q)
    assert r.flagged and r.in_two_batches_of_a_step == 1


def test_shard_overlap_needs_replicas():
    with pytest.raises(ValueError, match="replicas"):
        sampling_audit(broken="shard-overlap")


def test_honest_simulated_batches_are_flagged_rarely():
    # 200 simulated Poisson pipelines (numpy): flagged ones ~ Binomial(200, <= alpha) with alpha = 0.05.
    rng = np.random.default_rng(0)
    n, q, steps = 300, 0.05, 60
    flagged = 0
    for _ in range(200):
        batches = [np.flatnonzero(rng.random(n) < q) for _ in range(steps)]
        flagged += audit_participation(batches, n, q, alpha=0.05).flagged
    assert stats.binomtest(flagged, 200, 0.05, alternative="greater").pvalue > 1e-3


def test_power_matches_simulation():
    # A small audit where 1.5x is caught only sometimes: the stated power vs 300 simulated 1.5x pipelines.
    rng = np.random.default_rng(1)
    n, q, steps, alpha = 50, 0.02, 20, 0.05
    power = rate_test_power(n, steps, q, 1.5, alpha)
    assert 0.2 < power < 0.9
    hits = 0
    for _ in range(300):
        batches = [np.flatnonzero(rng.random(n) < 1.5 * q) for _ in range(steps)]
        r = audit_participation(batches, n, q, alpha=alpha)
        lo, hi = stats.binom.ppf(alpha / 6, n * steps, q), stats.binom.isf(alpha / 6, n * steps, q)
        hits += not lo <= r.participations <= hi  # the participation-total test alone
    assert stats.binomtest(hits, 300, power).pvalue > 1e-3


def test_ids_out_of_range_are_refused():
    with pytest.raises(ValueError, match="batches"):
        audit_participation([np.array([0, 5])], 5, 0.1)
