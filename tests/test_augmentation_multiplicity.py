"""Augmentation multiplicity (De et al. 2022): K copies averaged before clipping keep one example within C.

Through the real DP training step (``train_on_batch``, sigma 0, SGD at learning rate 1, no regularization):
the weight change of a step on ONE example is that example's clipped gradient divided by the expected batch
size B, so its norm must be at most C / B (float32 tolerance), and equal C / B when the clip binds. Were the
K copies clipped one by one and summed, it would be up to K C / B, which the test would catch.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _tiers import SLOW_ON_KERAS2

import tfdpbnn
from tfdpbnn.layers import AugmentationCopies, CopiesSparseCategoricalCrossentropy, augment_digit_counts

CLIP, BATCH = 0.5, 4.0


def _digits(n=6):
    """``n`` DIGITS training images in [0, 1] (counts / 16) and their labels."""
    (x, y), _ = tfdpbnn.data.load_digits(seed=0)
    return x[:n], y[:n]


def _model(copies, hidden=8, dpvd=False):
    tf.keras.utils.set_random_seed(1)
    inner = ([tfdpbnn.layers.DenseVariational(hidden, num_examples=10, activation="tanh", kl_weight=0.0),
              tfdpbnn.layers.DenseVariational(10, num_examples=10, kl_weight=0.0)] if dpvd else
             [tf.keras.layers.Dense(hidden, activation="tanh"), tf.keras.layers.Dense(10)])
    return tf.keras.Sequential([tf.keras.Input((64,)), AugmentationCopies(copies, offset=-0.5)] + inner)


def _step_change(model, x, y, clipping_method, clip=CLIP):
    opt = tfdpbnn.DPSGDOptimizer(clip, noise_multiplier=0.0, num_examples=10, batch_size=int(BATCH),
                                 sampling="shuffle", learning_rate=1.0, clipping_method=clipping_method,
                                 allow_exceeding_budget=True)
    model.compile(optimizer=opt, loss=CopiesSparseCategoricalCrossentropy(from_logits=True))
    before = [v.numpy().copy() for v in model.trainable_variables]
    model.train_on_batch(x, y)
    return np.sqrt(sum(np.sum((v.numpy() - b) ** 2) for v, b in zip(model.trainable_variables, before,
                                                                      strict=True)))


# fast tier: ghost with DP-SGD (the jacobian rule's and DPVD's sensitivity: test_optimizers_properties.py,
# test_clipping_jacobian.py)
@pytest.mark.parametrize("clipping_method,dpvd", [("ghost", False),
                                                  pytest.param("jacobian", False, marks=SLOW_ON_KERAS2),
                                                  pytest.param("ghost", True, marks=SLOW_ON_KERAS2)])
def test_one_example_contribution_is_within_c_for_every_k(clipping_method, dpvd):
    """One example, 8 augmented copies: the step's weight change has norm C / B (the clip binds) at most."""
    x, y = _digits(1)
    x = x - 0.5
    for copies in (8,):
        model = _model(copies, dpvd=dpvd)
        # Scale the last layer so the example's loss gradient is far above C: the clip must bind.
        last = model.layers[-1]
        kernel = last.theta if dpvd else last.kernel
        kernel.assign(kernel * 50.0)
        change = _step_change(model, x, y, clipping_method)
        assert change <= CLIP / BATCH * (1 + 1e-4), (copies, change)
        assert change == pytest.approx(CLIP / BATCH, rel=1e-3), (copies, change)


def test_copies_are_averaged_not_summed_below_the_clip():
    """Below the clip, K identical copies give exactly the plain step (mean over copies, not the sum)."""
    x, y = _digits(1)
    x = x - 0.5
    changes = []
    for copies in (1, 4):
        model = _model(copies)
        layer = model.layers[0]
        layer.shift, layer.jitter = False, 0.0  # identical copies (DIGITS pixels are whole counts)
        changes.append(_step_change(model, x, y, "ghost", clip=100.0))  # the clip does not bind
    assert 0 < changes[0] < 0.9 * 100.0 / BATCH
    assert changes[1] == pytest.approx(changes[0], rel=1e-4)


