"""DP adapt of ``tf.keras.layers.Normalization``: noisy sums of clipped values, their squares and the count.

Each feature is clipped to declared bounds [lo, hi] and mapped to z = (x - m) / r in [-1, 1] (m the
midpoint, r the half-width). The released vector is (sum z, sum z^2, n) over the examples, with one
Gaussian noise draw per coordinate (Dwork & Roth 2014, Theorem A.1; the sum-and-count estimator of a mean
and variance as in Biswas et al. 2020's baseline). One example moves it by at most, in L2 norm:

- add_or_remove: sqrt(d + d + 1) (|z| <= 1, z^2 <= 1, the count by 1), d features;
- replace_one: sqrt(4 d + d) (z by up to 2, z^2 by up to 1, the count not at all).

The noise multiplier (noise std over that sensitivity) is the smallest one dp-accounting's calibration
(``dp_accounting.calibrate_dp_mechanism``) finds for (epsilon, delta) with the chosen accountant. The
estimate is post-processing: mean = m + r * S1 / N, variance = r^2 (S2 / N - (S1 / N)^2), the mean clamped
to [lo, hi] and the variance to [0, r^2] (the ranges a clipped variable can have); the record says for
how many features each clamp acted.
"""

from __future__ import annotations

import functools
import math

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_choice, check_open_unit, check_positive
from tfdpbnn.privacy.budget import NEIGHBORING
from tfdpbnn.privacy.registry import get_accountant, sound_accountants
from tfdpbnn.record.preprocessing import PreprocessingRecord, keep, ledger_reservation, state_digest


def calibrate_gaussian(epsilon: float, delta: float, accountant: str = "rdp",
                       neighboring: str = "add_or_remove") -> float:
    """The smallest noise multiplier of one Gaussian mechanism that is (epsilon, delta)-DP by ``accountant``.

    dp-accounting's ``calibrate_dp_mechanism`` (bisection on the noise multiplier of a ``GaussianDpEvent``):
    first by RDP on a wide bracket, then, for another accountant, on [RDP's / 4, RDP's * 4] (PLD's cost grows
    as the noise shrinks, so its bracket must not reach tiny noise).
    """
    check_positive("epsilon", epsilon)
    check_open_unit("delta", delta)
    check_choice("accountant", accountant, tuple(sound_accountants()))
    check_choice("neighboring", neighboring, tuple(NEIGHBORING))
    return _calibrate(float(epsilon), float(delta), accountant, neighboring)


@functools.lru_cache(maxsize=64)
def _calibrate(epsilon, delta, accountant, neighboring):
    relation = NEIGHBORING[neighboring]

    def search(name, lo, hi):
        return float(dp_accounting.calibrate_dp_mechanism(
            lambda: get_accountant(name, neighboring_relation=relation), dp_accounting.GaussianDpEvent,
            epsilon, delta, dp_accounting.ExplicitBracketInterval(lo, hi), tol=1e-7 * hi))

    sigma = search("rdp", 1e-2, 1e4)
    return sigma if accountant == "rdp" else search(accountant, sigma / 4.0, sigma * 4.0)


def check_finite_data(x) -> None:
    """Refuse NaN or infinite values in a DP preprocessing release's ``data`` (ValueError naming it).

    A NaN passes through ``np.clip``: a released statistic would be NaN exactly when such a record is in the
    data, which the noise cannot hide.
    """
    bad = ~np.isfinite(x)
    if np.any(bad):
        rows = np.unique(np.nonzero(bad.reshape(len(x), -1))[0])
        raise ValueError(
            f"data: {int(bad.sum())} NaN or infinite value(s) in {len(rows)} row(s) (first rows "
            f"{rows[:5].tolist()}); a NaN passes through the clip to bounds, so the release would tell "
            "whether such a record is present. Drop or repair non-finite records first")


def _bounds(bounds, d):
    if not isinstance(bounds, tuple | list) or len(bounds) != 2:
        raise ValueError(f"bounds must be a pair (lo, hi) of scalars or per-feature arrays, got {bounds!r}")
    lo = np.broadcast_to(np.asarray(bounds[0], np.float64), (d,)).copy()
    hi = np.broadcast_to(np.asarray(bounds[1], np.float64), (d,)).copy()
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
        raise ValueError(f"bounds: need finite lo < hi for every feature, got lo={lo}, hi={hi}")
    return lo, hi


