"""A private search in the per-record ledger: its trials on the training records, its scores on the validation
records, and the selected model's ledger bound covering both (truths from dp-accounting)."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
import tfdpbnn.tuning
from tfdpbnn.privacy import dp_sgd_event
from tfdpbnn.record.record_ledger import BudgetExceededError, default_ledger
from tfdpbnn.record.records import record_keys

CANDIDATES = [dict(noise_multiplier=1.0, batch_size=32, epochs=1), dict(noise_multiplier=1.5, batch_size=16,
                                                                         epochs=1)]
SCORE_NOISE = 2.0


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = rng.integers(0, 3, 96)
    return x[:64], y[:64], x[64:], y[64:]


def _model(hp, n=64):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, hp["noise_multiplier"], num_examples=n,
                                                   batch_size=hp["batch_size"], delta=1e-5,
                                                   sampling="poisson"),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _rdp(*events):
    return dp_accounting.rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent(list(events))).get_epsilon(
        1e-5)


def test_search_is_charged_to_its_records_and_in_the_selected_models_ledger_bound():
    x, y, xv, yv = _data()
    res = tfdpbnn.tuning.private_search(_model, CANDIDATES, x, y, xv, yv, delta=1e-5, distribution=None,
                                        score_noise_multiplier=SCORE_NOISE)
    ledger = default_ledger()
    # Truths, independently: both trials' DP-SGD on every training record (q 0.5, 2 steps; q 0.25, 4 steps);
    # two noisy counts (sensitivity 1, noise 2) on every validation record.
    train_truth = _rdp(dp_sgd_event(1.0, 0.5, 2), dp_sgd_event(1.5, 0.25, 4))
    val_truth = _rdp(*[dp_accounting.GaussianDpEvent(SCORE_NOISE)] * 2)
    assert ledger.max_epsilon(record_keys(x, y), 1e-5) == pytest.approx(train_truth, rel=1e-3)
    assert ledger.max_epsilon(record_keys(xv, yv), 1e-5) == pytest.approx(val_truth, rel=1e-3)
    statement = res.model.optimizer.privacy_statement()
    bound = statement["ledger_bound"]
    assert bound["epsilon"] is not None, bound
    assert bound["epsilon"] >= max(train_truth, val_truth) * (1 - 1e-6)
    assert statement["quote"]["epsilon"] >= max(train_truth, val_truth, res.privacy["epsilon"]) * (1 - 1e-6)
    # The selected weights in a fresh model with a new optimizer (no search record travels): the ledger
    # finds the search through the weights' phases.
    fresh = _model(res.hparams)
    fresh.set_weights(res.model.get_weights())
    later = fresh.optimizer.privacy_statement(model=fresh)
    assert later["ledger_bound"]["epsilon"] >= max(train_truth, val_truth) * (1 - 1e-6)
    assert later["quote"]["epsilon"] >= max(train_truth, val_truth) * (1 - 1e-6)


def test_search_over_a_validation_records_budget_is_refused_before_any_trial():
    x, y, xv, yv = _data()
    default_ledger().set_budget(epsilon=_rdp(dp_accounting.GaussianDpEvent(SCORE_NOISE)) * 1.2, delta=1e-5)
    built = []

    def build(hp):
        built.append(hp)
        return _model(hp)

    with pytest.raises(BudgetExceededError, match="search release"):
        tfdpbnn.tuning.private_search(build, CANDIDATES, x, y, xv, yv, delta=1e-5, distribution=None,
                                      score_noise_multiplier=SCORE_NOISE)
    assert built == []


def test_a_search_names_records_earlier_named_by_ids_by_the_same_ids():
    # Training and validation records first released under ids (a fit; a calibration-like release on the
    # validation rows): a search naming them by content would give each a second history, and is refused
    # before its first trial; with the same ids it runs, and each record's epsilon composes both.
    from tfdpbnn.record.record_ledger import RecordNamingError

    x, y, xv, yv = _data()
    ids, val_ids = np.arange(1000, 1064), np.arange(2000, 2032)
    first = _model(CANDIDATES[0])
    first.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=0.5, record_ids=ids), epochs=1, verbose=0)
    ledger = default_ledger()
    ledger.reserve(record_keys(xv, yv, val_ids), dp_accounting.GaussianDpEvent(SCORE_NOISE),
                   kind="calibration", description="a noisy count on the validation records").commit(
        dp_accounting.GaussianDpEvent(SCORE_NOISE))
    built = []

    def build(hp):
        built.append(hp)
        return _model(hp)

    # Validation records by content: refused at the scores' reservation, before any trial is built; by
    # their ids but training records by content: refused at the first trial's fit, before its first step.
    for named, trials in (({}, 0), ({"record_ids": ids}, 0), ({"validation_record_ids": val_ids}, 1)):
        with pytest.raises(RecordNamingError, match="record_ids"):
            tfdpbnn.tuning.private_search(build, CANDIDATES, x, y, xv, yv, delta=1e-5, distribution=None,
                                          score_noise_multiplier=SCORE_NOISE, **named)
        assert len(built) == trials
        built.clear()
    with pytest.raises(ValueError, match="validation_record_ids: 31 ids for \\[32\\] records"):
        tfdpbnn.tuning.private_search(build, CANDIDATES, x, y, xv, yv, delta=1e-5, distribution=None,
                                      score_noise_multiplier=SCORE_NOISE, record_ids=ids,
                                      validation_record_ids=val_ids[:31])
    assert built == []
    tfdpbnn.tuning.private_search(build, CANDIDATES, x, y, xv, yv, delta=1e-5, distribution=None,
                                  score_noise_multiplier=SCORE_NOISE, record_ids=ids,
                                  validation_record_ids=val_ids)
    # Truths, independently: the first fit and both trials (Poisson) on every training record; three noisy
    # counts on every validation record.
    train_truth = _rdp(dp_sgd_event(1.0, 0.5, 2), dp_sgd_event(1.0, 0.5, 2), dp_sgd_event(1.5, 0.25, 4))
    val_truth = _rdp(*[dp_accounting.GaussianDpEvent(SCORE_NOISE)] * 3)
    assert ledger.max_epsilon(record_keys(x, y, ids), 1e-5) == pytest.approx(train_truth, rel=1e-3)
    assert ledger.max_epsilon(record_keys(xv, yv, val_ids), 1e-5) == pytest.approx(val_truth, rel=1e-3)


def test_a_search_refuses_records_in_both_splits_before_any_trial():
    # The search's epsilon composes a trial's training and its score in parallel (disjoint splits): for a
    # record in both splits it is below the truth (5.89 against 6.71 here). A validation split holding
    # training records (by content, or by ids) is refused before any trial; rows with equal features named
    # apart by ids are different records and run.
    from tfdpbnn.tuning import bounds, search

    total = search.search_rdp(CANDIDATES, 64, None, SCORE_NOISE)[0]
    in_both = _rdp(dp_sgd_event(1.0, 0.5, 2), dp_sgd_event(1.5, 0.25, 4),
                   *[dp_accounting.GaussianDpEvent(SCORE_NOISE)] * 2)
    assert bounds.epsilon(bounds.ORDERS, total, 1e-5) < in_both
    x, y, xv, yv = _data()
    built = []

    def build(hp):
        built.append(hp)
        return _model(hp)

    ids, val_ids = np.arange(64), np.arange(100, 132)
    overlapping = (dict(x_val=x[:32], y_val=y[:32]),
                   dict(x_val=x[:32], y_val=y[:32], record_ids=ids),
                   dict(x_val=x[:32], y_val=y[:32], validation_record_ids=val_ids),
                   dict(x_val=xv, y_val=yv, record_ids=ids, validation_record_ids=ids[:32]))
    for case in overlapping:
        named = {k: v for k, v in case.items() if k.endswith("record_ids")}
        with pytest.raises(ValueError, match="x_val: 32 validation records are training records too"):
            tfdpbnn.tuning.private_search(build, CANDIDATES, x, y, case["x_val"], case["y_val"], delta=1e-5,
                                          distribution=None, score_noise_multiplier=SCORE_NOISE, **named)
        assert built == []
    assert default_ledger().histories() == []   # nothing reserved
    result = tfdpbnn.tuning.private_search(build, CANDIDATES, x, y, x[:32], y[:32], delta=1e-5,
                                           distribution=None, score_noise_multiplier=SCORE_NOISE,
                                           record_ids=ids, validation_record_ids=val_ids)
    assert len(built) == 2 and result.model is not None


def test_a_search_refuses_trials_that_train_a_model_trained_before():
    # Random stopping covers trials that each train a fresh model: a build reusing one model trains it in
    # every trial, and the search's bound is below that model's own training once five trials ran (9.90
    # against 11.54 for PoissonTrials(10)). The second trial's model is refused before its fit; weights of a
    # DP-trained model set into a new model (found by the record store at the fit's start) after it.
    from tfdpbnn.tuning import bounds, search

    total = search.search_rdp(CANDIDATES[:1], 64, tfdpbnn.tuning.PoissonTrials(10.0), None)[0]
    assert bounds.epsilon(bounds.ORDERS, total, 1e-5) < _rdp(dp_sgd_event(1.0, 0.5, 2 * 5))
    x, y, xv, yv = _data()
    shared = []

    def reuse(hp):
        if not shared:
            shared.append(_model(hp))
        return shared[0]

    with pytest.raises(ValueError, match="build: it returned a model that was DP-trained before the trial"):
        tfdpbnn.tuning.private_search(reuse, CANDIDATES[:1] * 2, x, y, xv, yv, delta=1e-5, distribution=None,
                                      score_noise_multiplier=SCORE_NOISE)
    assert shared[0].optimizer.steps == 2   # the first trial's steps; the second trial took none
    trained = shared[0]

    def warm(hp):
        model = _model(hp)
        model.set_weights(trained.get_weights())
        return model

    with pytest.raises(ValueError, match="build: the trial's weights carry 2 DP steps of earlier training"):
        tfdpbnn.tuning.private_search(warm, CANDIDATES[:1], x, y, xv, yv, delta=1e-5, distribution=None,
                                      score_noise_multiplier=SCORE_NOISE)


def test_a_search_with_its_own_predict_lists_it_as_asserted():
    # The noisy count's sensitivity is 1 only if predict scores each row from that row alone: a predict the
    # user passes cannot be checked (it may be random, as an MC average is), so the statement says it rests
    # on the user's word; the default (the model's deterministic call) is not listed.
    x, y, xv, yv = _data()

    def mean_of_two(model, rows):
        return (model(rows, training=False) + model(rows, training=False)) / 2

    plain = tfdpbnn.tuning.private_search(_model, CANDIDATES[:1], x, y, xv, yv, delta=1e-5, distribution=None,
                                          score_noise_multiplier=SCORE_NOISE)
    assert plain.privacy["asserted_by_user"] == []
    own = tfdpbnn.tuning.private_search(_model, CANDIDATES[:1], x, y, xv, yv, delta=1e-5, distribution=None,
                                        score_noise_multiplier=SCORE_NOISE, predict=mean_of_two)
    assert len(own.privacy["asserted_by_user"]) == 1
    assert "predict (mean_of_two) scores each validation example from that example alone" in \
        own.privacy["asserted_by_user"][0]
    # The selected model's own statement carries it too (and export_saved_model's privacy.json).
    model_says = own.model.optimizer.privacy_statement()["asserted_by_user"]
    assert any("the search that selected this model: predict (mean_of_two)" in a for a in model_says)
    assert not any("the search" in a for a in plain.model.optimizer.privacy_statement()["asserted_by_user"])


def test_a_search_refuses_trials_its_dp_sgd_accounting_does_not_cover():
    # A search over SI-DPSGD's paper mode quoted the search's DP-SGD epsilon for the selected model (1.01
    # where the released weights' exact GDP composition gives 20.95); a DP normalization adapted inside
    # build for every trial was counted once (4.35 quoted where the two adapts alone give 5.52). Both are
    # refused before the trial's first step; a layer adapted once before the search is accepted.
    from tfdpbnn.preprocessing import private_adapt_normalization

    x, y, xv, yv = _data()
    hp = dict(noise_multiplier=4.0, batch_size=8, epochs=1, sampling="shuffle")

    def sidp(hp):
        model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.layers.NoisyDense(3)])
        model.compile(optimizer=tfdpbnn.SIDPOptimizer(1.0, hp["noise_multiplier"], paper_mean_update=True,
                                                      learning_rate=0.1, num_examples=64,
                                                      batch_size=hp["batch_size"], delta=1e-5),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with pytest.raises(ValueError,
                       match=r"build: its optimizer \(SIDPOptimizer\) accounts its steps otherwise"):
        tfdpbnn.tuning.private_search(sidp, [hp], x, y, xv, yv, delta=1e-5, distribution=None,
                                      score_noise_multiplier=SCORE_NOISE)
    adapted = []

    def with_normalization(hp, adapt_in_build):
        if adapt_in_build or not adapted:
            layer = tf.keras.layers.Normalization()
            private_adapt_normalization(layer, x, epsilon=4.0, delta=1e-5, bounds=(-3.0, 3.0))
            adapted.append(layer)
        model = tf.keras.Sequential([tf.keras.Input((4,)), adapted[-1], tf.keras.layers.Dense(3)])
        model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, hp["noise_multiplier"], num_examples=64,
                                                       batch_size=hp["batch_size"], delta=1e-5,
                                                       sampling="shuffle"),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    with_normalization(hp, True)   # adapted once, before the search
    result = tfdpbnn.tuning.private_search(lambda hp: with_normalization(hp, False), [hp], x, y, xv, yv,
                                           delta=1e-5, distribution=None, score_noise_multiplier=SCORE_NOISE)
    assert result.model.optimizer.steps == 8
    with pytest.raises(ValueError, match="holds DP preprocessing releases made during the search"):
        tfdpbnn.tuning.private_search(lambda hp: with_normalization(hp, True), [hp], x, y, xv, yv, delta=1e-5,
                                      distribution=None, score_noise_multiplier=SCORE_NOISE)
