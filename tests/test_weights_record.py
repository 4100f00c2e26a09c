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
from _tiers import SLOW_ON_KERAS2, slow_on_keras2

import tfdpbnn
from tfdpbnn import _keras_version

_TF_CHECKPOINT = pytest.mark.skipif(_keras_version.KERAS_MAJOR == 3, reason="Keras 3's save_weights writes "
                                    "only .weights.h5 (no TensorFlow checkpoint format)")


def _compile(model, sigma=1.0):
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    return opt


def _three_epochs_with_checkpoints(tmp_path, suffix=".weights.h5"):
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


# fast tier: .weights.h5 (.ckpt into the same model: tests/test_dataset_store.py)
@pytest.mark.parametrize("suffix", [".weights.h5",
                                    pytest.param(".ckpt", marks=[_TF_CHECKPOINT, *SLOW_ON_KERAS2])])
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
    assert opt.privacy_statement()["guarantee"] is False  # written after fit: no epsilon unless asserted
    opt.assert_post_processing("every weight plus 1.0: no data used")
    statement = opt.privacy_statement()
    _assert_weights_and_spent(statement, 2, 2)
    assert "does not hold these weights" in statement["weights"]["note"]


# ------------------------------------------------------------------------ training resumed after a crash
class _Crash(tf.keras.callbacks.Callback):
    """Raises once after batch ``batch`` of epoch ``epoch`` (0-based): a crash mid-epoch."""

    def __init__(self, epoch=1, batch=2):
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            self.at = None
            raise RuntimeError("simulated crash")


def _crash_then_resume(tmp_path, fit_input, opt_kwargs=(), epochs=3):
    """Epoch 1 whole, 3 batches of epoch 2, a crash; then ``fit`` again with the same BackupAndRestore."""
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, **dict(opt_kwargs))
    model.compile(optimizer=opt, loss=LOSS)
    backup = tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        model.fit(*fit_input, epochs=epochs, verbose=0, callbacks=[backup, _Crash()])
    model.fit(*fit_input, epochs=epochs, verbose=0, callbacks=[backup])
    return model, opt


def _crash_with_backup(tmp_path, x, y):
    """A DP fit of 3 epochs with BackupAndRestore that crashes in epoch 2; returns the backup directory."""
    model = small_model()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    backup_dir = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        model.fit(x, y, batch_size=8, epochs=3, verbose=0,
                  callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir), _Crash()])
    return backup_dir


def test_resumed_shuffled_epoch_counts_the_interrupted_partial_pass(tmp_path):
    x, y = small_data()
    _, opt = _crash_then_resume(tmp_path, (x, y, 8))
    # What ran: pass 1 (8 steps), 3 steps of pass 2 (24 examples), then after the restore to the end of pass
    # 1 a freshly shuffled pass 2 and pass 3: an example of the 24 took part in 4 steps (worst case).
    assert opt.ledger.steps == 8 + 3 + 16
    assert [(p.steps, p.participations) for p in opt.ledger.phases] == [(8, 1), (3, 1), (16, 2)]
    true_epsilon = gaussians_epsilon(1.0, 4)
    assert opt.epsilon() == pytest.approx(true_epsilon, rel=0.01)
    assert opt.epsilon() >= true_epsilon * (1 - 1e-6)


@pytest.mark.skipif(_keras_version.KERAS_MAJOR == 3, reason="Keras 3's BackupAndRestore writes .weights.h5 "
                    "files, not the TensorFlow checkpoint this test reads by its Keras 2 keys")
@slow_on_keras2   # a resumed run: the partial pass and the new model's inheritance have their own tests here
def test_resumed_run_in_a_new_model_from_the_backup_counts_the_partial_pass(tmp_path):
    x, y = small_data()
    backup_dir = _crash_with_backup(tmp_path, x, y)
    # As a new process would: a new model and optimizer, the backup (weights and optimizer state) restored.
    path = (tf.train.latest_checkpoint(os.path.join(backup_dir, "chief"))
            or tf.train.latest_checkpoint(backup_dir))
    for with_optimizer_state in (True, False):
        fresh = small_model(seed=1)
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
        fresh.compile(optimizer=opt, loss=LOSS)
        if with_optimizer_state:
            tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
        else:  # only the weights, read from the backup's files
            reader = tf.train.load_checkpoint(path)
            key = "model/layer_with_weights-0/{}/.ATTRIBUTES/VARIABLE_VALUE"
            fresh.set_weights([reader.get_tensor(key.format(name)) for name in ("kernel", "bias")])
        assert opt.privacy_statement(model=fresh)["weights"]["steps"] == 8  # the backup is at epoch 1's end
        fresh.fit(x, y, batch_size=8, epochs=2, verbose=0)  # the two epochs left
        assert opt.ledger.steps == 8 + 3 + 16
        assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 4), rel=0.01)


