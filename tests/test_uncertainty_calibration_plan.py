"""CalibrationPlan and split_by_record: one stated epsilon covers training and the private calibration.

Checked against independent dp-accounting computations: the parallel releases compose to the stated epsilon,
the sequential plan leaves the training noise room for them, and the statement takes the larger of the two
parts under parallel composition (McSherry 2009); the record-wise split keeps every other record in place
when one is added."""

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn.uncertainty import CalibrationPlan, split_by_record

DELTA = 1e-5


def test_split_by_record_depends_on_each_record_alone():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2000, 3)), rng.integers(0, 5, 2000)
    held = split_by_record([x, y], 0.25, key=7)
    assert abs(held.mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / 2000)  # Binomial(2000, 0.25), 4 sd
    # a neighbouring data set (one record added in the middle): every other record stays in its part
    x2, y2 = np.insert(x, 1000, rng.normal(size=3), axis=0), np.insert(y, 1000, 3)
    held2 = split_by_record([x2, y2], 0.25, key=7)
    np.testing.assert_array_equal(np.delete(held2, 1000), held)
    assert not np.array_equal(split_by_record([x, y], 0.25, key=8), held)  # the key changes the split
    with pytest.raises(ValueError, match="fraction"):
        split_by_record([x, y], 1.0, key=7)
    with pytest.raises(ValueError, match="rows"):
        split_by_record([x, y[:10]], 0.25, key=7)


@pytest.mark.parametrize("epsilon", [0.5, pytest.param(2.0, marks=pytest.mark.slow)])   # fast tier: 0.5
def test_parallel_releases_compose_to_the_stated_epsilon(epsilon):
    plan = CalibrationPlan()
    eps_t, eps_c = plan.release_epsilons(epsilon, DELTA, "pld")
    assert eps_t / eps_c == pytest.approx(plan.temperature_share / plan.conformal_share)
    composed = dp_accounting.pld.PLDAccountant().compose(dp_accounting.ComposedDpEvent(
        plan._events(eps_t, eps_c, DELTA, "pld"))).get_epsilon(DELTA)
    assert epsilon * 0.999 <= composed <= epsilon * (1 + 1e-6)
    assert plan.training_events(epsilon, DELTA, "pld") == []
    sequential = CalibrationPlan(composition="sequential")
    assert sequential.release_epsilons(epsilon, DELTA) == pytest.approx((0.2 * epsilon, 0.5 * epsilon))
    assert len(sequential.training_events(epsilon, DELTA)) == 2
    with pytest.raises(ValueError, match="composition"):
        CalibrationPlan(composition="both")


def test_statement_takes_the_larger_part_under_parallel_composition():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    held = split_by_record([x, y], 0.25, key=0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    n = int((~held).sum())
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 3.0, num_examples=n, batch_size=n, delta=DELTA)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[~held], y[~held], batch_size=n, epochs=2, verbose=0)
    probs = tf.nn.softmax(model(x[held])).numpy()
    temperature, threshold = CalibrationPlan().fit(probs, y[held], 1.0, DELTA, "rdp",
                                                   allow_uninformative=True)  # ~20 held out: accounting only
    training = optimizer.epsilon()
    optimizer.record_release(temperature, "parallel", x=x[held], y=y[held])  # the ledger checks the split
    optimizer.record_release(threshold, "parallel", x=x[held], y=y[held])
    optimizer.record_release(threshold, "parallel", x=x[held], y=y[held])  # counted once
    statement = optimizer.privacy_statement()
    releases = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent(
        [temperature.privacy.dp_event, threshold.privacy.dp_event])).get_epsilon(DELTA)
    assert statement["training_epsilon"] == pytest.approx(training)
    assert statement["epsilon"] == pytest.approx(max(training, releases), rel=1e-6)
    assert len(statement["releases"]) == 2 and statement["releases"][0]["composition"] == "parallel"
    assert "parallel composition" in statement["epsilon_covers"]
    replace_one = tfdpbnn.DPSGDOptimizer(1.0, 3.0, num_examples=n, batch_size=n, delta=DELTA,
                                         neighboring="replace_one")
    with pytest.raises(ValueError, match="add/remove"):
        replace_one.record_release(temperature, "parallel")


def test_plan_passes_the_grid_and_the_null_zone_to_its_releases():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(700, 4)) * 2.0
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = (rng.random(700)[:, None] > probs.cumsum(1)).sum(1).clip(0, 3)  # calibrated: labels ~ probs
    plan = CalibrationPlan(composition="sequential", conformal_grid="log", conformal_gamma=0.05,
                           conformal_steps=6, temperature_null_zone=2.0)
    temperature, threshold = plan.fit(probs, labels, 4.0, DELTA, allow_uninformative=True, seeds=(0, 0))
    assert threshold.grid == "log" and threshold.as_dict()["grid"] == "log"
    assert temperature.temperature == 1.0  # a calibrated model, D(1) inside the zone (seed 0)
    assert CalibrationPlan().conformal_grid == "linear" and CalibrationPlan().temperature_null_zone is None
    with pytest.raises(ValueError, match="conformal_grid must be one of 'linear', 'log'"):
        CalibrationPlan(conformal_grid="exp")
    with pytest.raises(ValueError, match="temperature_null_zone"):
        CalibrationPlan(temperature_null_zone=0.0)
