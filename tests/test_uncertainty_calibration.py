"""ECE / MCE against hand-computed values, Keras metrics, reliability diagram, bad input."""

import numpy as np
import pytest
import tensorflow as tf

from tfdpbnn.uncertainty import (
    ExpectedCalibrationError,
    MaximumCalibrationError,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_diagram,
)

PROBS = np.array([[0.9, 0.05, 0.05],   # label 0: correct, confidence 0.9
                  [0.2, 0.7, 0.1],     # label 0: wrong,   confidence 0.7
                  [0.4, 0.3, 0.3],     # label 0: correct, confidence 0.4
                  [0.3, 0.45, 0.25]])  # label 1: correct, confidence 0.45
LABELS = np.array([0, 0, 0, 1])


def test_ece_mce_hand_computed():
    # 2 bins: (0, .5] holds rows 3, 4 (acc 1, conf .425); (.5, 1] rows 1, 2 (acc .5, conf .8)
    assert expected_calibration_error(PROBS, LABELS, num_bins=2) == pytest.approx(0.5 * 0.575 + 0.5 * 0.3)
    assert maximum_calibration_error(PROBS, LABELS, num_bins=2) == pytest.approx(0.575)
    # 10 bins: every row alone; gaps .1, .7, .6, .55
    assert expected_calibration_error(PROBS, LABELS, num_bins=10) == pytest.approx(1.95 / 4)
    assert maximum_calibration_error(PROBS, LABELS, num_bins=10) == pytest.approx(0.7)
    one_hot = np.eye(3)[LABELS]
    assert expected_calibration_error(PROBS, one_hot, num_bins=2) == pytest.approx(0.4375)
    # a perfectly calibrated toy set: confidence 0.75 in one bin, 3 of 4 correct
    p = np.tile([[0.75, 0.25]], (4, 1))
    assert expected_calibration_error(p, [0, 0, 0, 1], num_bins=4) == pytest.approx(0.0)


@pytest.mark.parametrize("num_bins", [2, 10])
def test_keras_metrics_match_functions(num_bins):
    ece, mce = ExpectedCalibrationError(num_bins=num_bins), MaximumCalibrationError(num_bins=num_bins)
    for metric in (ece, mce):
        metric.update_state(LABELS[:2], PROBS[:2])
        metric.update_state(LABELS[2:].reshape(-1, 1), PROBS[2:])
    expected = expected_calibration_error(PROBS, LABELS, num_bins)
    assert ece.result().numpy() == pytest.approx(expected, abs=1e-6)
    assert mce.result().numpy() == pytest.approx(maximum_calibration_error(PROBS, LABELS, num_bins), abs=1e-6)
    ece.reset_state()
    ece.update_state(tf.one_hot(LABELS, 3), PROBS)
    expected = expected_calibration_error(PROBS, LABELS, num_bins)
    assert ece.result().numpy() == pytest.approx(expected, abs=1e-6)
    assert ExpectedCalibrationError.from_config(ece.get_config()).num_bins == num_bins


def test_reliability_diagram_returns_a_figure_and_saves_on_request(tmp_path):
    from matplotlib.figure import Figure

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 4)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = rng.integers(0, 4, size=200)
    fig = reliability_diagram(probs, labels, num_bins=8)
    assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 2 * 8  # accuracy and gap bars per bin
    path = tmp_path / "rel.png"
    assert isinstance(reliability_diagram(probs, labels, str(path), num_bins=8), Figure)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_one_default_bin_count():
    import inspect

    from tfdpbnn.uncertainty.calibration import DEFAULT_NUM_BINS

    functions = (expected_calibration_error, maximum_calibration_error, reliability_diagram,
                 ExpectedCalibrationError.__init__, MaximumCalibrationError.__init__)
    assert {inspect.signature(f).parameters["num_bins"].default for f in functions} == {DEFAULT_NUM_BINS}
    assert len(reliability_diagram(PROBS, LABELS).axes[0].patches) == 2 * DEFAULT_NUM_BINS


def test_calibration_metric_refuses_or_converts_logits():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(64, 5)).astype("float32") * 3
    labels = rng.integers(0, 5, size=64)
    probs = tf.nn.softmax(logits).numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match="probability vectors"):
        ExpectedCalibrationError().update_state(labels, logits)
    for cls, fn in ((ExpectedCalibrationError, expected_calibration_error),
                    (MaximumCalibrationError, maximum_calibration_error)):
        metric = cls(from_logits=True)
        metric.update_state(labels, logits)
        value = float(metric.result())
        assert 0.0 <= value <= 1.0
        assert value == pytest.approx(fn(probs, labels), abs=1e-5)
        assert cls.from_config(metric.get_config()).from_logits is True
    with pytest.raises(ValueError, match="from_logits"):
        ExpectedCalibrationError(from_logits="yes")


@pytest.mark.parametrize("probs,labels,match", [
    (PROBS * 1.1, LABELS, "sum to 1"),
    (PROBS - 0.5, LABELS, r"probabilities in \[0, 1\]"),
    (PROBS[0], LABELS, "num_classes"),
    (PROBS, [0, 0, 0, 3], r"integers in \[0, 2\]"),
    (PROBS, [0, 0, 0], "labels"),
])
def test_bad_input(probs, labels, match):
    with pytest.raises(ValueError, match=match):
        expected_calibration_error(probs, labels)
    with pytest.raises(ValueError, match=match):
        maximum_calibration_error(probs, labels)


def test_bad_num_bins():
    with pytest.raises(ValueError, match="num_bins"):
        expected_calibration_error(PROBS, LABELS, num_bins=0)
    with pytest.raises(ValueError, match="num_bins"):
        ExpectedCalibrationError(num_bins=0)
