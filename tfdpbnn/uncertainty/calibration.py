"""Calibration: expected / maximum calibration error (Guo et al. 2017; Zhang et al. (2022, section 5.1)).

With M equal-width confidence bins B_m = ((m-1)/M, m/M] (confidence 0 goes to the first bin),
    ECE = sum_m |B_m|/n |acc(B_m) - conf(B_m)|,    MCE = max_{m: B_m nonempty} |acc(B_m) - conf(B_m)|,
where confidence is the largest predicted probability and accuracy compares its class with the label.
A binary model's [n, 1] probabilities p of label 1 are read as the Bernoulli distributions [1 - p, p]
(confidence max(p, 1 - p), predicted label 1 where p > 1/2), as in ``tfdpbnn.uncertainty.outputs``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdpbnn._validation import check_positive_int
from tfdpbnn.uncertainty.outputs import SUM_TOLERANCE, to_probabilities

#: the one default number of equal-width confidence bins (Guo et al. 2017 use 15).
DEFAULT_NUM_BINS = 15


def check_probabilities(probs, name="probs"):
    """Return ``probs`` as float64 [n, C] after checking each row is a distribution; else ``ValueError``.

    A one-column [n, 1] array holds Bernoulli probabilities p of label 1 and is returned as [1 - p, p].
    """
    arr = np.asarray(probs, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name}: expected a [num_examples, num_classes] array (or [num_examples, 1] "
                         f"probabilities of label 1 for a binary model), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or arr.min() < 0.0 or arr.max() > 1.0:
        raise ValueError(f"{name}: entries must be probabilities in [0, 1]")
    if arr.shape[1] == 1:
        return np.concatenate([1.0 - arr, arr], axis=1)
    worst = float(np.max(np.abs(arr.sum(axis=1) - 1.0)))
    if worst > SUM_TOLERANCE:
        raise ValueError(f"{name}: every row must sum to 1 (tolerance {SUM_TOLERANCE}); worst row is off by "
                         f"{worst:.3g} (apply softmax to logits first)")
    return arr


def _labels(labels, n, num_classes):
    arr = np.asarray(labels)
    if arr.ndim == 2 and arr.shape == (n, num_classes) and num_classes > 1:
        arr = arr.argmax(axis=1)
    arr = arr.reshape(-1)
    if arr.shape[0] != n:
        raise ValueError(f"labels: expected {n} integer labels or a one-hot [n, {num_classes}] array, got "
                         f"shape {np.asarray(labels).shape}")
    if not np.all(np.equal(np.mod(arr, 1), 0)) or arr.min() < 0 or arr.max() >= num_classes:
        raise ValueError(f"labels: must be integers in [0, {num_classes - 1}]")
    return arr.astype(np.int64)


def calibration_bins(probs, labels, num_bins=DEFAULT_NUM_BINS):
    """(count, confidence sum, correct count) per bin, each of shape [num_bins]."""
    num_bins = check_positive_int("num_bins", num_bins)
    probs = check_probabilities(probs)
    labels = _labels(labels, probs.shape[0], probs.shape[1])
    conf = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    idx = np.clip(np.ceil(conf * num_bins).astype(np.int64) - 1, 0, num_bins - 1)
    count = np.bincount(idx, minlength=num_bins).astype(np.float64)
    conf_sum = np.bincount(idx, weights=conf, minlength=num_bins)
    correct_sum = np.bincount(idx, weights=correct, minlength=num_bins)
    return count, conf_sum, correct_sum


def expected_calibration_error(probs, labels, num_bins=DEFAULT_NUM_BINS):
    """ECE (Guo et al. 2017 eq. 3; Zhang et al. 2022, sec. 5.1) of predicted distributions ``probs``.

    ``probs``: [n, C] predicted class probabilities; ``labels``: [n] integer classes (or one-hot [n, C]).
    """
    count, conf_sum, correct_sum = calibration_bins(probs, labels, num_bins)
    return float(np.sum(np.abs(correct_sum - conf_sum)) / np.sum(count))


def maximum_calibration_error(probs, labels, num_bins=DEFAULT_NUM_BINS):
    """MCE (Guo et al. 2017 eq. 5; Zhang et al. (2022, sec. 5.1)): largest |accuracy - confidence| of a bin.

    Only nonempty bins count.
    """
    count, conf_sum, correct_sum = calibration_bins(probs, labels, num_bins)
    nonempty = count > 0
    return float(np.max(np.abs(correct_sum[nonempty] - conf_sum[nonempty]) / count[nonempty]))


def reliability_diagram(probs, labels, path=None, num_bins=DEFAULT_NUM_BINS, title=None):
    """Reliability diagram (Guo et al. 2017 fig. 1): accuracy and mean confidence per bin, with ECE/MCE.

    Returns a ``matplotlib.figure.Figure`` (display it in a notebook, or ``fig.savefig(...)``). If ``path``
    is given, the figure is also saved there as a PNG. Uses matplotlib's Agg canvas directly (no pyplot,
    no global backend change).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    count, conf_sum, correct_sum = calibration_bins(probs, labels, num_bins)
    nonempty = count > 0
    acc = np.where(nonempty, correct_sum / np.maximum(count, 1), 0.0)
    conf = np.where(nonempty, conf_sum / np.maximum(count, 1), 0.0)
    ece = float(np.sum(np.abs(correct_sum - conf_sum)) / np.sum(count))
    mce = float(np.max(np.abs(acc - conf)[nonempty]))
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    fig = Figure(figsize=(4.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(edges[:-1], acc, width=1.0 / num_bins, align="edge", edgecolor="black", label="accuracy")
    ax.bar(edges[:-1], conf - acc, bottom=acc, width=1.0 / num_bins, align="edge", color="red", alpha=0.3,
           label="gap to confidence")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(title or f"ECE {ece:.3f}  MCE {mce:.3f}  (n = {int(np.sum(count))})")
    ax.legend(loc="upper left")
    if path is not None:
        fig.savefig(path, format="png", dpi=100)
    return fig


class _CalibrationMetric(tf.keras.metrics.Metric):
    """Streaming per-bin counts for ECE/MCE; y_true integer labels [batch] / [batch, 1] or one-hot.

    ``from_logits=True``: ``y_pred`` are logits (softmax is applied). ``from_logits=False`` (default):
    ``y_pred`` must be probability vectors; anything else fails a graph assertion instead of producing a
    calibration error outside [0, 1].
    """

    def __init__(self, num_bins=DEFAULT_NUM_BINS, from_logits=False, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.num_bins = check_positive_int("num_bins", num_bins)
        if not isinstance(from_logits, bool):
            raise ValueError(f"from_logits must be True or False, got {from_logits!r}")
        self.from_logits = from_logits
        self.count = self.add_weight(name="count", shape=(self.num_bins,), initializer="zeros")
        self.conf_sum = self.add_weight(name="conf_sum", shape=(self.num_bins,), initializer="zeros")
        self.correct_sum = self.add_weight(name="correct_sum", shape=(self.num_bins,), initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = to_probabilities(tf.cast(tf.convert_to_tensor(y_pred), self.dtype), self.from_logits,
                                  name=f"{self.name}: y_pred")
        y_true = tf.convert_to_tensor(y_true)
        if y_true.shape.rank == y_pred.shape.rank and y_true.shape[-1] == y_pred.shape[-1] \
                and (y_pred.shape[-1] or 0) > 1:
            labels = tf.argmax(y_true, axis=-1)
        else:
            labels = tf.reshape(tf.cast(y_true, tf.int64), [-1])
        conf = tf.reduce_max(y_pred, axis=-1)
        correct = tf.cast(tf.equal(tf.argmax(y_pred, axis=-1), labels), self.dtype)
        idx = tf.cast(tf.math.ceil(conf * self.num_bins), tf.int32) - 1
        idx = tf.clip_by_value(idx, 0, self.num_bins - 1)
        if sample_weight is None:
            weight = tf.ones_like(conf)
        else:
            weight = tf.reshape(tf.cast(sample_weight, self.dtype), [-1])
        self.count.assign_add(tf.math.unsorted_segment_sum(weight, idx, self.num_bins))
        self.conf_sum.assign_add(tf.math.unsorted_segment_sum(weight * conf, idx, self.num_bins))
        self.correct_sum.assign_add(tf.math.unsorted_segment_sum(weight * correct, idx, self.num_bins))

    def reset_state(self):
        for var in (self.count, self.conf_sum, self.correct_sum):
            var.assign(tf.zeros_like(var))

    def get_config(self):
        config = super().get_config()
        config.update({"num_bins": self.num_bins, "from_logits": self.from_logits})
        return config


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class ExpectedCalibrationError(_CalibrationMetric):
    """Keras metric: ECE (Guo et al. 2017; Zhang et al. (2022, sec. 5.1)) over all batches seen.

    Equals ``expected_calibration_error`` on the concatenated data.
    """

    def __init__(self, num_bins=DEFAULT_NUM_BINS, from_logits=False, name="ece", dtype=None):
        super().__init__(num_bins=num_bins, from_logits=from_logits, name=name, dtype=dtype)

    def result(self):
        """ECE of the bins accumulated so far: sum |correct - confidence| over bins / examples (0 if none)."""
        return tf.math.divide_no_nan(tf.reduce_sum(tf.abs(self.correct_sum - self.conf_sum)),
                                     tf.reduce_sum(self.count))


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class MaximumCalibrationError(_CalibrationMetric):
    """Keras metric: MCE (Guo et al. 2017; Zhang et al. (2022, sec. 5.1)) over all batches seen.

    Equals ``maximum_calibration_error`` on the concatenated data.
    """

    def __init__(self, num_bins=DEFAULT_NUM_BINS, from_logits=False, name="mce", dtype=None):
        super().__init__(num_bins=num_bins, from_logits=from_logits, name=name, dtype=dtype)

    def result(self):
        """MCE of the bins accumulated so far: the largest |accuracy - confidence| of a nonempty bin."""
        gaps = tf.math.divide_no_nan(tf.abs(self.correct_sum - self.conf_sum), self.count)
        return tf.reduce_max(tf.where(self.count > 0, gaps, tf.zeros_like(gaps)))
