"""Trainable weights written after a DP run returned, before the statement, and between train_on_batch calls.

Each write sets a weight from the training data (its feature means): the model would release them exactly,
with no noise, so no epsilon holds (truth: infinite). The statement says so by name unless the weights are
the last DP step's, an epoch end's, weights the privacy record holds (``load_weights`` of a recorded
checkpoint), or the user asserted the change used no private data (``assert_post_processing``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, custom_loop_step, small_data

import tfdpbnn


def _model():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    return model


def _write_from_data(model, x):
    model.layers[-1].kernel.assign(np.tile(x.mean(axis=0)[:, None], (1, 3)))


def _no_guarantee(statement):
    assert statement["guarantee"] is False
    assert math.isinf(statement["epsilon"]) and math.isinf(statement["quote"]["epsilon"])
    assert "kernel" in statement["guarantee_reason"]
    assert "after the last DP step" in statement["guarantee_reason"]
    assert np.isfinite(statement["epsilon_if_state_were_untouched"])


def test_a_weight_written_after_fit_voids_the_statement_unless_asserted():
    x, y = small_data()
    model = _model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    clean = model.optimizer.privacy_statement()
    assert clean["guarantee"] is True and np.isfinite(clean["epsilon"])
    _write_from_data(model, x)
    _no_guarantee(model.optimizer.privacy_statement())
    # asserted by name: the guarantee holds again, the reason is listed, the epsilon is the run's
    model.optimizer.assert_post_processing("kernel rounded to 3 decimals (no data used)")
    asserted = model.optimizer.privacy_statement()
    assert asserted["guarantee"] is True
    assert asserted["epsilon"] == pytest.approx(clean["epsilon"], rel=1e-6)
    assert any("rounded to 3 decimals" in a for a in asserted["asserted_by_user"])
    # the assertion covers those exact weights only: a later write voids the statement again
    model.layers[-1].bias.assign(y[:3].astype(np.float32))
    assert model.optimizer.privacy_statement()["guarantee"] is False


def test_a_weight_written_after_a_custom_loop_voids_the_statement():
    x, y = small_data()
    model = _model()
    opt = model.optimizer
    step = custom_loop_step(model, x, y)

    step(x[:8], y[:8])
    step(x[8:16], y[8:16])
    assert opt.privacy_statement(model=model)["guarantee"] is True
    _write_from_data(model, x)  # after the loop's last step, no step follows
    _no_guarantee(opt.privacy_statement(model=model))


def test_weights_the_record_or_an_epoch_end_holds_are_accepted_after_fit(tmp_path):
    x, y = small_data()
    model = _model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    recorded = str(tmp_path / "first.weights.h5")
    model.save_weights(recorded)
    kept = {}

    class KeepFirstEpoch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                kept["weights"] = model.get_weights()

    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[KeepFirstEpoch()])
    model.set_weights(kept["weights"])  # an epoch end's weights (post-processing of a release)
    assert model.optimizer.privacy_statement()["guarantee"] is True
    model.load_weights(recorded)  # the first fit's final weights, which the record store holds
    assert model.optimizer.privacy_statement()["guarantee"] is True


def test_a_weight_written_between_train_on_batch_calls_is_refused():
    x, y = small_data()
    model = _model()
    model.train_on_batch(x[:8], y[:8])
    _write_from_data(model, x)
    with pytest.raises(ValueError, match="kernel"):
        model.train_on_batch(x[8:16], y[8:16])
    assert model.optimizer.steps == 1
    statement = model.optimizer.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["epsilon"])
    assert "kernel" in statement["guarantee_reason"]


def test_train_on_batch_accepts_recorded_weights_and_assertions_between_calls():
    x, y = small_data()
    model = _model()
    model.train_on_batch(x[:8], y[:8])
    first = model.get_weights()  # the first call's DP write, which the record store holds
    model.train_on_batch(x[8:16], y[8:16])
    model.set_weights(first)
    model.train_on_batch(x[16:24], y[16:24])
    model.layers[-1].kernel.assign(model.layers[-1].kernel * 0.5)
    model.optimizer.assert_post_processing("kernel halved (no data used)")
    model.train_on_batch(x[24:32], y[24:32])
    statement = model.optimizer.privacy_statement()
    assert statement["guarantee"] is True and model.optimizer.steps == 4
    assert any("kernel halved" in a for a in statement["asserted_by_user"])


@pytest.mark.parametrize("reason", ["", "  ", None, 3])
def test_assert_post_processing_needs_a_reason(reason):
    with pytest.raises(ValueError, match="reason must be a non-empty string"):
        _model().optimizer.assert_post_processing(reason)


def test_the_library_post_processing_after_fit_keeps_the_guarantee():
    # SI-DPSGD's release_weights (a sample around the DP-trained means) and IterateAverage's swap at the end
    # of fit (the average of the DP iterates) write the weights from DP releases only.
    from tfdpbnn.uncertainty.iterates import IterateAverage

    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tfdpbnn.layers.NoisyDense(3)])
    opt = tfdpbnn.SIDPOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    kernel = model.layers[0].kernel.numpy()
    opt.release_weights(model)
    assert not np.allclose(kernel, model.layers[0].kernel.numpy())
    assert opt.privacy_statement()["guarantee"] is True
    model = _model()
    average = IterateAverage(0.5, swap_at_end=True)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[average])
    assert model.optimizer.privacy_statement()["guarantee"] is True
