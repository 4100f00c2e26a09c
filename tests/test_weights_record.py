"""The record travels with the weights: which steps produced the weights in hand, and which were spent.

The record is append-only: loading older weights does not erase the steps taken after them (their releases,
logs and saved files, happened). The privacy statement's ``spent`` is everything, ``weights`` the training
behind the weights in hand. Epsilons are compared (rel. 1%) with independent dp-accounting computations.
"""

from __future__ import annotations

import json
import os

import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, small_data, small_model

import tfdpbnn


def _compile(model, sigma=1.0):
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    return opt


def _three_epochs_with_checkpoints(tmp_path, suffix=".h5"):
    """Three passes, the weights saved at every epoch end; returns the first optimizer and the paths."""
    x, y = small_data()
    model = small_model()
    first = _compile(model)
    pattern = str(tmp_path / ("w{epoch}" + suffix))
    model.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=[tf.keras.callbacks.ModelCheckpoint(pattern, save_weights_only=True)])
    return model, first, [pattern.format(epoch=e) for e in (1, 2, 3)]


def _assert_weights_and_spent(statement, weight_passes, spent_passes):
    assert statement["weights"]["steps"] == 8 * weight_passes
    assert statement["spent"]["steps"] == 8 * spent_passes
    assert statement["weights"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, weight_passes), rel=0.01)
    assert statement["spent"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, spent_passes), rel=0.01)
    assert statement["epsilon"] == statement["spent"]["epsilon"]


def test_statement_of_the_trained_model_names_its_weights_and_what_was_spent(tmp_path):
    _, first, _ = _three_epochs_with_checkpoints(tmp_path)
    _assert_weights_and_spent(first.privacy_statement(), 3, 3)


@pytest.mark.parametrize("suffix", [".h5", ".ckpt"])
def test_older_weights_loaded_into_a_new_model_keep_what_was_spent_after_them(tmp_path, suffix):
    _, _, paths = _three_epochs_with_checkpoints(tmp_path, suffix)
    fresh = small_model(seed=1)
    fresh.load_weights(paths[0])  # the epoch-1 weights
    opt = _compile(fresh)
    statement = opt.privacy_statement(model=fresh)
    _assert_weights_and_spent(statement, 1, 3)
    # Training on from them: this pass adds to both.
    x, y = small_data()
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)
    _assert_weights_and_spent(opt.privacy_statement(), 4, 4)


def test_load_weights_into_the_trained_model_rewinds_the_weights_not_the_spending(tmp_path):
    model, first, paths = _three_epochs_with_checkpoints(tmp_path)
    model.load_weights(paths[1])  # the epoch-2 weights, into the model the optimizer trained
    _assert_weights_and_spent(first.privacy_statement(), 2, 3)


def test_exported_privacy_json_names_the_weights_and_what_was_spent(tmp_path):
    _, _, paths = _three_epochs_with_checkpoints(tmp_path)
    fresh = small_model(seed=1)
    fresh.load_weights(paths[0])
    _compile(fresh)  # a new DP optimizer, no step taken: the export still carries the whole record
    tfdpbnn.export_saved_model(fresh, str(tmp_path / "export"), num_samples=2)
    with open(os.path.join(tmp_path, "export", "assets", "privacy.json")) as fh:
        privacy = json.load(fh)
    _assert_weights_and_spent(privacy, 1, 3)


def test_weights_unknown_to_the_store_are_counted_as_everything_spent(monkeypatch):
    x, y = small_data()
    model = small_model()
    opt = _compile(model)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    model.set_weights([w + 1.0 for w in model.get_weights()])  # weights no run wrote
    statement = opt.privacy_statement()
    _assert_weights_and_spent(statement, 2, 2)
    assert "does not hold these weights" in statement["weights"]["note"]
