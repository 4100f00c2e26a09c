"""PrivacyCallback (epsilon in the logs, budget stop) and its bad input."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn import privacy

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _setup(sampling="poisson", sigma=1.0):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 4)).astype(np.float32)
    y = rng.integers(0, 3, 100)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=100, batch_size=10, sampling=sampling)
    model.compile(optimizer=opt, loss=LOSS)
    return model, opt, x, y


@pytest.mark.slow   # fit end to end, every sound accountant at each epoch (checked in test_privacy_*)
def test_epsilon_in_history_each_epoch_for_every_sound_accountant():
    model, opt, x, y = _setup()
    ds = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.1)
    callback = tfdpbnn.PrivacyCallback(delta=1e-5, all_sound=True)
    history = model.fit(ds, epochs=2, verbose=0, callbacks=[callback])
    for epoch, steps in enumerate((10, 20)):
        assert history.history["epsilon"][epoch] == pytest.approx(
            privacy.compute_epsilon(1.0, 0.1, steps, 1e-5, accountant="rdp", sampling="poisson"), rel=1e-9)
        for name in privacy.sound_accountants():
            assert history.history[f"epsilon_{name}"][epoch] == pytest.approx(
                privacy.compute_epsilon(1.0, 0.1, steps, 1e-5, accountant=name, sampling="poisson"), rel=1e-9)
    assert history.history["epsilon"][1] > history.history["epsilon"][0]


def test_stop_at_epsilon_stops_before_a_step_would_exceed_the_budget():
    model, opt, x, y = _setup()
    budget = 0.5 * (opt.epsilon_after(13, delta=1e-5) + opt.epsilon_after(14, delta=1e-5))  # allows 13 steps
    callback = tfdpbnn.PrivacyCallback(delta=1e-5, stop_at_epsilon=budget)
    ds = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.1)
    history = model.fit(ds, epochs=5, verbose=0, callbacks=[callback])
    assert callback.max_steps == 13 and opt.steps == 13
    assert history.history["epsilon"][-1] <= budget < opt.epsilon_after(14, delta=1e-5)
    with pytest.raises(ValueError, match="stop_at_epsilon"):  # nothing left: refuse to take another step
        model.fit(ds, epochs=1, verbose=0, callbacks=[callback])
    assert opt.steps == 13


def test_callback_bad_input():
    for bad in (0.0, 1.0, -1e-5):
        with pytest.raises(ValueError, match="delta"):
            tfdpbnn.PrivacyCallback(delta=bad)
    with pytest.raises(ValueError, match="stop_at_epsilon"):
        tfdpbnn.PrivacyCallback(delta=1e-5, stop_at_epsilon=0.0)
    with pytest.raises(ValueError, match="accountant"):
        tfdpbnn.PrivacyCallback(delta=1e-5, accountant="moments")
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=LOSS)
    with pytest.raises(ValueError, match="DP optimizer"):
        model.fit(np.zeros((4, 4)), np.zeros(4), verbose=0, callbacks=[tfdpbnn.PrivacyCallback(1e-5)])
    for kwargs, name in ((dict(burn_in=-1), "burn_in"), (dict(thinning=0), "thinning"),
                         (dict(max_samples=0), "max_samples")):
        with pytest.raises(ValueError, match=name):
            tfdpbnn.PosteriorSampler(**kwargs)
