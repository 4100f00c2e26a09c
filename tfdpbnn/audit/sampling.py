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
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from tfdpbnn._validation import check_open_unit, check_positive_int, check_sample_rate

#: Deliberately broken pipelines the sampling audit must flag: name -> what it does.
SAMPLING_MUTATIONS = {
    "sample-rate-1.5x": "Poisson batches at 1.5 q while q is declared",
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


def audit_participation(batches, num_examples, sample_rate, alpha=1e-3) -> SamplingAuditResult:
    """Test the batches a pipeline yielded (each an array of example ids) against Poisson sampling at q."""
    n = check_positive_int("num_examples", num_examples)
    q = check_sample_rate("sample_rate", sample_rate)
    alpha = check_open_unit("alpha", alpha)
    batches = [np.asarray(b, dtype=np.int64).ravel() for b in batches]
    t = len(batches)
    if t < 1:
        raise ValueError("batches: the pipeline yielded none")
    ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"batches: example ids must lie in [0, {n}), got {ids.min()}..{ids.max()}")
    counts = np.bincount(ids, minlength=n)
    sizes = np.array([b.size for b in batches])
    total = int(ids.size)
    lo, hi = _total_acceptance(n * t, q, alpha / 3)
    p_total = float(min(1.0, 2 * min(stats.binom.cdf(total, n * t, q), stats.binom.sf(total - 1, n * t, q))))
    p_counts = _chi_square(counts, lambda k: stats.binom.pmf(k, t, q), t)
    p_sizes = _chi_square(sizes, lambda k: stats.binom.pmf(k, n, q), n)
    flagged = bool(not lo <= total <= hi or min(p_counts, p_sizes) < alpha / 3)
    return SamplingAuditResult(
        num_examples=n, steps=t, sample_rate=q, participations=total, expected_participations=n * t * q,
        p_total=p_total, p_counts=p_counts, p_batch_sizes=p_sizes, flagged=flagged,
        power_1_5x=rate_test_power(n, t, q, 1.5, alpha), alpha=alpha)


def sampling_audit(num_examples=2000, sample_rate=0.01, steps=300, broken=None, seed=0,
                   alpha=1e-3) -> SamplingAuditResult:
    """Audit ``tfdpbnn.data.poisson_batches`` (or a ``SAMPLING_MUTATIONS`` pipeline) declared at q.

    Runs ``steps`` batches of the pipeline over ids 0..n-1 (a fixed debugging seed, so the audit repeats)
    and returns ``audit_participation`` of what it yielded.
    """
    import tensorflow as tf

    from tfdpbnn.data import poisson_batches

    n = check_positive_int("num_examples", num_examples)
    q = check_sample_rate("sample_rate", sample_rate)
    steps = check_positive_int("steps", steps)
    if broken is not None and broken not in SAMPLING_MUTATIONS:
        raise ValueError(f"broken must be None or one of {sorted(SAMPLING_MUTATIONS)}, got {broken!r}")
    ids = np.arange(n, dtype=np.int64)
    if broken == "fixed-batches":
        size = max(1, int(round(q * n)))
        data = tf.data.Dataset.from_tensor_slices(ids).shuffle(n, seed=seed).batch(size, drop_remainder=True)
        data = data.repeat()
    else:
        rate = min(1.0, 1.5 * q) if broken == "sample-rate-1.5x" else q
        data = poisson_batches(ids, sample_rate=rate, steps_per_epoch=steps, seed=seed, debug_fixed_seed=True)
    batches = [b.numpy() for b in data.take(steps)]
    return audit_participation(batches, n, q, alpha)


__all__ = ["SAMPLING_MUTATIONS", "SamplingAuditResult", "audit_participation", "rate_test_power",
           "sampling_audit"]
