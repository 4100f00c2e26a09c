"""The cyclical learning-rate snapshot ensemble of ``experiments/ood_cyclic.py``: its schedule in closed form,
its per-cycle members against the iterates, and the epsilon of the cyclic run equal to the plain run's."""

import math

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn  # noqa: F401 - first, so that tf.keras is Keras 2 (tf-keras) where installed
from experiments import ood_cyclic
from tfdpbnn.uncertainty import IterateMoments


def test_schedule_is_cosine_cycles_in_closed_form():
    schedule = ood_cyclic.cyclic_schedule(2.0, 4, 120)
    for step in (0, 1, 17, 29, 30, 31, 59, 60, 119):
        position = (step % 30) / 30
        expected = 0.5 * 2.0 * (1.0 + math.cos(math.pi * position))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert float(schedule(29)) < 0.02  # each cycle ends near 0, where its member is taken
    with pytest.raises(ValueError, match="cycles must divide"):
        ood_cyclic.cyclic_schedule(1.0, 7, 120)


def test_cycle_members_are_each_cycles_last_iterate_and_its_restarted_average():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 3)).astype("float32"), rng.integers(0, 2, 12)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.5),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    members, every = ood_cyclic._cycle_members(4), IterateMoments(thinning=1, max_iterates=12)
    model.fit(x, y, batch_size=4, epochs=4, shuffle=False, verbose=0, callbacks=[members, every])
    iterates = [[np.asarray(w, np.float64) for w in weights] for weights in every.iterates]  # 12 steps
    assert len(members.snapshots) == len(members.averages) == 3
    for cycle in range(3):
        chunk = iterates[4 * cycle:4 * cycle + 4]
        average = chunk[0]
        for t, weights in enumerate(chunk[1:], start=1):  # Polyak at first, then decay 0.9
            rate = min(0.9, t / (t + 1.0))
            average = [rate * a + (1 - rate) * w for a, w in zip(average, weights, strict=True)]
        for got, want in zip(members.snapshots[cycle], chunk[-1], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        for got, want in zip(members.averages[cycle], average, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # two DP runs on DIGITS (about 15 s): not in the fast tier
def test_the_cyclic_run_spends_the_plain_runs_epsilon(monkeypatch):
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", "off")  # as the experiment runs: each statement its own run's
    rng = np.random.default_rng(1)
    x, y = (rng.uniform(size=(40, 64)) - 0.5).astype("float32"), rng.integers(0, 10, 40)
    _, _, plain, _ = ood_cyclic._plain(x, y, 0, 1, 2)
    model, optimizer, spent, out = ood_cyclic._cyclic(x, y, 0, 1, 2, cycles=4, peak=2.0)
    ood_cyclic._check_epsilons(plain, spent, optimizer)  # equal, and unchanged by the post-processing
    assert spent == pytest.approx(1.0, rel=0.01)  # the noise was calibrated to epsilon 1
    assert plain == pytest.approx(spent, abs=1e-9)
    assert len(out[("snapshots", False)]) == 4 and len(out[("snapshots", True)]) == 3
    for got, want in zip(out[("snapshots", False)][-1], out["cyclic, last iterate"][0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert float(optimizer.privacy_statement()["epsilon"]) == pytest.approx(spent, abs=1e-12)
