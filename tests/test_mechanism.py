"""tfdpbnn.DPMechanism: the one DP step every optimizer and custom loop uses (Abadi et al. 2016, Alg. 1)."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tests._dp_models import make_data, make_model
from tests._float32 import F32
from tfdpbnn.clipping import jacobian_clipped_gradients


def _loss_fn(y, y_pred, sample_weight=None):
    return tf.keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)


@pytest.mark.parametrize("kind", ["dense", "dense_variational"])
def test_sigma_zero_release_is_the_clipped_mean_plus_regularization(kind, monkeypatch):
    """sigma = 0: the released gradient is (sum_i clip(g_i)) / B + grad(model.losses), B the EXPECTED size.

    The variational layers' weight noise is made stateless so both routes run the same forward pass; the
    reference is the jacobian path (every g_i materialized), the mechanism takes the per-layer rules.
    """

    def normal(shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None, name=None):
        return mean + stddev * tf.random.stateless_normal(shape, seed=[3, 7], dtype=dtype)

    monkeypatch.setattr(tf.random, "normal", normal)
    model = make_model(kind)
    x, y = make_data(kind, batch=7)
    mechanism = tfdpbnn.DPMechanism(l2_norm_clip=0.05, noise_multiplier=0.0, expected_batch_size=10)
    result = mechanism.privatize_model(model, x, y, loss_fn=_loss_fn)
    reference = jacobian_clipped_gradients(model, x, y, None, _loss_fn, 0.05, model.trainable_variables)
    for got, clipped_sum, reg in zip(result.gradients, reference.clipped_sum, reference.regularization_grads,
                                     strict=True):
        np.testing.assert_allclose(got.numpy(), clipped_sum.numpy() / 10 + reg.numpy(), rtol=2e-4, atol=1e-6)
    assert result.regularization_gradients is not None  # both models have model.losses
    norms = result.clipped.per_example_norms.numpy()
    assert norms.shape == (7,) and np.all(norms > 0.05)  # the clip bound binds, so clipping was exercised


def test_noise_std_is_sigma_c_over_b_and_drawn_once_per_release():
    """Zero data gradient: released coordinates ~ N(0, (sigma C / B)^2); two releases are independent.

    Sample: 3 releases x 4,000 coordinates. The sample std of m = 12,000 normals has relative standard error
    1/sqrt(2m) = 0.65%; the tolerance 3% is 4.6 standard errors.
    """
    w = tf.Variable(tf.zeros([4000]))
    sigma, clip, batch = 1.3, 2.0, 16.0
    with pytest.warns(UserWarning, match="no privacy guarantee"):  # a fixed seed, for fixed-seed statistics
        mechanism = tfdpbnn.DPMechanism(clip, sigma, batch, debug_noise_seed=3)
    draws = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.zeros([5]) * tf.reduce_sum(w)  # per-example losses with zero gradient
        draws.append(mechanism.privatize_losses(loss, [w], tape).gradients[0].numpy())
    draws = np.stack(draws)
    assert abs(draws.std() / (sigma * clip / batch) - 1.0) < 0.03
    assert abs(np.corrcoef(draws[0], draws[1])[0, 1]) < 0.05  # a fresh draw each release


def test_clip_losses_equals_clip_model_on_the_same_losses():
    """The loss-vector path (tape.jacobian) and the model path (per-layer rules) clip the same sum."""
    model = make_model("dense")
    x, y = make_data("dense", batch=6)
    mechanism = tfdpbnn.DPMechanism(0.1, 0.0, 6)
    by_model = mechanism.clip_model(model, x, y, loss_fn=_loss_fn)
    with tf.GradientTape() as tape:
        losses = _loss_fn(y, model(x, training=True))
    by_losses = mechanism.clip_losses(losses, model.trainable_variables, tape)
    for a, b in zip(by_model.clipped_sum, by_losses.clipped_sum, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), **F32)
    np.testing.assert_allclose(by_model.per_example_norms.numpy(), by_losses.per_example_norms.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_step_event_composes_to_the_independent_dp_accounting_epsilon():
    mechanism = tfdpbnn.DPMechanism(1.0, 1.1, 64)
    accountant = dp_accounting.rdp.RdpAccountant()
    for _ in range(50):
        accountant.compose(mechanism.step_event(sample_rate=0.05))
    independent = dp_accounting.rdp.RdpAccountant()
    independent.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.1)), 50))
    assert accountant.get_epsilon(1e-5) == pytest.approx(independent.get_epsilon(1e-5), rel=1e-9)
    # Without amplification: one Gaussian per participation; replace-one doubles the sensitivity.
    assert mechanism.step_event() == dp_accounting.GaussianDpEvent(1.1)
    replace = tfdpbnn.DPMechanism(1.0, 1.1, 64, neighboring="replace_one")
    assert replace.step_event() == dp_accounting.GaussianDpEvent(0.55)
    assert isinstance(tfdpbnn.DPMechanism(1.0, 0.0, 64).step_event(0.1), dp_accounting.NonPrivateDpEvent)


def test_on_batch_sees_every_realized_batch_size():
    seen = []
    mechanism = tfdpbnn.DPMechanism(1.0, 1.0, 8, on_batch=lambda b: seen.append(int(b)))
    model = make_model("dense")
    for batch in (5, 0, 9):
        x, y = make_data("dense", batch=batch)
        mechanism.privatize_model(model, x, y, loss_fn=_loss_fn)
    assert seen == [5, 0, 9]


def test_parameters_may_be_variables_read_at_every_step():
    sigma = tf.Variable(0.0, dtype=tf.float64)
    mechanism = tfdpbnn.DPMechanism(1.0, sigma, 4.0)
    w = tf.Variable(tf.zeros([1000]))

    def release():
        with tf.GradientTape() as tape:
            loss = tf.zeros([2]) * tf.reduce_sum(w)
        return mechanism.privatize_losses(loss, [w], tape).gradients[0].numpy()

    assert np.all(release() == 0.0)
    sigma.assign(2.0)
    assert mechanism.noise_multiplier == 2.0
    assert release().std() == pytest.approx(2.0 * 1.0 / 4.0, rel=0.1)


def test_optimizers_use_their_mechanism():
    opt = tfdpbnn.DPSGDOptimizer(1.5, 0.7, batch_size=10, num_examples=100)
    assert isinstance(opt.mechanism, tfdpbnn.DPMechanism)
    assert opt.mechanism.noise_multiplier == pytest.approx(0.7) and opt.mechanism.l2_norm_clip == 1.5
    assert float(opt.mechanism.noise_stddev()) == pytest.approx(0.7 * 1.5 / 10, rel=1e-6)
    sgld = tfdpbnn.DPSGLDOptimizer(1.0, learning_rate=1e-3, batch_size=10, num_examples=100)
    assert float(sgld.mechanism.scale()) == pytest.approx(100 / 10, rel=1e-6)  # n / B (Zhang et al. 2022)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"l2_norm_clip": 0.0}, "l2_norm_clip"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ({"expected_batch_size": 0}, "expected_batch_size"),
    ({"scale": -2.0}, "scale"),
    ({"clipping_method": "fast"}, "clipping_method"),
    ({"neighboring": "swap"}, "neighboring"),
    ({"secure_mode": "yes"}, "secure_mode"),
    ({"on_batch": 3}, "on_batch"),
    ({"debug_noise_seed": -1}, "debug_noise_seed"),
    ({"debug_noise_seed": 2 ** 63}, "debug_noise_seed"),
    ({"debug_noise_seed": 1.0}, "debug_noise_seed"),
    ({"debug_noise_seed": True}, "debug_noise_seed"),
    ({"debug_noise_seed": 1, "secure_mode": True}, "debug_noise_seed"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    arguments = {"l2_norm_clip": 1.0, "noise_multiplier": 1.0, "expected_batch_size": 8, **kwargs}
    with pytest.raises(ValueError, match=name):
        tfdpbnn.DPMechanism(**arguments)


def test_scalar_loss_and_bad_sample_rate_are_refused():
    mechanism = tfdpbnn.DPMechanism(1.0, 1.0, 8)
    w = tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = w * 2.0
    with pytest.raises(ValueError, match="per_example_loss"):
        mechanism.privatize_losses(loss, [w], tape)
    with pytest.raises(ValueError, match="sample_rate"):
        mechanism.step_event(sample_rate=1.5)
