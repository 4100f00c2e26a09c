"""The privacy record store: the record travels with the weights, and a data set's budget across runs.

Epsilons are compared (rel. 1%) with an independent dp-accounting computation of every step that ran.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, rdp_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn import _keras_version
from tfdpbnn.record import store as record_store

_TF_CHECKPOINT = pytest.mark.skipif(_keras_version.KERAS_MAJOR == 3, reason="Keras 3's save_weights writes "
                                    "only .weights.h5 (no TensorFlow checkpoint format)")


def _compile(model, sigma=1.0):
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    return opt


def _train_first(epochs=2):
    x, y = small_data()
    model = small_model()
    _compile(model)
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
    return model, x, y


# ------------------------------------------------------------------- the record travels with the weights
def test_set_weights_into_a_clone_inherits_the_record():
    model, x, y = _train_first(epochs=2)
    clone = tf.keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    opt = _compile(clone)
    clone.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


def test_load_model_without_compile_inherits_the_record(tmp_path):
    model, x, y = _train_first(epochs=2)
    model.save(str(tmp_path / "m.keras"))
    loaded = tf.keras.models.load_model(str(tmp_path / "m.keras"), compile=False)
    opt = _compile(loaded, sigma=2.0)
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    expected = rdp_epsilon(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 2),
        dp_accounting.GaussianDpEvent(2.0)]))
    assert opt.epsilon() == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("suffix", [".weights.h5", pytest.param("ckpt", marks=_TF_CHECKPOINT)])
def test_load_weights_of_an_earlier_checkpoint_keeps_what_was_spent_after_it(tmp_path, suffix):
    x, y = small_data()
    model = small_model()
    first = _compile(model)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = str(tmp_path / f"w{suffix}")
    model.save_weights(path)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0)  # 3 more passes, released (metrics, files)
    assert first.epsilon() == pytest.approx(gaussians_epsilon(1.0, 4), rel=0.01)
    fresh = small_model(seed=1)
    fresh.load_weights(path)
    opt = _compile(fresh)
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # The earlier optimizer's 4 passes (not only the 1 before the checkpoint) plus this one.
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 5), rel=0.01)


def test_tf_train_checkpoint_of_the_model_alone_inherits(tmp_path):
    model, x, y = _train_first(epochs=2)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    fresh = small_model(seed=3)
    tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
    opt = _compile(fresh)
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


def test_same_optimizer_continuing_is_not_counted_twice():
    x, y = small_data()
    model = small_model()
    opt = _compile(model)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


# ----------------------------------------------------------------------------- a data set's budget
def test_dataset_budget_refuses_a_run_before_its_first_step():
    model, x, y = _train_first(epochs=2)
    fingerprint = record_store.data_fingerprint(x, y)
    store = record_store.default_store()
    assert store.dataset_epsilon(fingerprint, DELTA) == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)
    store.set_budget(fingerprint, gaussians_epsilon(1.0, 3) * 1.001, DELTA)
    other = small_model(seed=5)  # new weights: nothing inherited, but the same data
    opt = _compile(other)
    before = [w.copy() for w in other.get_weights()]
    with pytest.raises(ValueError, match="dataset budget"):
        other.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert opt.steps == 0
    for w, b in zip(other.get_weights(), before, strict=True):
        np.testing.assert_array_equal(w, b)
    other.fit(x, y, batch_size=8, epochs=1, verbose=0)  # one pass still fits the budget
    assert store.dataset_epsilon(fingerprint, DELTA) == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)
    record = opt.privacy_statement()["record"]
    assert record["runs"] == 2 and record["runs_not_ended"] == 0
    assert record["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


def test_poisson_batches_carry_the_data_fingerprint():
    x, y = small_data()
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125)
    assert record_store.input_fingerprint(batches.prefetch(1)) == record_store.data_fingerprint(x, y)


def test_a_data_set_budget_holds_for_poisson_batches_with_sample_weights():
    # poisson_batches hashed its sample weights into the data set's fingerprint: a budget set on
    # data_fingerprint(x, y) did not see weighted runs (3 epochs trained, 5.41 spent against a budget of 3).
    x, y = small_data()
    weights = np.ones(N, "float32")
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125, sample_weight=weights)
    assert record_store.input_fingerprint(batches) == record_store.data_fingerprint(x, y)
    store = record_store.default_store()
    store.set_budget(record_store.data_fingerprint(x, y), 3.0, DELTA)
    truth = rdp_epsilon(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.125, dp_accounting.GaussianDpEvent(1.0)), 24))
    assert truth > 5.0
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, sampling="poisson")
    model.compile(optimizer=opt, loss=LOSS)
    with pytest.raises(ValueError, match="dataset budget"):
        model.fit(batches, epochs=3, verbose=0)
    assert opt.steps == 0


def test_store_off_keeps_no_record(monkeypatch):
    monkeypatch.setenv(record_store.ENV_VAR, "off")
    model, _, _ = _train_first(epochs=1)
    assert model.optimizer.privacy_statement()["record"]["store"] is None


_CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np, tensorflow as tf, tfdpbnn
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, 64)
    tf.keras.utils.set_random_seed(int(sys.argv[1]))
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, delta=1e-5)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Slow(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print("epoch", epoch, flush=True)
            time.sleep(float(sys.argv[3]))

    model.fit(x, y, batch_size=8, epochs=int(sys.argv[2]), verbose=0, callbacks=[Slow()])
""")


def _child(seed, epochs, sleep=0.0, log=os.devnull):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(sys.path))
    with open(log, "w") as err:  # a file, never a pipe nobody reads (a full pipe would block the child)
        return subprocess.Popen([sys.executable, "-c", _CHILD, str(seed), str(epochs), str(sleep)],
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True)


def _tail(path):
    with open(path) as fh:
        return fh.read()[-3000:]


@pytest.mark.slow
def test_two_processes_see_each_others_runs_and_a_killed_one_leaves_whole_rows(tmp_path):
    x, y = small_data()
    fingerprint = record_store.data_fingerprint(x, y)
    logs = [str(tmp_path / f"child{i}.log") for i in (1, 2)]
    first, second = _child(1, 1, log=logs[0]), _child(2, 2, log=logs[1])
    assert first.wait(timeout=300) == 0, _tail(logs[0])
    assert second.wait(timeout=300) == 0, _tail(logs[1])
    store = record_store.default_store()
    runs = store.runs(fingerprint)
    assert len(runs) == 2 and all(r["ended"] for r in runs) and len({r["pid"] for r in runs}) == 2
    assert store.dataset_epsilon(fingerprint, DELTA) == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)
    # A process killed during its run: the store stays whole, and the run counts its planned 5 passes.
    killed = _child(3, 5, sleep=60.0)
    assert killed.stdout.readline().startswith("epoch 0")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    with sqlite3.connect(record_store.default_path()) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    runs = store.runs(fingerprint)
    assert len(runs) == 3 and [r["ended"] for r in runs].count(False) == 1
    assert store.dataset_epsilon(fingerprint, DELTA) == pytest.approx(gaussians_epsilon(1.0, 8), rel=0.01)
    # The budget set now is spent: a new run in this process is refused before its first step.
    store.set_budget(fingerprint, gaussians_epsilon(1.0, 8) * 1.001, DELTA)
    model = small_model(seed=9)
    opt = _compile(model)
    with pytest.raises(ValueError, match="dataset budget"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.steps == 0