def private_adapt_normalization(layer, data, *, epsilon: float, delta: float, bounds, accountant: str = "rdp",
                                neighboring: str = "add_or_remove", seed: int | None = None, labels=None,
                                record_ids=None) -> PreprocessingRecord:
    """Set ``layer``'s mean and variance from ``data`` with (epsilon, delta)-DP (module docstring).

    Args:
      layer: a ``tf.keras.layers.Normalization`` over the last axis, built without ``mean``/``variance``.
      data: the private examples, an array [n, d] (one row per example: a DP fit refuses a model in which
        one example feeds the layer more than d values, e.g. a sequence adapted on its time steps), finite
        (NaN or infinite values are refused: a NaN passes the clip and would reveal its record).
      epsilon: the epsilon of this release (composed with training in the privacy statement).
      delta: its delta.
      bounds: (lo, hi), scalars or arrays of d values, declared WITHOUT looking at the private data; values
        are clipped to them (the guarantee holds whatever the data; the estimate is biased where data fall
        outside).
      accountant: the sound accountant that calibrates the noise (use the optimizer's).
      neighboring: "add_or_remove" or "replace_one" (use the optimizer's).
      seed: None (secret noise: what a published guarantee needs) or an integer, for tests only.
      labels: the examples' labels, as training will get them. With ``labels`` or ``record_ids`` the
        release is also written to the per-record ledger (``tfdpbnn.record.record_ledger``) against the
        records (``data`` and ``labels`` identify them as training's ``x`` and ``y`` do), so every later run
        on them counts it.
      record_ids: the examples' ids (``tfdpbnn.record.records``), instead of their content.

    Returns the ``PreprocessingRecord``, also attached to the layer: a DP optimizer training a model that
    holds the layer lists it in its privacy statement under ``preprocessing`` and composes its event with
    training.
    """
    if not isinstance(layer, tf.keras.layers.Normalization):
        raise ValueError(f"layer must be a tf.keras.layers.Normalization, got {type(layer).__name__}")
    if layer.input_mean is not None:
        raise ValueError("layer: it was built with mean/variance constants; build it as Normalization() "
                         "(axis -1) to adapt it")
    if tuple(layer.axis) not in ((-1,),):
        raise ValueError(f"layer: private_adapt_normalization supports axis=-1 only, got axis={layer.axis}")
    x = np.asarray(data, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"data must be an array [n, d] with one row per example, got shape {x.shape}")
    check_finite_data(x)
    n, d = x.shape
    keys = None
    if labels is not None or record_ids is not None:
        from tfdpbnn.record.records import record_keys

        keys = record_keys(data, labels, record_ids)  # checked before anything is released
    lo, hi = _bounds(bounds, d)
    sigma = calibrate_gaussian(epsilon, delta, accountant, neighboring)
    sensitivity = math.sqrt(2 * d + 1) if neighboring == "add_or_remove" else math.sqrt(5 * d)
    std = sigma * sensitivity
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    clipped = np.clip(x, lo, hi)
    z = (clipped - mid) / half
    if not layer.built:
        layer.build((None, d))
    if tuple(layer.adapt_mean.shape) != (d,):
        raise ValueError(f"data: the layer normalizes {tuple(layer.adapt_mean.shape)} features, data has {d}")
    # Reserved before the data are read: the per-record budget refuses the release before it happens.
    with ledger_reservation(keys, sigma, neighboring, f"{layer.name}: normalization") as token:
        rng = np.random.default_rng(seed)
        s1 = z.sum(axis=0) + rng.normal(0.0, std, d)
        s2 = (z ** 2).sum(axis=0) + rng.normal(0.0, std, d)
        count = n + rng.normal(0.0, std)
        if count < 1.0:
            raise ValueError(f"data: the noisy count came out {count:.3g} < 1 (n={n}, noise std "
                             f"{std:.3g}); the data set is too small for this epsilon")
        mean_z = s1 / count
        var_z = s2 / count - mean_z ** 2
        clamped_mean = int(np.sum(np.abs(mean_z) > 1.0))
        clamped_var = int(np.sum((var_z < 0.0) | (var_z > 1.0)))
        mean_z = np.clip(mean_z, -1.0, 1.0)
        var_z = np.clip(var_z, 0.0, 1.0)
        mean_dtype = tf.as_dtype(layer.adapt_mean.dtype).as_numpy_dtype
        variance_dtype = tf.as_dtype(layer.adapt_variance.dtype).as_numpy_dtype
        layer.adapt_mean.assign((mid + half * mean_z).astype(mean_dtype))
        layer.adapt_variance.assign((half ** 2 * var_z).astype(variance_dtype))
        layer.count.assign(int(round(count)))
        layer.finalize_state()
        record = PreprocessingRecord(
            layer=layer.name, mechanism="normalization: Gaussian noise on (sum z, sum z^2, count), z the "
            "value clipped to bounds and scaled to [-1, 1]", noise_multiplier=sigma,
            l2_sensitivity=sensitivity, noise_std=std, epsilon=float(epsilon), delta=float(delta),
            accountant=accountant, neighboring=neighboring,
            details={"num_features": d, "values_per_row": d, "bounds": [lo.tolist(), hi.tolist()],
                     "features_mean_clamped": clamped_mean, "features_variance_clamped": clamped_var,
                     "noise": "secret" if seed is None else f"fixed seed {seed} (tests only)",
                     **({} if token is None else {"ledger_token": token})},
            state_digest=state_digest(layer))
        keep(layer, record)
    return record


__all__ = ["calibrate_gaussian", "check_finite_data", "private_adapt_normalization"]
