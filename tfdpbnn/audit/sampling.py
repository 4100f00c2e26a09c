"""The sampling audit: do the batches a pipeline feeds the optimizer follow the sampling it declares?

Poisson subsampling (Abadi et al. 2016; Mironov, Talwar & Zhang 2019) means: in each of T steps every one
of n examples joins the batch independently with probability q. Then (1) the total number of participations
S is Binomial(nT, q); (2) each example's count of participations is Binomial(T, q); (3) each batch size is
Binomial(n, q) (this fails for fixed-size batches, which couple the examples). ``sampling_audit`` runs the
pipeline on the example ids 0..n-1 as its features (so each batch says which examples it holds), counts
what it yielded and tests the three laws exactly or by Pearson's chi-square (cells pooled until each
expects >= 5): an equal-tailed exact binomial test of S, chi-square tests of the count and batch-size
histograms. The pipeline is FLAGGED when a p-value is below ``alpha / 3`` (Bonferroni); its power against
a pipeline that samples at ``factor * q`` is stated from the exact law of S under that rate.

Under ``tf.distribute`` (``replicas=R``) the audit reads each replica's batches separately (what
``tfdpbnn.data.distributed_poisson_batches`` feeds replica r at step t) and adds two exact checks of the
invariant that makes their union one Poisson draw: no example is in two replicas' batches of one step (a
participation count of 2 in one step is impossible under Poisson sampling), and no example is drawn by two
replicas in the whole run (the shards are disjoint). Either is flagged outright (it cannot happen in the
honest code, so it costs no false alarms); the power against one example placed in two shards is the
probability that both replicas draw it at least once in T steps, ``(1 - (1 - q)^T)^2``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from tfdpbnn._validation import check_open_unit, check_positive_int, check_sample_rate

#: Deliberately broken pipelines the sampling audit must flag: name -> what it does. The first two are bugs
#: injected into tfdpbnn's own pipelines (``tfdpbnn.audit.inject_bug``); "fixed-batches" is a user's
#: pipeline declared as what it is not.
SAMPLING_MUTATIONS = {
    "sample-rate-1.5x": "poisson_batches (and the replicas' shards) draw at 1.5 q while q is declared",
    "shard-overlap": "one example is placed in two replicas' shards (needs replicas >= 2)",
    "fixed-batches": "shuffled fixed-size batches of q n examples declared as Poisson at q",
}


@dataclasses.dataclass(frozen=True)
class SamplingAuditResult:
    """What the pipeline fed, the three tests' p-values, the decision and the power."""

    num_examples: int
    steps: int
    sample_rate: float
    participations: int
    expected_participations: float
    p_total: float
    p_counts: float
    p_batch_sizes: float
    flagged: bool
    power_1_5x: float
    alpha: float
    replicas: int = 1
    in_two_batches_of_a_step: int = 0
    on_two_replicas: int = 0
    power_shard_overlap: float | None = None

    def as_dict(self) -> dict:
        """The result as a JSON-ready dict."""
        return dataclasses.asdict(self)


def _chi_square(observed_values, pmf, support_max):
    """Pearson's chi-square p-value of integer observations against ``pmf`` on 0..support_max."""
    values = np.asarray(observed_values, dtype=np.int64)
    probs = pmf(np.arange(support_max + 1))
    counts = np.bincount(values, minlength=support_max + 1)[: support_max + 1].astype(float)
    expected = probs * len(values)
    # Pool adjacent cells from both ends until each expects >= 5 (the last cell takes the upper tail).
    cells_obs, cells_exp, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(counts, expected, strict=True):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= 5:
            cells_obs.append(acc_o)
            cells_exp.append(acc_e)
            acc_o = acc_e = 0.0
    if cells_obs:
        cells_obs[-1] += acc_o + (len(values) - counts.sum())
        cells_exp[-1] += acc_e + (len(values) - expected.sum())
    if len(cells_obs) < 2:
        return 1.0
    return float(stats.chisquare(cells_obs, cells_exp).pvalue)


def _total_acceptance(trials, q, level):
    """The equal-tailed acceptance region [lo, hi] of Binomial(trials, q) at total level ``level``."""
    lo = int(stats.binom.ppf(level / 2, trials, q))
    hi = int(stats.binom.isf(level / 2, trials, q))
    return lo, hi


def rate_test_power(num_examples, steps, sample_rate, factor=1.5, alpha=1e-3) -> float:
    """Probability that the participation-total test flags a pipeline sampling at ``factor * q``."""
    trials = int(num_examples) * int(steps)
    lo, hi = _total_acceptance(trials, sample_rate, alpha / 3)
    q = min(1.0, factor * sample_rate)
    return float(stats.binom.cdf(lo - 1, trials, q) + stats.binom.sf(hi, trials, q))


def _per_step(batch):
    """One step's ids: ``(union, per-replica list)`` from an array or a sequence of per-replica arrays."""
    if isinstance(batch, list | tuple):
        parts = [np.asarray(b, dtype=np.int64).ravel() for b in batch]
        return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), parts
    ids = np.asarray(batch, dtype=np.int64).ravel()
    return ids, [ids]


