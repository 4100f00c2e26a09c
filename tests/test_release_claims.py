"""Releases beside training: "parallel" composition only for a split that is checked or asserted by name.

The true epsilon of each case is computed independently with dp-accounting from what ran (the training's
participations, counted here, and the release's event); the statement must be at or above it.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, rdp_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn.uncertainty import split_by_record
from tfdpbnn.uncertainty.private_release import PrivacyCost

SIGMA, EPOCHS = 1.0, 2


def _release(sigma=1.5, count=4):
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count)
    return type("Release", (), {"privacy": PrivacyCost(mechanism="temperature", dp_event=event,
                                                       epsilon=rdp_epsilon(event), delta=DELTA)})()


def _fit(x, y):
    model = small_model()
    n = len(x)
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=n, batch_size=n, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=n, epochs=EPOCHS, verbose=0)
    return model, opt


def _training_event():
    # Full-batch passes: every record participates once per epoch (counted here, not read from the library).
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(SIGMA), EPOCHS)


def test_parallel_claim_over_records_that_trained_is_refused_and_sequential_covers_the_truth():
    x, y = small_data()
    held = split_by_record([x, y], 0.25, key=0)
    _, opt = _fit(x, y)                       # trained on ALL records, calibration split taken from them
    release = _release()
    with pytest.raises(ValueError, match=r"'parallel' refused: \d+ of the release's \d+ records"):
        opt.record_release(release, "parallel", x=x[held], y=y[held])
    with pytest.raises(ValueError, match="composition: 'parallel' needs"):
        opt.record_release(release, "parallel")          # nothing shows the split
    assert opt.privacy_statement().get("releases") is None  # nothing half-recorded
    opt.record_release(release, "sequential", x=x[held], y=y[held])
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_training_event(), release.privacy.dp_event]))
    statement = opt.privacy_statement()
    parallel_value = max(rdp_epsilon(_training_event()), rdp_epsilon(release.privacy.dp_event))
    assert parallel_value < truth * 0.9          # the claim refused would have printed well below the truth
    assert statement["epsilon"] >= truth * (1 - 1e-6)
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-6)


def test_parallel_claim_on_a_split_the_library_made_is_checked_in_the_ledger():
    x, y = small_data()
    held = split_by_record([x, y], 0.25, key=0)
    _, opt = _fit(x[~held], y[~held])
    release = _release()
    opt.record_release(release, "parallel", x=x[held], y=y[held])
    statement = opt.privacy_statement()
    truth = max(rdp_epsilon(_training_event()), rdp_epsilon(release.privacy.dp_event))  # McSherry 2009
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)
    assert statement["releases"][0]["disjoint_from_training"].startswith("checked")
    assert not any("parallel composition" in a for a in statement["asserted_by_user"])


def test_parallel_claim_asserted_by_name_is_listed_and_bad_assertions_are_refused():
    x, y = small_data()
    _, opt = _fit(x, y)
    with pytest.raises(ValueError, match="asserted_disjoint: a non-empty reason"):
        opt.record_release(_release(), "parallel", asserted_disjoint="  ")
    with pytest.raises(ValueError, match="asserted_disjoint: only for composition='parallel'"):
        opt.record_release(_release(), "sequential", asserted_disjoint="held-out hospital")
    opt.record_release(_release(), "parallel",
                       asserted_disjoint="calibration rows come from another hospital")
    statement = opt.privacy_statement()
    assert any("asserted by the user: calibration rows come from another hospital" in a
               for a in statement["asserted_by_user"])


def test_parallel_claim_before_any_training_cannot_be_checked():
    x, y = small_data()
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=N, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    with pytest.raises(ValueError, match="cannot be checked: the per-record ledger holds no record"):
        opt.record_release(_release(), "parallel", x=x, y=y)


def test_parallel_claim_with_the_record_store_off_needs_an_assertion(monkeypatch):
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", "off")
    x, y = small_data()
    _, opt = _fit(x, y)
    with pytest.raises(ValueError, match="record store off"):
        opt.record_release(_release(), "parallel", x=x[:8], y=y[:8])
    tf.keras.backend.clear_session()
    assert np.isfinite(opt.epsilon())