def test_resumed_poisson_run_counts_every_step_that_ran(tmp_path):
    import dp_accounting
    from _small_runs import rdp_epsilon

    x, y = small_data()
    q = 8 / N
    data = tfdpbnn.data.poisson_batches(x, y, sample_rate=q, steps_per_epoch=8)
    _, opt = _crash_then_resume(tmp_path, (data,), {"sampling": "poisson"})
    assert opt.ledger.steps == 8 + 3 + 16  # the 3 steps the restore took off ran and are counted
    expected = rdp_epsilon(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0)), 27))
    assert opt.epsilon() == pytest.approx(expected, rel=0.01)


def test_new_model_resuming_from_an_earlier_runs_backup_inherits_its_record(tmp_path):
    x, y = small_data()
    backup_dir = _crash_with_backup(tmp_path, x, y)
    # As a new process would: a new model and optimizer, fit with the same BackupAndRestore directory.
    fresh = small_model(seed=1)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    fresh.compile(optimizer=opt, loss=LOSS)
    fresh.fit(x, y, batch_size=8, epochs=3, verbose=0,
              callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir)])
    assert opt.ledger.steps == 8 + 3 + 16
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 4), rel=0.01)


# ------------------------------------------------------------------------------ other paths of the weights
def test_load_model_with_compile_keeps_the_record_and_the_uncovered_releases(tmp_path):
    x, y = small_data()
    model = small_model()
    first = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                   release_training_metrics=("loss",))
    model.compile(optimizer=first, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=small_data(n=8, seed=1))
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    opt = loaded.optimizer
    assert opt is not first
    statement = opt.privacy_statement(model=loaded)
    _assert_weights_and_spent(statement, 2, 2)
    assert set(statement["not_covered"]["releases"]) == {"training_metrics", "validation_data"}
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    _assert_weights_and_spent(opt.privacy_statement(), 3, 3)


def test_load_model_without_compile_then_a_new_optimizer_states_the_record_before_training(tmp_path):
    x, y = small_data()
    model = small_model()
    _compile(model)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"), compile=False)
    opt = _compile(loaded)
    _assert_weights_and_spent(opt.privacy_statement(model=loaded), 2, 2)


# --------------------------------------------------------------------- training metrics are not released
class _Seen(tf.keras.callbacks.Callback):
    """Keeps the log keys every batch end and epoch end showed it."""

    def __init__(self):
        super().__init__()
        self.batch_keys, self.epoch_keys = set(), set()

    def on_train_batch_end(self, batch, logs=None):
        self.batch_keys |= set(logs or {})

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_keys |= set(logs or {})


def _fit_logged(release=False, optimizer=None):
    x, y = small_data(n=80)
    model = small_model()
    opt = optimizer or tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, delta=DELTA,
                                              release_training_metrics=release)
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
    seen = _Seen()
    history = model.fit(x[:64], y[:64], batch_size=8, epochs=2, verbose=0, callbacks=[seen],
                        validation_data=(x[64:], y[64:]))
    return history.history, seen, opt


def test_dp_fit_logs_hold_epsilon_and_validation_but_no_training_metrics():
    history, seen, opt = _fit_logged()
    assert set(history) == {"epsilon", "val_loss", "val_accuracy"}
    assert seen.batch_keys == set()
    assert seen.epoch_keys == set(history)
    assert "training_metrics" not in opt.privacy_statement()["not_covered"]["releases"]
    assert "validation_data" in opt.privacy_statement()["not_covered"]["releases"]


def test_training_metrics_released_by_name_are_named_in_the_statement():
    history, seen, opt = _fit_logged(release=("loss",))
    assert set(history) == {"epsilon", "loss", "val_loss", "val_accuracy"}
    assert seen.batch_keys == {"loss"}
    released = opt.privacy_statement()["not_covered"]["releases"]["training_metrics"]
    assert released.endswith(": loss")
    history, _, opt = _fit_logged(release=True)
    assert {"loss", "accuracy", "epsilon"} <= set(history)
    with pytest.raises(ValueError, match="release_training_metrics: \\['acc'\\]"):
        _fit_logged(release=("acc",))
    with pytest.raises(ValueError, match="release_training_metrics must be"):
        tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, release_training_metrics=3)


def test_release_setting_survives_get_config_and_non_dp_fits_are_unaffected():
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, release_training_metrics=["loss"])
    assert tfdpbnn.DPSGDOptimizer.from_config(opt.get_config()).release_training_metrics == ["loss"]
    history, seen, _ = _fit_logged(optimizer=tf.keras.optimizers.SGD(0.1))
    assert {"loss", "accuracy"} <= set(history) and {"loss", "accuracy"} <= seen.batch_keys


def test_asserted_sampling_survives_load_model(tmp_path):
    x, y = small_data()
    model = small_model()
    _compile(model)
    pipeline = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N).batch(8),
                                            "shuffle", num_examples=N)
    model.fit(pipeline, epochs=1, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"))
    statement = loaded.optimizer.privacy_statement(model=loaded)
    assert len(statement["asserted_by_user"]) == 1
    assert statement["asserted_by_user"] == model.optimizer.privacy_statement()["asserted_by_user"]