def audit_participation(batches, num_examples, sample_rate, alpha=1e-3) -> SamplingAuditResult:
    """Test the batches a pipeline yielded against Poisson sampling at q.

    ``batches``: one entry per step, either an array of example ids (one device) or a sequence of R arrays,
    the ids each replica received in that step (``tf.distribute``); with R >= 2 the shard checks of the
    module docstring run too.
    """
    n = check_positive_int("num_examples", num_examples)
    q = check_sample_rate("sample_rate", sample_rate)
    alpha = check_open_unit("alpha", alpha)
    steps = [_per_step(b) for b in batches]
    t = len(steps)
    if t < 1:
        raise ValueError("batches: the pipeline yielded none")
    replicas = {len(parts) for _, parts in steps}
    if len(replicas) != 1:
        raise ValueError(f"batches: every step must hold the same number of replicas, got {sorted(replicas)}")
    r = replicas.pop()
    ids = np.concatenate([u for u, _ in steps])
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"batches: example ids must lie in [0, {n}), got {ids.min()}..{ids.max()}")
    counts = np.bincount(ids, minlength=n)
    sizes = np.array([u.size for u, _ in steps])
    total = int(ids.size)
    twice = sum(int(u.size - np.unique(u).size) for u, _ in steps)
    seen_by = np.zeros((r, n), dtype=bool)
    for _, parts in steps:
        for replica, part in enumerate(parts):
            seen_by[replica, part] = True
    two_replicas = int((seen_by.sum(0) > 1).sum())
    lo, hi = _total_acceptance(n * t, q, alpha / 3)
    p_total = float(min(1.0, 2 * min(stats.binom.cdf(total, n * t, q), stats.binom.sf(total - 1, n * t, q))))
    p_counts = _chi_square(counts, lambda k: stats.binom.pmf(k, t, q), t)
    p_sizes = _chi_square(sizes, lambda k: stats.binom.pmf(k, n, q), n)
    flagged = bool(not lo <= total <= hi or min(p_counts, p_sizes) < alpha / 3 or twice or two_replicas)
    return SamplingAuditResult(
        num_examples=n, steps=t, sample_rate=q, participations=total, expected_participations=n * t * q,
        p_total=p_total, p_counts=p_counts, p_batch_sizes=p_sizes, flagged=flagged,
        power_1_5x=rate_test_power(n, t, q, 1.5, alpha), alpha=alpha, replicas=r,
        in_two_batches_of_a_step=twice, on_two_replicas=two_replicas,
        power_shard_overlap=float((1 - (1 - q) ** t) ** 2) if r > 1 else None)


def sampling_audit(num_examples=2000, sample_rate=0.01, steps=None, broken=None, seed=0,
                   alpha=1e-3, replicas=1) -> SamplingAuditResult:
    """Audit tfdpbnn's Poisson pipelines (or a broken one, ``SAMPLING_MUTATIONS``) declared at q.

    ``replicas=1``: ``tfdpbnn.data.poisson_batches``; ``replicas=R >= 2``: the R replicas' shards of
    ``tfdpbnn.data.distributed_poisson_batches`` (``tfdpbnn.data.distributed.replica_shard_batches``), each
    replica's batches read separately. Runs ``steps`` batches over ids 0..n-1 (a fixed debugging seed, so
    the audit repeats) and returns ``audit_participation`` of what was drawn. ``broken``: "sample-rate-1.5x"
    and "shard-overlap" are injected into those pipelines with ``tfdpbnn.audit.inject_bug`` (the pipeline
    is built inside the injection); "fixed-batches" replaces the pipeline by shuffled fixed-size batches.
    """
    import contextlib

    import tensorflow as tf

    from tfdpbnn.audit.mutations import inject_bug
    from tfdpbnn.data import poisson_batches
    from tfdpbnn.data.distributed import replica_shard_batches

    n = check_positive_int("num_examples", num_examples)
    q = check_sample_rate("sample_rate", sample_rate)
    replicas = check_positive_int("replicas", replicas)
    steps = check_positive_int("steps", (300 if replicas == 1 else 1000) if steps is None else steps)
    if broken is not None and broken not in SAMPLING_MUTATIONS:
        raise ValueError(f"broken must be None or one of {sorted(SAMPLING_MUTATIONS)}, got {broken!r}")
    if broken == "shard-overlap" and replicas < 2:
        raise ValueError(f"replicas: the shard-overlap mutation needs at least 2 replicas, got {replicas}")
    if broken == "fixed-batches" and replicas > 1:
        raise ValueError("broken: fixed-batches replaces the single-device pipeline; use replicas=1")
    ids = np.arange(n, dtype=np.int64)
    if broken == "fixed-batches":
        size = max(1, int(round(q * n)))
        data = tf.data.Dataset.from_tensor_slices(ids).shuffle(n, seed=seed).batch(size, drop_remainder=True)
        batches = [b.numpy() for b in data.repeat().take(steps)]
        return audit_participation(batches, n, q, alpha)
    with inject_bug(broken) if broken else contextlib.nullcontext():
        if replicas == 1:
            data = poisson_batches(ids, sample_rate=q, steps_per_epoch=steps, seed=seed,
                                   debug_fixed_seed=True)
            batches = [b.numpy() for b in data]
        else:
            shards = replica_shard_batches(ids, replicas, q, steps, seed=seed, debug_fixed_seed=True)
            batches = [[b.numpy() for b in step] for step in tf.data.Dataset.zip(tuple(shards))]
    return audit_participation(batches, n, q, alpha)


__all__ = ["SAMPLING_MUTATIONS", "SamplingAuditResult", "audit_participation", "rate_test_power",
           "sampling_audit"]
