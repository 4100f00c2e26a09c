"""A release whose noise came from a user-given seed voids the statement that composes it.

Whoever knows the seed replays the noise and subtracts it, so no epsilon holds (the same rule as the
optimizers' ``debug_noise_seed``). The accounting itself does not change: ``epsilon_if_noise_were_secret``
is the value the same release with secret noise gives, computed here independently with dp-accounting.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn.preprocessing import private_adapt_normalization
from tfdpbnn.uncertainty import fit_temperature_private, private_conformal_threshold

DELTA = 1e-5
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _trained(n=64, sigma=2.0, norm=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    tf.keras.utils.set_random_seed(0)
    layers = [tf.keras.Input((4,))] + ([norm] if norm is not None else []) + [tf.keras.layers.Dense(2)]
    model = tf.keras.Sequential(layers)
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=n, batch_size=16, delta=DELTA)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return model, optimizer, x, y


def _held_out(model, n=300):
    """Predicted probabilities and labels of ``n`` held-out records, and the records (their features)."""
    rng = np.random.default_rng(1)
    held = rng.normal(size=(n, 4)).astype("float32")
    return tf.nn.softmax(model(held)).numpy(), (held[:, 0] > 0).astype("int64"), held


def _rdp(events):
    return dp_accounting.rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(DELTA)


def test_a_seeded_temperature_voids_the_statement_and_keeps_the_secret_noise_value():
    model, optimizer, _, _ = _trained()
    probs, labels, held = _held_out(model)
    seeded = fit_temperature_private(probs, labels, epsilon=0.5, delta=DELTA, seed=3)
    assert seeded.privacy.replayable_from == "seed=3"
    assert seeded.as_dict()["privacy"]["replayable_from"] == "seed=3"
    before = optimizer.privacy_statement()
    assert before["guarantee"] and math.isfinite(before["epsilon"])
    optimizer.record_release(seeded, x=held, y=labels)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False
    assert statement["epsilon"] == math.inf and statement["quote"]["epsilon"] == math.inf
    assert "seed=3" in statement["guarantee_reason"]
    training = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 1)  # one pass, shuffle
    assert statement["epsilon_if_noise_were_secret"] == pytest.approx(
        _rdp([training, seeded.privacy.dp_event]), rel=1e-3)
    # Carried by the optimizer's config (every model.save format): a restored optimizer is void as well.
    restored = tfdpbnn.DPSGDOptimizer.from_config(optimizer.get_config())
    assert [r.privacy.replayable_from for r, _ in tfdpbnn.record.attributes.releases(restored)] == ["seed=3"]


def test_a_seeded_conformal_threshold_is_marked_and_secret_noise_is_not():
    model, optimizer, _, _ = _trained()
    probs, labels, held = _held_out(model)
    secret = private_conformal_threshold(probs, labels, 0.1, epsilon=0.5, delta=DELTA,
                                         allow_uninformative=True)  # 300 held out: the accounting only
    seeded = private_conformal_threshold(probs, labels, 0.1, epsilon=0.5, delta=DELTA,
                                         seed=np.random.default_rng(4), allow_uninformative=True)
    assert secret.privacy.replayable_from is None
    assert seeded.privacy.replayable_from.startswith("seed=Generator")  # a generator is a seed too
    optimizer.record_release(secret, x=held, y=labels)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is True and math.isfinite(statement["epsilon"])
    optimizer.record_release(seeded, x=held, y=labels)
    assert optimizer.privacy_statement()["guarantee"] is False


def test_a_normalization_adapted_with_a_seed_voids_the_models_statement():
    x = np.random.default_rng(2).normal(size=(64, 4)).astype("float32")
    norm = tf.keras.layers.Normalization()
    private_adapt_normalization(norm, x, epsilon=0.5, delta=DELTA, bounds=(-3.0, 3.0), seed=0)
    _, optimizer, _, _ = _trained(norm=norm)
    statement = optimizer.privacy_statement()
    assert statement["guarantee"] is False and statement["epsilon"] == math.inf
    assert repr(norm.name) in statement["guarantee_reason"]
    assert math.isfinite(statement["epsilon_if_noise_were_secret"])
