"""Ermis & Cemgil's (2017a, 2017b) own sigma-from-epsilon procedures (Ermis & Cemgil, DPVD / DPD).

NOT privacy guarantees.

Kept only to redraw Ermis & Cemgil's (2017a) Figure 3 beside sound accountants. Do not use them to report
epsilon:

- ``zcdp_noise_multiplier`` (DPVD-zCDP, Ermis & Cemgil (2017a, eqs. 13-14); DPD-zCDP of Ermis & Cemgil
(2017b)): from the total
  (epsilon, delta) it takes rho = (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2 (inverting Bun &
  Steinke Prop. 1.3), splits rho over J compositions, maps each rho/J to a Gaussian's (eps', delta') by the
  classical calibration (Ermis & Cemgil 2017a, Thm. 2), undoes subsampling amplification (Thm. 3) to
  (eps_iter,
  delta_iter) and sets sigma = sqrt(2 log(1.25/delta_iter)) / eps_iter. Why it is not a guarantee
  (docs/soundness.md, finding 2): the subsampled step is only (eps', delta')-DP, and approximate DP does not
  imply zCDP; the
  procedure treats it as a Gaussian's rho-zCDP and drops the per-step delta'. The classical calibration also
  requires eps_iter < 1, which the procedure violates (eps_iter is about 1.8 for MNIST at epsilon 1).
  Ermis & Cemgil (2017a) reports sigma 2.68 for MNIST at epsilon 1 (q = 0.01, 200 epochs); the
  Poisson-subsampled
  Gaussian needs 5.78 for delta 1e-5 by RDP and 5.46 by PLD.
- ``ac_noise_multiplier`` (DPVD-AC, Ermis & Cemgil (2017a) Section 4.1): classical Gaussian calibration per
step,
  Li-Qardaji-Su amplification, Dwork-Roth Thm. 3.20. Its steps are valid only while eps_iter < 1 (classical
  calibration); ``tfdpbnn.privacy.AdvancedCompositionAccountant`` is the sound version (analytic Gaussian).

The papers leave J and delta' unspecified. Our literal reading (J = number of steps) does not reproduce the
reported sigmas (``REPORTED_NOISE``); they are consistent with J = number of epochs, i.e. with composing once
per epoch, which is again not a valid analysis. Both the reading and the reported values are drawn by
``tfdpbnn privacy --plot``.
"""

from __future__ import annotations

import math

from scipy import optimize

from tfdpbnn._validation import check_nonnegative_int, check_open_unit, check_positive, check_sample_rate

# Sigmas the papers report (paper, data set, epsilon) -> {procedure: sigma}; delta = 1e-5 is our assumption.
REPORTED_NOISE = {
    ("000", "MNIST", 1.0): {"zcdp": 2.68, "ac": 8.24},   # q = 0.01, 200 epochs
    ("000", "DIGITS", 1.0): {"zcdp": 2.97, "ac": 9.73},  # q = 0.05, 100 epochs
    ("002", "MNIST", 0.5): {"zcdp": 3.23, "ac": 10.88},  # q = 0.01, 200 epochs
}


def _classical_sigma(epsilon: float, delta: float) -> float:
    """Classical Gaussian calibration sqrt(2 log(1.25/delta)) / epsilon (Ermis & Cemgil 2017a, Thm. 2).

    The calibration is Dwork & Roth's (2014).
    """
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _check(epsilon, delta, sample_rate, steps, compositions):
    check_positive("epsilon", epsilon)
    check_open_unit("delta", delta)
    check_sample_rate("sample_rate", sample_rate)
    check_nonnegative_int("steps", steps)
    check_positive("steps", steps)
    if compositions is not None:
        check_nonnegative_int("compositions", compositions)
        check_positive("compositions", compositions)


def zcdp_noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int,
                          compositions: int | None = None, delta_prime: float | None = None) -> float:
    """Ermis & Cemgil's (2017a) DPVD-zCDP sigma (eqs. 13-14 with Thm. 2, 3).

    NOT a guarantee (module docstring).

    ``compositions`` is the paper's J (default ``steps``); ``delta_prime`` the per-composition delta'
    (default ``delta * sample_rate``, so delta_iter = delta).
    """
    _check(epsilon, delta, sample_rate, steps, compositions)
    j = steps if compositions is None else compositions
    dprime = delta * sample_rate if delta_prime is None else check_open_unit("delta_prime", delta_prime)
    log_inv = math.log(1.0 / delta)
    rho = (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2
    eps_prime = math.sqrt(4.0 * (rho / j) * math.log(1.25 / dprime))  # rho/J = eps'^2 / (4 log(1.25/delta'))
    eps_iter = math.log1p(math.expm1(eps_prime) / sample_rate)       # invert eq. (14)
    delta_iter = min(dprime / sample_rate, 0.5)
    return _classical_sigma(eps_iter, delta_iter)


def ac_epsilon(noise_multiplier: float, delta: float, sample_rate: float, steps: int,
               delta_prime: float | None = None) -> float:
    """Ermis & Cemgil's (2017a) DPVD-AC total epsilon for a sigma (Section 4.1).

    Valid only while eps_iter < 1.
    """
    check_positive("noise_multiplier", noise_multiplier)
    dprime = delta / 2.0 if delta_prime is None else check_open_unit("delta_prime", delta_prime)
    delta_iter = (delta - dprime) / (steps * sample_rate)
    eps_iter = math.sqrt(2.0 * math.log(1.25 / delta_iter)) / noise_multiplier
    eps_step = math.log1p(sample_rate * math.expm1(eps_iter))
    advanced = math.sqrt(2.0 * steps * math.log(1.0 / dprime)) * eps_step
    return advanced + steps * eps_step * math.expm1(eps_step)


def ac_noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int,
                        delta_prime: float | None = None) -> float:
    """Ermis & Cemgil's (2017a) DPVD-AC sigma: root of ``ac_epsilon`` = epsilon (delta' = delta/2).

    NOT a guarantee.
    """
    _check(epsilon, delta, sample_rate, steps, None)
    if delta_prime is not None and delta_prime >= delta:
        raise ValueError(f"delta_prime must be in (0, delta={delta!r}); got {delta_prime!r}")
    f = lambda s: ac_epsilon(s, delta, sample_rate, steps, delta_prime) - epsilon
    hi = 1.0
    while f(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(f, hi / 2.0 if hi > 1.0 else 1e-6, hi, xtol=1e-9))
