"""A SavedModel exported by tfdpbnn on TensorFlow 2.15 loads, serves and states its privacy on this TF.

The fixture (``tests/fixtures/savedmodel_tf2.15``) was written on the oldest supported set by
``tests/fixtures/make_savedmodel_tf2_15.py``: a DPVD classifier on DIGITS after 5 DP steps, its outputs on ten
test images and a 4,000-sample Monte Carlo mean recorded beside it (``savedmodel_tf2.15.json``).
"""

from __future__ import annotations

import json
import pathlib

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32

from tfdpbnn import _keras_version
from tfdpbnn.uncertainty import mc_predict

HERE = pathlib.Path(__file__).resolve().parent / "fixtures"
PATH = HERE / "savedmodel_tf2.15"
RECORD = json.loads((HERE / "savedmodel_tf2.15.json").read_text())
X = np.asarray(RECORD["x"], dtype=np.float32)


def test_fixture_comes_from_the_oldest_set():
    assert RECORD["versions"]["tensorflow"] == "2.15.1"


def test_serving_signatures_reproduce_the_recorded_outputs():
    served = tf.saved_model.load(str(PATH))
    assert set(served.signatures) == {"serving_default", "mc_predict"}
    det = served.signatures["serving_default"](x=tf.constant(X))["output"].numpy()
    np.testing.assert_allclose(det, RECORD["serving_default"], **F32)
    mc = served.signatures["mc_predict"](x=tf.constant(X), num_samples=tf.constant(4000))
    mean = mc["mean"].numpy()
    np.testing.assert_allclose(mean.sum(axis=1), 1.0, **F32)
    # two independent 4,000-sample means of probabilities (per-sample std <= 0.5): the difference has s.e.
    # <= 0.5 * sqrt(2 / 4000) = 0.011; tolerance 0.05 is 4.5 s.e.
    np.testing.assert_allclose(mean, RECORD["mc_mean_4000"], atol=0.05)
    assert np.all(mc["mutual_information"].numpy() >= -1e-6)
    # sampling is live in the served graph: two small draws differ
    a = served.signatures["mc_predict"](x=tf.constant(X), num_samples=tf.constant(2))["mean"].numpy()
    b = served.signatures["mc_predict"](x=tf.constant(X), num_samples=tf.constant(2))["mean"].numpy()
    assert not np.allclose(a, b)


@pytest.mark.skipif(_keras_version.KERAS_MAJOR != 2,
                    reason="Keras 3's load_model reads only .keras and .h5 files, not a Keras 2 SavedModel "
                           "(its signatures are tested here through tf.saved_model.load on every set)")
def test_keras_reload_gives_the_recorded_outputs():
    model = tf.keras.models.load_model(str(PATH))
    np.testing.assert_allclose(model(X).numpy(), RECORD["serving_default"], **F32)
    probs = mc_predict(model, X, num_samples=2000, from_logits=True).mean
    np.testing.assert_allclose(probs, RECORD["mc_mean_4000"], atol=0.05)


def test_privacy_json_reads_the_same_and_its_epsilon_recomputes():
    privacy = json.loads((PATH / "assets" / "privacy.json").read_text())
    assert privacy == RECORD["privacy"]
    [phase] = privacy["phases"]
    assert phase["kind"] == "poisson" and phase["steps"] == privacy["steps"] == 5
    # an independent dp-accounting computation of what the statement says ran, on this machine's versions
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(phase["sample_rate"],
                                            dp_accounting.GaussianDpEvent(phase["noise_multiplier"])),
        phase["steps"])
    rdp = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(privacy["delta"])
    assert privacy["epsilon_by_accountant"]["rdp"] == pytest.approx(rdp, rel=1e-6)
    pld = dp_accounting.pld.PLDAccountant().compose(event).get_epsilon(privacy["delta"])
    assert privacy["epsilon_by_accountant"]["pld"] == pytest.approx(pld, rel=1e-3)
