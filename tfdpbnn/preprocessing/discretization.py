"""DP ``tf.keras.layers.Discretization``: quantile bin boundaries from a noisy histogram.

Values are clipped to declared bounds [lo, hi] and counted in ``resolution`` equal cells; one example adds
1 to one cell, so the histogram's L2 sensitivity is 1 under add_or_remove and sqrt(2) under replace_one.
Gaussian noise is added to every cell (Dwork & Roth 2014, Theorem A.1; the noisy-histogram quantile of
Dwork & Roth 2014, Section 3.3). Post-processing: negative counts are set to 0 (the record says how many),
and the k/num_bins quantiles of the noisy histogram, interpolated linearly inside a cell, are the
boundaries.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_choice, check_positive_int
from tfdpbnn.preprocessing.normalization import calibrate_gaussian, check_finite_data
from tfdpbnn.privacy.budget import NEIGHBORING
from tfdpbnn.record.preprocessing import PreprocessingRecord, keep, ledger_reservation, state_digest


def private_discretization(data, *, num_bins: int, epsilon: float, delta: float, bounds,
                           resolution: int = 256, accountant: str = "rdp", neighboring: str = "add_or_remove",
                           seed: int | None = None, name: str | None = None, record_ids=None):
    """A ``Discretization`` layer whose ``num_bins`` quantile bins come from a DP histogram of ``data``.

    Args:
      data: the private values, one per example (an array [n] or [n, 1]: a DP fit refuses a model in which
        one example feeds the layer more than one value), finite (NaN or infinite values are
        refused: a NaN passes the clip and would reveal its record).
      num_bins: the number of bins of the layer (num_bins - 1 boundaries), >= 2.
      epsilon: the epsilon of this release (composed with training in the privacy statement).
      delta: its delta.
      bounds: (lo, hi), declared WITHOUT looking at the private data; values are clipped to them.
      resolution: the number of histogram cells on [lo, hi] (the boundaries' resolution).
      accountant: the sound accountant that calibrates the noise (use the optimizer's).
      neighboring: "add_or_remove" or "replace_one" (use the optimizer's).
      seed: None (secret noise) or an integer, for tests only.
      name: the layer's name.
      record_ids: the ids of the examples the values belong to (``tfdpbnn.record.records``): the release
        is then also written to the per-record ledger against them, so every later run on them counts it
        (one column of values does not identify a record by content).

    Returns ``(layer, record)``; the ``PreprocessingRecord`` is also attached to the layer, so a DP optimizer
    training a model that holds it lists it under ``preprocessing`` and composes its event with training.
    """
    num_bins = check_positive_int("num_bins", num_bins)
    resolution = check_positive_int("resolution", resolution)
    if num_bins < 2:
        raise ValueError(f"num_bins must be >= 2, got {num_bins}")
    check_choice("neighboring", neighboring, tuple(NEIGHBORING))
    x = np.asarray(data, dtype=np.float64)
    if x.ndim == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 1 or x.size < 1:
        raise ValueError(f"data must hold one value per example (shape [n] or [n, 1]), got shape {x.shape}")
    check_finite_data(x)
    if not isinstance(bounds, tuple | list) or len(bounds) != 2:
        raise ValueError(f"bounds must be a pair (lo, hi), got {bounds!r}")
    keys = None
    if record_ids is not None:
        from tfdpbnn.record.records import distinct_id_keys

        keys = distinct_id_keys(record_ids)
        if len(keys) != x.size:
            raise ValueError(f"record_ids: {len(keys)} ids for {x.size} values; give one id per example")
    lo, hi = float(bounds[0]), float(bounds[1])
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"bounds: need finite lo < hi, got ({lo}, {hi})")
    sigma = calibrate_gaussian(epsilon, delta, accountant, neighboring)
    sensitivity = 1.0 if neighboring == "add_or_remove" else math.sqrt(2.0)
    std = sigma * sensitivity
    # Reserved before the data are read: the per-record budget refuses the release before it happens.
    described = f"{name or 'discretization'}: discretization"
    with ledger_reservation(keys, sigma, neighboring, described) as token:
        counts, edges = np.histogram(np.clip(x, lo, hi), bins=resolution, range=(lo, hi))
        rng = np.random.default_rng(seed)
        noisy = counts + rng.normal(0.0, std, resolution)
        negative = int(np.sum(noisy < 0))
        noisy = np.maximum(noisy, 0.0)
        total = noisy.sum()
        if total <= 0:
            raise ValueError(f"data: the noisy histogram is empty (n={x.size}, noise std {std:.3g} per "
                             "cell); the data set is too small for this epsilon and resolution")
        cumulative = np.concatenate([[0.0], np.cumsum(noisy)]) / total
        boundaries = np.interp(np.arange(1, num_bins) / num_bins, cumulative, edges)
        boundaries = np.maximum.accumulate(boundaries)
        layer = tf.keras.layers.Discretization(bin_boundaries=boundaries.tolist(), name=name)
        record = PreprocessingRecord(
            layer=layer.name, mechanism="discretization: Gaussian noise on a histogram of values clipped to "
            "bounds; boundaries are its quantiles", noise_multiplier=sigma, l2_sensitivity=sensitivity,
            noise_std=std,
            epsilon=float(epsilon), delta=float(delta), accountant=accountant, neighboring=neighboring,
            details={"num_bins": num_bins, "values_per_row": 1, "resolution": resolution, "bounds": [lo, hi],
                     "cells_set_to_zero": negative,
                     "noise": "secret" if seed is None else f"fixed seed {seed} (tests only)",
                     **({} if token is None else {"ledger_token": token, "ledger_ids_without_rows": True})},
            state_digest=state_digest(layer))
        keep(layer, record)
    return layer, record


__all__ = ["private_discretization"]