@pytest.mark.slow   # two fits end to end; the sensitivity for every K stays in the fast tier
def test_statement_epsilon_does_not_depend_on_k():
    """The accounting sees one example per example: the stated epsilon is the same for K = 1 and K = 4."""
    x, y = _digits(40)
    epsilons = []
    for copies in (1, 4):
        model = _model(copies)
        opt = tfdpbnn.DPSGDOptimizer(1.0, noise_multiplier=2.0, num_examples=40, batch_size=10,
                                     sampling="shuffle", learning_rate=0.1)
        model.compile(optimizer=opt, loss=CopiesSparseCategoricalCrossentropy(from_logits=True))
        model.fit(x - 0.5, y, batch_size=10, epochs=1, verbose=0, shuffle=False)
        epsilons.append(model.optimizer.privacy_statement(delta=1e-5)["epsilon"])
    assert np.isfinite(epsilons[0]) and epsilons[0] > 0
    assert epsilons[1] == pytest.approx(epsilons[0], rel=1e-9)


def test_augmented_copies_are_whole_counts_with_the_closed_form_mean():
    """Copies are whole counts in 0-16, and their mean is the closed form of the quarter-cell shift.

    Per axis the shift is -1, 0, +1 bitmap pixels with probability 1/3 each, moving a quarter of a cell's
    count to its neighbour, and the rounding is unbiased, so E[copy] = T_col(T_row(c)) with
    T(c)_j = 5/6 c_j + 1/12 (c_{j-1} + c_{j+1}) (zero outside). Over 4,000 copies of one image each pixel's
    mean has standard error below 0.1 counts; the tolerance 0.4 is over 4 standard errors.
    """
    x, _ = _digits(1)
    image = x.reshape(8, 8).astype(np.float64) * 16.0
    out = augment_digit_counts(tf.constant(np.repeat(image[None], 4000, axis=0)), jitter=0.0).numpy()
    np.testing.assert_allclose(out, np.round(out), atol=0)
    assert out.min() >= 0 and out.max() <= 16

    def smooth(c, axis):
        padded = np.pad(c, [(1, 1), (0, 0)] if axis == 0 else [(0, 0), (1, 1)])
        lo, hi = (padded[:-2], padded[2:]) if axis == 0 else (padded[:, :-2], padded[:, 2:])
        return 5 / 6 * c + (lo + hi) / 12

    np.testing.assert_allclose(out.mean(axis=0), smooth(smooth(image, 0), 1), atol=0.4)
    assert np.mean(out != image) > 0.1  # it does augment
    layer = AugmentationCopies(3, offset=-0.5)
    assert layer(x - 0.5, training=True).shape == (1, 3, 64)
    np.testing.assert_allclose(layer(x - 0.5, training=False).numpy(), x - 0.5)


@pytest.mark.parametrize("kwargs,match", [({"copies": 0}, "copies"), ({"copies": 2.0}, "copies"),
                                          ({"copies": 2, "jitter": 0.7}, "jitter"),
                                          ({"copies": 2, "shift": 1}, "shift")])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AugmentationCopies(**kwargs)
    with pytest.raises(ValueError, match="8x8"):
        AugmentationCopies(2)(tf.zeros([2, 10]))


@pytest.mark.slow
def test_train_cli_copies_keeps_the_accounting_and_exports_an_inference_model(tmp_path, capsys):
    """``tfdpbnn train --copies 2``: epsilon is the plain run's formula; the SavedModel reads raw DIGITS."""
    import json
    import os

    from tfdpbnn import cli, privacy

    key = tmp_path / "sampling-key"
    key.write_text("0000000000001eef\n")
    out = str(tmp_path / "copies")
    assert cli.main(["train", "--method", "dpsgd", "--dataset", "digits", "--epsilon", "2", "--epochs", "2",
                     "--batch-size", "480", "--hidden", "8", "--verbose", "0", "--secret-key-file", str(key),
                     "--copies", "2", "--out", out]) == 0
    assert "2 augmented copies per example" in capsys.readouterr().out
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    statement = summary["privacy_statement"]
    assert summary["copies"] == 2 and summary["steps"] == 6
    assert summary["epsilon"] <= 2.0
    assert summary["epsilon"] == pytest.approx(privacy.compute_epsilon(
        statement["noise_multiplier"], 480 / 1437, 6, 1e-5, accountant="rdp", sampling="poisson"), rel=1e-6)
    _, (x_test, y_test) = tfdpbnn.data.load_digits(seed=0)
    served = tf.saved_model.load(os.path.join(out, "saved_model")).signatures
    logits = served["serving_default"](x=tf.constant(x_test, tf.float32))["output"].numpy()
    assert logits.shape == (len(y_test), 10)
    accuracy = np.mean(logits.argmax(1) == y_test)
    assert accuracy == pytest.approx(summary["test_accuracy"], abs=1.5 / len(y_test))
    assert cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--copies", "0", "--out", out]) == 2
    assert "--copies" in capsys.readouterr().err
