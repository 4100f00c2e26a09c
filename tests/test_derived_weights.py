"""Derived weights keep their earlier spending: ``ledger_bound`` (and ``quote``) is at or above the truth.

Weights saved mid-pass by ``ModelCheckpoint`` or ``BackupAndRestore`` (an integer ``save_freq``) are
those of a snapshot the record takes before each batch end where such a saver saves; weights rounded to
float16 and a trained body under a new head are found by their variables' keys (each variable's float16
and bfloat16 rounding, ``tfdpbnn.record.store.variable_fingerprints``); either way the per-record ledger
holds every release on their records. Truth: the participations of the worst-placed record over every run
whose weights the derived model carries, counted here, composed with dp-accounting.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, gaussians_epsilon, small_data, small_model

import tfdpbnn

SIGMA, B = 1.0, 8


def _train(model, x, y, epochs, callbacks=()):
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=B, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=B, epochs=epochs, verbose=0, callbacks=list(callbacks))
    return opt


def _check(statement, truth, found=False):
    if found:  # a variable of the recorded run's (rounded) values: its phases are in the run's own record
        assert statement["run_epsilon"] >= truth * (1 - 1e-6)
    else:
        assert statement["run_epsilon"] < truth * 0.9             # the run alone forgets the earlier one
    assert statement["ledger_bound"]["epsilon"] >= truth * (1 - 1e-6)
    assert statement["quote"]["which"] == "ledger_bound"
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-6)


def test_float16_rounded_weights_and_a_copied_layer_continue_with_their_spending():
    x, y = small_data()
    first = small_model()
    _train(first, x, y, epochs=3)                                   # 3 passes
    rounded = small_model(seed=3)
    rounded.set_weights([w.astype(np.float16).astype(np.float32) for w in first.get_weights()])
    statement = _train(rounded, x, y, epochs=1).privacy_statement()
    _check(statement, gaussians_epsilon(SIGMA, 4), found=True)     # 10.73 (4.73 alone before)


def test_a_trained_body_under_a_new_head_keeps_its_spending():
    x, y = small_data()
    body = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(6, activation="tanh"),
                                tf.keras.layers.Dense(3)])
    _train(body, x, y, epochs=3)
    tf.keras.utils.set_random_seed(9)
    headed = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(6, activation="tanh"),
                                  tf.keras.layers.Dense(3)])
    headed.layers[0].set_weights(body.layers[0].get_weights())    # the body copied, a fresh head
    statement = _train(headed, x, y, epochs=1).privacy_statement()
    _check(statement, gaussians_epsilon(SIGMA, 4), found=True)


def test_weights_saved_mid_pass_continue_with_the_whole_earlier_run(tmp_path):
    x, y = small_data()
    first = small_model()
    path = str(tmp_path / "mid.weights.h5")
    saver = tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True, save_freq=5)
    _train(first, x, y, epochs=3, callbacks=[saver])               # saves at steps 5, 10, 15, 20 (mid-pass)
    resumed = small_model(seed=4)
    resumed.load_weights(path)
    statement = _train(resumed, x, y, epochs=1).privacy_statement()
    # The weights at step 20 carry 3 passes (steps 1-8, 9-16, 17-20); an upper bound counts all 3.
    _check(statement, gaussians_epsilon(SIGMA, 4), found=True)
    assert statement["ledger_bound"]["epsilon"] == pytest.approx(gaussians_epsilon(SIGMA, 4), rel=0.01)


def test_weights_saved_mid_pass_and_trained_on_other_records_keep_their_spending(tmp_path):
    # Fine-tuned on other records, only the weights' own record knows the first records' 3 participations
    # (4.73 was printed, for the new records' one pass: the mid-pass weights were no snapshot's).
    x, y = small_data()
    other_x, other_y = small_data(seed=1)
    path = str(tmp_path / "mid.weights.h5")
    saver = tf.keras.callbacks.ModelCheckpoint(path, save_weights_only=True, save_freq=20)
    _train(small_model(), x, y, epochs=3, callbacks=[saver])       # saved at step 20, in the third pass
    resumed = small_model(seed=4)
    resumed.load_weights(path)
    statement = _train(resumed, other_x, other_y, epochs=1).privacy_statement()
    assert statement["weights"]["steps"] >= 20
    for value in (statement["epsilon"], statement["quote"]["epsilon"]):
        assert value >= gaussians_epsilon(SIGMA, 3) * (1 - 1e-6)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_batch_end_snapshots_come_before_every_batch_save_and_only_there(tmp_path, steps_per_execution):
    # A ModelCheckpoint every 5 batches and a BackupAndRestore every 3, over 3 passes of 8 steps (the
    # counters run across epochs; with steps_per_execution=3 Keras sees batches 2, 5, 7 of each pass).
    from tfdpbnn.record import attributes

    x, y = small_data()
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=B, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS, steps_per_execution=steps_per_execution)
    saves = tmp_path / "saves"  # the savers' files alone (the record store may be in tmp_path)
    checkpoint = tf.keras.callbacks.ModelCheckpoint(str(saves / "w.weights.h5"), save_weights_only=True,
                                                    save_freq=5)
    backup = tf.keras.callbacks.BackupAndRestore(str(saves / "backup"), save_freq=3)
    saved, snapshots = [], []

    class SaveSpy(tf.keras.callbacks.Callback):  # after both savers: did either write the weights now?
        def __init__(self):
            super().__init__()
            self.files = []

        def on_train_batch_end(self, batch, logs=None):
            files = sorted((str(p), p.stat().st_mtime_ns) for p in saves.rglob("*") if p.is_file())
            if files != self.files:
                saved.append(int(opt.iterations.numpy()))
            self.files = files

    record = attributes.run_record(opt)
    snapshot = record.snapshot

    def counted(model, final=False):
        snapshots.append(int(opt.iterations.numpy()))
        return snapshot(model, final=final)

    record.snapshot = counted
    model.fit(x, y, batch_size=B, epochs=3, verbose=0, callbacks=[checkpoint, backup, SaveSpy()])
    assert saved and set(saved) <= set(snapshots)
    # Every other snapshot is an epoch end's or the final one: not one at every batch end.
    assert len(snapshots) <= len(set(saved)) + 3 + 1


def test_a_saver_with_a_batch_hook_of_its_own_is_snapshot_before_at_every_batch(tmp_path):
    from tfdpbnn import _adapters

    class OwnHook(tf.keras.callbacks.ModelCheckpoint):
        def on_train_batch_end(self, batch, logs=None):  # saves whenever it likes
            self.model.save_weights(self.filepath)

    keras_own = tf.keras.callbacks.ModelCheckpoint(str(tmp_path / "a.weights.h5"), save_freq=4)
    own = OwnHook(str(tmp_path / "b.weights.h5"), save_freq=4)
    adapter = _adapters.current()
    # Keras's counters: batches 0, 1, 2 of a pass are no save; the fourth batch end is (read, not advanced).
    assert [adapter.saves_after_batch(keras_own, b) for b in (0, 1, 2, 3)] == [False, False, False, True]
    keras_own._should_save_on_batch(1)   # the saver itself at batch 1: 2 batches seen
    assert [adapter.saves_after_batch(keras_own, b) for b in (2, 3)] == [False, True]
    assert keras_own._should_save_on_batch(2) is False       # its own counters were not advanced
    assert all(adapter.saves_after_batch(own, b) for b in (0, 1, 2))
