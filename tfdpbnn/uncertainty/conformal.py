"""Split-conformal prediction sets (Vovk et al. 2005), with a differentially private threshold.

Score s(x, y) = 1 - p(y | x) in [0, 1] for predictive probabilities p; prediction set C(x) = {y : s(x, y)
<= q}. With n held-out scores and K = ceil((n + 1)(1 - alpha)), the K-th smallest score as q (q = 1, every
label, when K > n) gives P(Y in C(X)) >= 1 - alpha for a test point exchangeable with the held-out split
(Vovk et al. 2005; Angelopoulos & Bates 2021, sec. 1). ``conformal_threshold`` does this on public data.

Private threshold (``private_conformal_threshold``), after Angelopoulos, Bates, Zrnic & Jordan (2022,
"Private prediction sets"): the quantile is computed with DP and the level is raised so that coverage still
holds. A share ``gamma`` of alpha pays for the noise: alpha' = (1 - gamma) alpha, beta = gamma alpha,
c = 1 - alpha'. The statistic f(b) = N(b) - c (n + 1), N(b) = #{i : s_i <= b}, is nondecreasing in b and
changes by at most 1 when one example is added, removed or replaced (adding one moves N by 0 or 1 and
c (n + 1) by c < 1), so n need not be public. A Gaussian noisy bisection of b over [0, 1]
(``tfdpbnn.record.private_release``; ``steps`` queries, noise std sigma) accepts b (moves left) when
f(b) + noise >= t, with the margin t = sigma * Phi^-1(1 - beta / steps); q is the final right end (1 if
nothing was accepted, the set of all labels).

The bisection runs over a public grid of candidate thresholds b(u), u in [0, 1], nondecreasing in u with
b(1) = 1 (only midpoints u < 1 are queried). ``grid="linear"``: b(u) = u, resolution 2^-steps of the score
scale. ``grid="log"``: b(u) = 1 - LOG_GRID_FLOOR^u for u < 1, i.e. the set keeps the labels with p(y | x)
>= LOG_GRID_FLOOR^u, a bisection of log p; its resolution is 2^-steps of the log10(1 / LOG_GRID_FLOOR)
decades of probability, fine at small probabilities, where the linear grid's top cell (1 - 2^-steps, 1)
holds every label. The proof below uses only that N(b(u)) is nondecreasing in u, so it holds for both
grids.

``private_conformal_level`` computes, from the arguments alone, the score quantile level the threshold
reaches at median noise, c + t / (n + 1): the expected coverage before the grid's rounding. The margin t
grows with ``steps`` (sigma grows about as sqrt(steps) at a fixed epsilon, and Phi^-1(1 - beta / steps)
too) and falls with ``gamma``, while c falls as ``gamma`` rises; the level is smallest at a small gamma
(0.02-0.05 at n = 1,000, epsilon 1, delta 1e-5).

Coverage: a miscovered test point needs s_{n+1} > q, so q < 1. If q < s_(K) (the K-th smallest score;
+inf if K > n), q was accepted with N(q) <= K - 1 < c (n + 1), i.e. f(q) < 0, so that query's noise
exceeded t: probability at most beta by the union bound over the ``steps`` queries. Otherwise
s_{n+1} > q >= s_(K), probability at most 1 - K / (n + 1) <= alpha' by exchangeability. Hence
P(Y not in C(X)) <= alpha' + beta = alpha, over the held-out split, the test point and the noise. The paper
selects the quantile with the exponential mechanism (pure DP); the Gaussian bisection used here has a
dp-accounting event (``SelfComposed(Gaussian)``) that composes with training's under RDP or PLD.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

from tfdpbnn._validation import check_choice, check_positive_int, check_real
from tfdpbnn.record.private_release import (
    PrivacyCost,
    gaussian_queries,
    noisy_bisection,
    release_relation,
    release_reservation,
)
from tfdpbnn.uncertainty.calibration import _labels, check_probabilities


def conformity_scores(probs, labels):
    """s_i = 1 - p(y_i | x_i) for [n, C] probabilities (a [n, 1] binary column: Bernoulli) and [n] labels."""
    probs = check_probabilities(probs)
    labels = _labels(labels, probs.shape[0], probs.shape[1])
    return 1.0 - probs[np.arange(len(labels)), labels]


@dataclasses.dataclass(frozen=True)
class ConformalThreshold:
    """A split-conformal threshold q for level 1 - ``alpha`` and what computing it cost (``privacy``).

    ``predict_sets(probs)`` returns the sets {y : 1 - p(y | x) <= q} as a boolean [n, C] mask.
    """

    threshold: float
    alpha: float
    num_examples: int
    privacy: PrivacyCost
    gamma: float | None = None
    grid: str | None = None

    def predict_sets(self, probs):
        """Boolean [n, C] mask of the prediction sets (C = 2 for a [n, 1] binary column)."""
        return 1.0 - check_probabilities(probs) <= self.threshold

    def as_dict(self):
        """JSON-ready record."""
        return {"method": "split_conformal", "threshold": self.threshold, "alpha": self.alpha,
                "gamma": self.gamma, "grid": self.grid, "num_examples": self.num_examples,
                "privacy": self.privacy.as_dict()}


def _check_alpha(alpha):
    return check_real("alpha", alpha, low=0.0, high=1.0, low_open=True, high_open=True)


def conformal_threshold(probs, labels, alpha=0.1):
    """Split-conformal threshold on public (or already spent) held-out data: the K-th smallest score.

    K = ceil((n + 1)(1 - alpha)); q = 1 (all labels) when K > n. No privacy cost.
    """
    alpha = _check_alpha(alpha)
    scores = np.sort(conformity_scores(probs, labels))
    k = math.ceil((len(scores) + 1) * (1.0 - alpha) - 1e-12)
    threshold = 1.0 if k > len(scores) else float(scores[k - 1])
    return ConformalThreshold(threshold=threshold, alpha=alpha, num_examples=len(scores),
                              privacy=PrivacyCost.public("split_conformal_public_data"))


#: the smallest probability threshold of ``grid="log"``: b(u) = 1 - LOG_GRID_FLOOR^u (module docstring).
LOG_GRID_FLOOR = 1e-6
GRIDS = ("linear", "log")


def _grid_point(u, grid):
    """The candidate threshold b(u) of ``grid`` at u in [0, 1]; b(1) = 1 on both grids."""
    if grid == "linear" or u >= 1.0:
        return float(u)
    return float(1.0 - LOG_GRID_FLOOR ** u)


def _margin(alpha, epsilon, delta, steps, gamma, accountant, neighboring):
    """(sigma, PrivacyCost, margin t = sigma Phi^-1(1 - gamma alpha / steps)) after checking the arguments."""
    sigma, cost = gaussian_queries(epsilon, delta, steps, "split_conformal_gaussian_bisection", accountant,
                                   neighboring)
    return sigma, cost, sigma * float(stats.norm.isf(gamma * alpha / steps))


def private_conformal_level(num_examples, alpha, epsilon, delta, steps=6, gamma=0.1, accountant="rdp",
                            neighboring="add_or_remove"):
    """The score quantile level c + t / (n + 1) a private threshold reaches at median noise (no data read).

    c = 1 - (1 - ``gamma``) ``alpha``; t = sigma Phi^-1(1 - gamma alpha / steps) (module docstring). The
    expected coverage of ``private_conformal_threshold`` on ``num_examples`` held-out examples is about this
    level, plus what the grid's rounding up adds; above 1 the sets hold every label in most draws. Use it
    to choose ``steps`` and ``gamma`` before spending budget (it reads only public sizes).
    """
    alpha = _check_alpha(alpha)
    gamma = check_real("gamma", gamma, low=0.0, high=1.0, low_open=True, high_open=True)
    steps = check_positive_int("steps", steps)
    n = check_positive_int("num_examples", num_examples)
    _, _, margin = _margin(alpha, epsilon, delta, steps, gamma, accountant, neighboring)
    return 1.0 - (1.0 - gamma) * alpha + margin / (n + 1)


def min_calibration_size(alpha, epsilon, delta, steps=6, gamma=0.1, accountant="rdp",
                         neighboring="add_or_remove"):
    """The smallest held-out size n for which ``private_conformal_threshold`` can give informative sets.

    Computed from the arguments alone (no data): the threshold is the first b with N(b) + noise >= c (n + 1)
    + t (module docstring), so with the noise at its median it is the score quantile of level c + t / (n +
    1). Of the miscoverage alpha' = 1 - c left to the scores, the noise margin t = sigma Phi^-1(1 - gamma
    alpha / steps) must leave at least half: t / (n + 1) <= alpha' / 2, i.e. n >= 2 t / alpha' - 1. Below
    it the level exceeds 1 - alpha' / 2 and the sets approach all labels (at n < (t + c) / alpha' even a
    perfect model gets all labels in at least half of the draws). Returns that n (an int).
    """
    alpha = _check_alpha(alpha)
    gamma = check_real("gamma", gamma, low=0.0, high=1.0, low_open=True, high_open=True)
    steps = check_positive_int("steps", steps)
    _, _, margin = _margin(alpha, epsilon, delta, steps, gamma, accountant, neighboring)
    return int(math.ceil(2.0 * margin / ((1.0 - gamma) * alpha) - 1.0 - 1e-9))


def private_conformal_threshold(probs, labels, alpha, epsilon, delta, steps=6, gamma=0.1, accountant="rdp",
                                neighboring=None, seed=None, allow_uninformative=False,
                                grid="linear", *, optimizer=None, composition="sequential", x=None, y=None,
                                record_ids=None, asserted_disjoint=None, asserted_training_records=None,
                                reservation=None):
    """Split-conformal threshold from a private held-out split, (epsilon, delta)-DP (module docstring).

    Coverage >= 1 - ``alpha``; ``steps`` Gaussian queries over the candidate thresholds of ``grid``
    ("linear": resolution 2^-steps of the score scale; "log": 2^-steps of log p, module docstring);
    ``gamma`` in (0, 1): the share of alpha spent on the noise (larger: smaller margin, larger sets from the
    stricter alpha'). The returned ``ConformalThreshold.privacy`` holds the ``DpEvent`` and its epsilon.

    Before any noise is drawn, a held-out split smaller than ``min_calibration_size(alpha, epsilon, delta,
    steps, gamma)`` is refused with ``ValueError`` (the sets would approach all labels: coverage without
    information); ``allow_uninformative=True`` asserts that such sets are wanted anyway. The check treats
    the split's size as public, as the DP optimizers' declared ``num_examples`` is.

    ``seed``: None (default: secret noise from the operating system's entropy) or a seed for tests and
    experiments, which makes the release replayable (``privacy.replayable_from``: no guarantee).

    ``optimizer`` and the record arguments (``composition``, ``x``/``y``, ``record_ids``,
    ``asserted_disjoint``, ``asserted_training_records``), or ``reservation``, and ``neighboring`` (None: the
    optimizer's, else "add_or_remove"): as ``fit_temperature_private``'s (the release is reserved before the
    held-out data is queried, and recorded in the optimizer's statement with the result; with
    ``optimizer``, a fit that neither names its records nor asserts ``asserted_training_records`` is
    refused).
    """
    neighboring = release_relation(neighboring, optimizer)
    alpha = _check_alpha(alpha)
    gamma = check_real("gamma", gamma, low=0.0, high=1.0, low_open=True, high_open=True)
    steps = check_positive_int("steps", steps)
    check_choice("grid", grid, GRIDS)
    if not isinstance(allow_uninformative, bool):
        raise ValueError(f"allow_uninformative must be True or False, got {allow_uninformative!r}")
    scores = conformity_scores(probs, labels)
    n = len(scores)
    sigma, cost, margin = _margin(alpha, epsilon, delta, steps, gamma, accountant, neighboring)
    c = 1.0 - (1.0 - gamma) * alpha
    needed = min_calibration_size(alpha, epsilon, delta, steps, gamma, accountant, neighboring)
    if n < needed and not allow_uninformative:
        raise ValueError(
            f"probs/labels: {n} held-out examples are too few for informative private prediction sets at "
            f"alpha={alpha:g}, epsilon={epsilon:g}, delta={delta:g} (steps={steps}, gamma={gamma:g}): they "
            f"need at least {needed} (the noise margin {margin:.1f} must stay below half of the "
            f"{(1 - c):.3g} (n + 1) scores left out); hold out more examples, raise epsilon or alpha, or "
            "pass allow_uninformative=True to accept sets that approach all labels")
    cost = cost.with_noise_seed(seed)
    reserved = release_reservation(cost, optimizer, reservation, composition, x, y, record_ids,
                                   asserted_disjoint, asserted_training_records, records_read=n)

    def query(u):
        return float(np.sum(scores <= _grid_point(u, grid))) - c * (n + 1)

    _, hi = noisy_bisection(query, 0.0, 1.0, steps, noise_std=sigma, margin=margin, rng=seed)
    result = ConformalThreshold(threshold=_grid_point(hi, grid), alpha=alpha, num_examples=n, privacy=cost,
                                gamma=gamma, grid=grid)
    if reserved is not None:
        reserved.commit(result)
    return result


def conformal_privacy(alpha, epsilon, delta, steps=6, gamma=0.1, accountant="rdp",
                      neighboring="add_or_remove", seed=None):
    """The ``PrivacyCost`` of ``private_conformal_threshold`` with these arguments (no data read)."""
    alpha = _check_alpha(alpha)
    gamma = check_real("gamma", gamma, low=0.0, high=1.0, low_open=True, high_open=True)
    steps = check_positive_int("steps", steps)
    return _margin(alpha, epsilon, delta, steps, gamma, accountant, neighboring)[1].with_noise_seed(seed)


def coverage_and_size(sets, labels):
    """(fraction of rows whose set holds the label, mean set size) of a boolean [n, C] mask of sets."""
    sets = np.asarray(sets, dtype=bool)
    if sets.ndim != 2:
        raise ValueError(f"sets: expected a boolean [num_examples, num_classes] mask, got shape {sets.shape}")
    labels = _labels(labels, sets.shape[0], sets.shape[1])
    return float(np.mean(sets[np.arange(len(labels)), labels])), float(np.mean(sets.sum(axis=1)))
