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
from tfdpbnn.record.private_release import PrivacyCost
from tfdpbnn.uncertainty import split_by_record

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
    elsewhere, labels = small_data(n=16, seed=7)   # the release's records, which the ledger charges
    with pytest.raises(ValueError, match="x, y, record_ids: the release names none of the records it read"):
        opt.record_release(_release(), "parallel",
                           asserted_disjoint="calibration rows come from another hospital")
    opt.record_release(_release(), "parallel", x=elsewhere, y=labels,
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


def test_parallel_claim_on_predictions_instead_of_records_is_refused():
    x, y = small_data()
    held = split_by_record([x, y], 0.25, key=0)
    model, opt = _fit(x, y)
    probs = tf.nn.softmax(model(x[held])).numpy()        # [n, 3]: not the records training saw
    with pytest.raises(ValueError, match=r"x: the release's records in the form training was given them"):
        opt.record_release(_release(), "parallel", x=probs, y=y[held])


# ------------------------------------------------------ releases travel with the model and its weights
def _trained_with_release(x, y):
    model, opt = _fit(x, y)
    release = _release()
    opt.record_release(release, "sequential", asserted_training_records="fit on the training records")
    return model, opt, release


def _truth(release, epochs=EPOCHS):
    training = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(SIGMA), epochs)
    return rdp_epsilon(dp_accounting.ComposedDpEvent([training, release.privacy.dp_event]))


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_a_private_release_survives_save_and_load(tmp_path, suffix):
    x, y = small_data()
    model, opt, release = _trained_with_release(x, y)
    truth = _truth(release)
    assert opt.epsilon() == pytest.approx(truth, rel=1e-6)
    path = str(tmp_path / f"model{suffix}")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    statement = loaded.optimizer.privacy_statement()
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)   # 7.08 (training alone) before
    assert statement["releases"][0]["privacy"]["dp_event"] == \
        release.privacy.as_dict()["dp_event"]
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-6)
    assert [a for a in statement["asserted_by_user"] if a.endswith(
        "(asserted_training_records): fit on the training records")]   # the user's assertion travels too


def test_a_new_optimizer_continuing_a_loaded_model_counts_the_release(tmp_path):
    x, y = small_data()
    model, _, release = _trained_with_release(x, y)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    new = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=N, delta=DELTA)
    loaded.compile(optimizer=new, loss=LOSS)
    loaded.fit(x, y, batch_size=N, epochs=1, verbose=0)
    truth = _truth(release, EPOCHS + 1)                 # 3 full-batch passes and the release
    statement = new.privacy_statement()
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)   # 9.01 before
    assert truth * (1 - 1e-6) <= statement["ledger_bound"]["epsilon"] <= truth * 1.01  # counted once
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-6)


def test_weights_loaded_into_a_fresh_model_find_the_release_in_the_ledger(tmp_path):
    x, y = small_data()
    model, _, release = _trained_with_release(x, y)
    model.save_weights(str(tmp_path / "w.weights.h5"))
    fresh = small_model(seed=5)
    fresh.load_weights(str(tmp_path / "w.weights.h5"))
    new = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=N, delta=DELTA)
    fresh.compile(optimizer=new, loss=LOSS)
    fresh.fit(x, y, batch_size=N, epochs=1, verbose=0)
    truth = _truth(release, EPOCHS + 1)
    statement = new.privacy_statement()
    assert statement["epsilon"] >= truth * (1 - 1e-6)
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-6)
    assert statement["releases"][0]["note"].startswith("found in the per-record ledger")


def test_a_new_optimizer_on_the_same_model_object_keeps_the_release():
    x, y = small_data()
    model, _, release = _trained_with_release(x, y)
    new = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=N, delta=DELTA)
    model.compile(optimizer=new, loss=LOSS)
    model.fit(x, y, batch_size=N, epochs=1, verbose=0)
    assert new.epsilon() == pytest.approx(_truth(release, EPOCHS + 1), rel=1e-6)
    assert len(new.privacy_statement()["releases"]) == 1      # taken over once, not also from the ledger


def test_search_record_and_parallel_basis_travel_in_get_config():
    from tfdpbnn.record import attributes
    from tfdpbnn.record.other_releases import SearchRecord

    x, y = small_data()
    held = split_by_record([x, y], 0.25, key=0)
    _, opt = _fit(x[~held], y[~held])
    opt.record_release(_release(), "parallel", x=x[held], y=y[held])
    restored = type(opt).from_config(opt.get_config())
    assert restored.epsilon() == pytest.approx(opt.epsilon(), rel=1e-9)
    assert restored.privacy_statement()["releases"][0]["disjoint_from_training"].startswith("checked")
    search = SearchRecord(statement={"epsilon": 1.0}, rdp=tuple(float(a) for a in range(1, 4)),
                          steps_at_selection=opt.steps)
    attributes.set_search_record(opt, search)
    back = attributes.search_record(type(opt).from_config(opt.get_config()))
    assert back.rdp == search.rdp and back.steps_at_selection == search.steps_at_selection
