"""SI-DPSGD and DP-SGLD under ``MirroredStrategy`` (2 logical CPUs) against the same training on one device.

SI-DPSGD's sound mode failed in ``fit`` (the learning-rate variable created inside the distributed step: an
unfed placeholder), paper mode with ``steps_per_execution=2`` failed on an epoch of fewer steps (no logs
from the step), DP-SGLD's statement failed on the distributed learning rate, and DP-SGD run eagerly was
refused as a second update in a step (each replica's update counted as the step's). Keras 3 refuses
steps_per_execution > 1 under a strategy before the first step. Logical CPU devices must be
set before TensorFlow starts, so the distributed cases run in a fresh process (about 20 s).
"""

from __future__ import annotations

import json
import math
import os
import tempfile

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _fresh_process import run_script

import tfdpbnn
from tfdpbnn import _private_api

HERE = os.path.abspath(__file__)
KERAS3 = _private_api._keras3 is not None


def test_steps_per_execution_above_an_epochs_steps_trains():
    # Keras 2 lowers steps_per_execution to the epoch's 1 step when the loop is traced: the step then
    # returned no logs and the loop failed ("'outputs' must be defined before the loop").
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, 16)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=16, batch_size=16, delta=1e-5)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert opt.steps == 2


@pytest.mark.slow
def test_dp_optimizers_under_mirrored_strategy_state_the_one_device_epsilon():
    r = run_script(HERE)
    sound = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(20.0), 4)).get_epsilon(1e-5)
    from tfdpbnn.privacy.gdp import gdp_epsilon

    paper = gdp_epsilon(math.sqrt(sum((t / 20.0) ** 2 for t in range(1, 5))), 1e-5)
    for where in ("one_device", "mirrored"):
        assert r[where]["sound"] == pytest.approx(sound, rel=1e-6)
        assert r[where]["paper"] == pytest.approx(paper, rel=1e-6)
        assert r[where]["guarantee"] is True
    assert r["mirrored"]["sgld"] == pytest.approx(r["one_device"]["sgld"], rel=1e-9)
    assert r["mirrored"]["sgld_learning_rate"] == pytest.approx(r["one_device"]["sgld_learning_rate"])
    two_passes = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(1.0), 2)).get_epsilon(1e-5)
    for where in ("one_device", "mirrored"):
        assert r[where]["eager"] == pytest.approx(two_passes, rel=1e-6)
        assert (r[where]["eager_steps"], r[where]["eager_examples"]) == (8, 32)
        assert r[where]["guarantee"] is True


def _train(strategy, distributed):
    import warnings

    from tfdpbnn.optimizers.dpsgld import sgld_learning_rate

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, 16)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    out, guarantees = {}, []
    for mode in ("sound", "paper"):
        # A store per run: the layers' noise_stddev, equal in every run here, would link each run's record
        # to the next (an over-count, by design) and the cases would not compare.
        os.environ["TFDPBNN_PRIVACY_STORE"] = os.path.join(tempfile.mkdtemp(), "store.sqlite")
        with strategy.scope(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # paper mode's warning
            model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(3)])
            opt = tfdpbnn.SIDPOptimizer(1.0, 20.0, paper_mean_update=mode == "paper", num_examples=16,
                                        batch_size=16, delta=1e-5, learning_rate=0.05)
            model.compile(optimizer=opt, loss=loss, steps_per_execution=2 if mode == "paper" else 1)
        if KERAS3 and distributed and mode == "paper":  # Keras 3 under a strategy: one step per execution
            with pytest.raises(ValueError, match="steps_per_execution: a DP fit under MirroredStrategy"):
                model.fit(x, y, batch_size=16, epochs=4, verbose=0)
            model.compile(optimizer=opt, loss=loss)
        model.fit(x, y, batch_size=16, epochs=4, verbose=0)
        if mode == "paper":
            opt.release_weights(model)
        statement = opt.privacy_statement(model=model)
        out[mode] = statement["epsilon"]
        guarantees.append(statement["guarantee"])
    os.environ["TFDPBNN_PRIVACY_STORE"] = os.path.join(tempfile.mkdtemp(), "store.sqlite")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
        opt = tfdpbnn.DPSGLDOptimizer(1.0, learning_rate=sgld_learning_rate(1.0, 1.0, 16, 4), num_examples=16,
                                      batch_size=4, delta=1e-5)
        model.compile(optimizer=opt, loss=loss)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    statement = opt.privacy_statement(model=model)
    out.update(sgld=statement["epsilon"], sgld_learning_rate=statement["learning_rate"])
    guarantees.append(statement["guarantee"])
    # DP-SGD run eagerly: every replica makes the step's one update (it was refused as a second update).
    os.environ["TFDPBNN_PRIVACY_STORE"] = os.path.join(tempfile.mkdtemp(), "store.sqlite")
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=16, batch_size=4, delta=1e-5)
        model.compile(optimizer=opt, loss=loss, run_eagerly=True)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    statement = opt.privacy_statement(model=model)
    out.update(eager=statement["epsilon"], eager_steps=opt.steps,
               eager_examples=sum(p["examples"] for p in statement["phases"]),
               guarantee=all(guarantees) and statement["guarantee"])
    return out


def _main():
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    one = _train(tf.distribute.get_strategy(), False)
    mirrored = _train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), True)
    print(json.dumps({"one_device": one, "mirrored": mirrored}))


if __name__ == "__main__":
    _main()
