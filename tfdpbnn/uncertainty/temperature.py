"""Temperature scaling of predictive probabilities (Guo et al. 2017, sec. 4.2), fit publicly or privately.

A temperature T > 0 maps predictive probabilities p (e.g. ``mc_predict(...).mean``) to
    p_T = softmax(log(p) / T),
the same as dividing the logits by T when p is a softmax (binary: sigmoid(logit(p) / T)). T is chosen to
minimize the held-out negative log-likelihood NLL(T) = -sum_i log p_T(y_i | x_i), which is convex in the
inverse temperature tau = 1 / T with per-example derivative
    g_i(tau) = E_{p_tau}[log p] - log p(y_i),
nondecreasing in tau (the variance of log p under p_tau is its second derivative).

* ``fit_temperature``: labelled data that is public (or already spent): minimizes NLL(T) exactly.
* ``fit_temperature_private``: a private held-out split. Each g_i is clipped to [-clip, clip], so
  D(T) = sum_i clip(g_i(1 / T)) is monotone in T with sensitivity ``clip``; a Gaussian noisy bisection of
  log T on the sign of D (``tfdpbnn.record.private_release``) finds its root, at a privacy cost that is
  a dp-accounting event composable with training's. With ``null_zone=z`` the first query is D(1) itself,
  a private test of miscalibration: if |D(1) + noise| < z sigma clip the temperature stays 1 (no scaling)
  and no further query is asked; else the bisection goes on in the half of [low, high] the sign points
  to. A model already calibrated has D(1) near 0 (the NLL is flat at T = 1), and a noisy temperature
  mostly moves it away from its best T (T = 1 is no bisection result: results are cell midpoints); the
  zone keeps it unscaled with probability about 1 - 2 Phi(-z) (z = 2: 0.95). Its queries are an adaptive
  composition of at most ``steps`` Gaussian queries of sensitivity ``clip``: the same event.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf
from scipy import optimize

from tfdpbnn._validation import check_positive, check_positive_int, check_real
from tfdpbnn.record.private_release import (
    PrivacyCost,
    gaussian_queries,
    noisy_bisection,
    release_relation,
    release_reservation,
)
from tfdpbnn.uncertainty.calibration import _labels, check_probabilities

#: log(p) is taken of max(p, this), so a probability that underflowed to 0 stays finite (float64 tiny).
LOG_FLOOR = float(np.finfo(np.float64).tiny)
#: default search interval for T.
DEFAULT_BOUNDS = (0.05, 20.0)


def scale_probabilities(probs, temperature):
    """softmax(log(probs) / temperature) for [n, C] probabilities (a [n, 1] binary column: [n, 2]).

    Works on numpy arrays and on tensors (in a graph too); returns the same kind.
    """
    if tf.is_tensor(probs):
        logp = tf.math.log(tf.maximum(probs, tf.cast(LOG_FLOOR, probs.dtype)))
        return tf.nn.softmax(logp / tf.cast(temperature, probs.dtype), axis=-1)
    probs = check_probabilities(probs)
    check_positive("temperature", temperature)
    z = np.log(np.maximum(probs, LOG_FLOOR)) / temperature
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class TemperatureScaling:
    """A fitted temperature and what fitting it cost (``privacy``: a ``PrivacyCost``).

    ``apply(probs)`` returns the calibrated probabilities; ``export_saved_model(..., calibration=...)`` stores
    the temperature in the SavedModel and the cost in ``assets/privacy.json``.
    """

    temperature: float
    privacy: PrivacyCost
    num_examples: int
    clip: float | None = None

    def apply(self, probs):
        """``scale_probabilities(probs, self.temperature)``."""
        return scale_probabilities(probs, self.temperature)

    def as_dict(self):
        """JSON-ready record: method, temperature, held-out size, clip and privacy cost."""
        return {"method": "temperature_scaling", "temperature": self.temperature,
                "num_examples": self.num_examples, "clip": self.clip, "privacy": self.privacy.as_dict()}


def _log_probs_and_labels(probs, labels):
    probs = check_probabilities(probs)
    labels = _labels(labels, probs.shape[0], probs.shape[1])
    return np.log(np.maximum(probs, LOG_FLOOR)), labels


def _check_bounds(bounds):
    if not isinstance(bounds, list | tuple) or len(bounds) != 2:
        raise ValueError(f"bounds must be a pair (low, high) of temperatures, got {bounds!r}")
    low = check_positive("bounds[0]", bounds[0])
    high = check_real("bounds[1]", bounds[1], low=low, low_open=True)
    return low, high


def _nll(log_p, labels, temperature):
    z = log_p / temperature
    zmax = z.max(axis=1)
    lse = zmax + np.log(np.exp(z - zmax[:, None]).sum(axis=1))
    return float(np.sum(lse - z[np.arange(len(labels)), labels]))


def per_example_derivatives(log_p, labels, tau):
    """g_i(tau) = E_{softmax(tau log p)}[log p] - log p(y_i), the derivative of NLL_i in tau (docstring)."""
    z = tau * log_p
    z = z - z.max(axis=1, keepdims=True)
    q = np.exp(z)
    q /= q.sum(axis=1, keepdims=True)
    return np.sum(q * log_p, axis=1) - log_p[np.arange(len(labels)), labels]


def fit_temperature(probs, labels, bounds=DEFAULT_BOUNDS):
    """Temperature minimizing the NLL of public labelled ``probs`` (Guo et al. 2017, sec. 4.2); no DP cost.

    ``probs``: [n, C] predictive probabilities (or [n, 1] binary); ``labels``: [n] integers or one-hot.
    Brent's bounded method on log T over ``bounds``. Returns a ``TemperatureScaling``.
    """
    log_p, labels = _log_probs_and_labels(probs, labels)
    low, high = _check_bounds(bounds)
    res = optimize.minimize_scalar(lambda s: _nll(log_p, labels, math.exp(s)), bounds=(math.log(low),
                                   math.log(high)), method="bounded", options={"xatol": 1e-6})
    return TemperatureScaling(temperature=float(math.exp(res.x)), num_examples=len(labels),
                              privacy=PrivacyCost.public("temperature_scaling_public_data"))


def fit_temperature_private(probs, labels, epsilon, delta, steps=8, clip=3.0, bounds=DEFAULT_BOUNDS,
                            accountant="rdp", neighboring=None, seed=None, null_zone=None, *,
                            optimizer=None, composition="sequential", x=None, y=None, record_ids=None,
                            asserted_disjoint=None, asserted_training_records=None, reservation=None):
    """Temperature from a private held-out split by Gaussian noisy bisection, (epsilon, delta)-DP.

    Each of ``steps`` bisection steps on log T releases D(T) = sum_i clip(g_i(1/T), -clip, clip) plus
    Gaussian noise of standard deviation sigma * clip (sensitivity: ``clip`` under add/remove, 2 ``clip``
    under replace-one, which ``calibrate_noise`` accounts for; sigma calibrated for ``steps`` queries by
    ``accountant``), and moves toward the root of D; the result is the final interval's geometric
    midpoint. ``steps`` sets the resolution (log(high/low) / 2^steps in log T) and the number of composed
    queries. Larger ``clip`` biases the root less but needs more noise. The returned
    ``TemperatureScaling.privacy`` holds the ``DpEvent`` (``SelfComposed(Gaussian(sigma / s), steps)``) and
    its epsilon at ``delta`` (at most ``epsilon``).

    ``null_zone``: None (default), or z > 0: keep T = 1 when the first query, D(1) plus its noise, lies
    within +-z sigma ``clip`` (module docstring; ``bounds`` must then hold 1 strictly inside). Its cost is
    the same event (the same ``steps`` queries at most).

    ``seed``: None (default: noise from the operating system's entropy, what a published guarantee needs)
    or a seed for tests and experiments; then the noise is replayable and the release's
    ``privacy.replayable_from`` names the seed (a statement that records it holds no guarantee).

    ``optimizer``: the DP optimizer whose privacy statement records the release, reserved before the
    held-out data is queried (``optimizer.reserve_release``: a per-record budget refuses it first, nothing
    released) and recorded with the result; ``composition``, ``x``/``y`` (the held-out records in the form
    training was given them), ``record_ids``, ``asserted_disjoint`` and ``asserted_training_records`` as
    ``optimizer.record_release`` takes them. With ``optimizer`` the fit must name the records it reads
    (``x``/``y`` or ``record_ids``), so that the per-record ledger charges them, or assert by name that they
    are records the optimizer trained on (``asserted_training_records="why"``, listed under the statement's
    ``asserted_by_user``; the release is then charged to every training record): a fit that does neither
    is refused (``ValueError`` naming ``x``, ``y`` and ``record_ids``) before it reads its data.
    ``reservation``: a reservation made before instead (``release_reservation``).
    ``neighboring``: the adjacency the noise is calibrated to; None: the optimizer's, else "add_or_remove".
    """
    neighboring = release_relation(neighboring, optimizer)
    log_p, labels = _log_probs_and_labels(probs, labels)
    low, high = _check_bounds(bounds)
    clip = check_positive("clip", clip)
    steps = check_positive_int("steps", steps)
    cost = temperature_privacy(epsilon, delta, steps, accountant, neighboring, seed)
    sigma = cost.noise_multiplier
    if null_zone is not None:
        null_zone = check_positive("null_zone", null_zone)
        if not low < 1.0 < high:
            raise ValueError(f"bounds must hold the temperature 1 strictly inside when null_zone is set, got "
                             f"{bounds!r}")
    reserved = release_reservation(cost, optimizer, reservation, composition, x, y, record_ids,
                                   asserted_disjoint, asserted_training_records, records_read=len(labels))
    result = _bisect_temperature(log_p, labels, low, high, clip, steps, sigma, cost, seed, null_zone)
    if reserved is not None:
        reserved.commit(result)
    return result


def temperature_privacy(epsilon, delta, steps=8, accountant="rdp", neighboring="add_or_remove", seed=None):
    """The ``PrivacyCost`` of ``fit_temperature_private`` with these arguments (no data read).

    ``steps`` Gaussian queries calibrated to (``epsilon``, ``delta``) (``gaussian_queries``), marked
    replayable when ``seed`` is given.
    """
    return gaussian_queries(epsilon, delta, steps, "temperature_scaling_gaussian_bisection", accountant,
                            neighboring)[1].with_noise_seed(seed)


def _bisect_temperature(log_p, labels, low, high, clip, steps, sigma, cost, seed, null_zone):
    """``fit_temperature_private``'s noisy bisection on checked arguments."""
    def query(log_t):  # nondecreasing in log T: -D(T)
        return -float(np.sum(np.clip(per_example_derivatives(log_p, labels, math.exp(-log_t)), -clip, clip)))

    lo, hi = math.log(low), math.log(high)
    rng = np.random.default_rng(seed)
    if null_zone is not None:
        noisy = query(0.0) + rng.normal(0.0, sigma * clip)
        if abs(noisy) < null_zone * sigma * clip:
            return TemperatureScaling(temperature=1.0, privacy=cost, num_examples=len(labels), clip=clip)
        lo, hi = (lo, 0.0) if noisy >= 0.0 else (0.0, hi)
        steps -= 1
    if steps:
        lo, hi = noisy_bisection(query, lo, hi, steps, noise_std=sigma * clip, rng=rng)
    return TemperatureScaling(temperature=float(math.exp(0.5 * (lo + hi))), privacy=cost,
                              num_examples=len(labels), clip=clip)
