"""tfdpbnn.audit through compile/fit: canaries are exact, sigma = 0 is caught, correct DP-SGD is not."""

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
import tfdpbnn.audit
from tfdpbnn.audit import GradientCanaryAudit, canary_losses, multi_run_scores, with_gradient_canaries

# Not in the fast tier (./scripts/test --fast): audits through compile/fit, many runs.
pytestmark = pytest.mark.slow

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n)


def _mlp():
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(4, activation="tanh"),
                                tf.keras.layers.Dense(3)])


def _one_run(noise_multiplier, num_canaries=200, epochs=3, seed=0):
    x, y = _data()
    audit = GradientCanaryAudit(num_canaries=num_canaries, seed=seed)
    model = audit.wrap(_mlp(), l2_norm_clip=1.0)
    inputs, targets, weights = audit.data(x, y)
    n = len(targets["task"])
    batch = n // 4
    opt = tfdpbnn.DPSGDOptimizer(1.0, noise_multiplier, num_examples=n, batch_size=batch, sampling="poisson",
                                 learning_rate=0.5, delta=1e-5)
    model.compile(optimizer=opt, loss=audit.losses(LOSS))
    # A debug seed keeps the test deterministic; the audit is compared with the amplified epsilon below.
    data = tfdpbnn.data.poisson_batches(inputs, targets, sample_rate=opt.sample_rate, sample_weight=weights,
                                        seed=seed, debug_fixed_seed=True)
    model.fit(data, epochs=epochs, callbacks=[audit.recorder], verbose=0)
    return audit, model, opt


def test_sigma_zero_run_is_caught_and_canaries_are_exact():
    """noise_multiplier = 0: the one-run lower bound (at most 2.05 with 200 canaries, every guess right)
    exceeds 1.5, so a claim of epsilon 1 is caught. And every
    step moves an included canary's weight by 0 or lr * C / B exactly (its gradient clipped to C on one
    coordinate), an excluded canary's never: the real data never touch the canary weights."""
    audit, model, opt = _one_run(0.0)
    steps = np.diff(audit.recorder.weights, axis=0)
    unit = 0.5 * 1.0 / opt.batch_size
    assert np.all(steps[:, ~audit.included] == 0.0)
    moved = steps[:, audit.included]
    np.testing.assert_allclose(moved[moved != 0], unit, rtol=1e-5)
    result, score = audit.result(model, opt, delta=1e-5)
    assert score == "displacement"  # no noise: the likelihood ratio is undefined, the final weights suffice
    assert result.epsilon > 1.5


def test_correct_dp_sgd_run_not_flagged():
    audit, model, opt = _one_run(1.0)
    result, score = audit.result(model, opt, delta=1e-5)
    assert score == "likelihood_ratio"
    amplified = tfdpbnn.privacy.compute_epsilon(1.0, opt.sample_rate, opt.steps, 1e-5, sampling="poisson")
    assert result.epsilon <= amplified <= opt.epsilon()


def test_multi_run_full_batch_scores_have_the_designed_mean():
    """Full batches, sigma = 0: a run with the canary moves it by T lr C / B exactly, one without by 0."""
    x, y = _data(31)
    model = with_gradient_canaries(_mlp(), 1, 1.0)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 0.0, num_examples=32, batch_size=32, sampling="shuffle",
                                 learning_rate=0.5, delta=1e-5)
    model.compile(optimizer=opt, loss=canary_losses(LOSS))
    ins, outs = multi_run_scores(model, opt, x, y, num_runs=4, steps_per_run=3)
    np.testing.assert_allclose(ins, 3 * 0.5 / 32, rtol=1e-5)
    np.testing.assert_allclose(outs, 0.0, atol=1e-9)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_canaries"):
        with_gradient_canaries(_mlp(), 0, 1.0)
    with pytest.raises(ValueError, match="gain_factor"):
        with_gradient_canaries(_mlp(), 3, 1.0, gain_factor=0.5)
    with pytest.raises(ValueError, match="included"):
        GradientCanaryAudit(num_canaries=3, included=np.array([1, 0, 1]))


def _full_batch_run(noise_multiplier, num_canaries=300, bug=None):
    import contextlib

    x, y = _data()
    audit = GradientCanaryAudit(num_canaries=num_canaries, seed=0)
    model = audit.wrap(_mlp(), l2_norm_clip=1.0)
    inputs, targets, weights = audit.data(x, y)
    n = len(targets["task"])
    opt = tfdpbnn.DPSGDOptimizer(1.0, noise_multiplier, num_examples=n, batch_size=n, sampling="shuffle",
                                 learning_rate=0.5, delta=1e-5)
    model.compile(optimizer=opt, loss=audit.losses(LOSS))
    with tfdpbnn.audit.inject_bug("noise-2/3", bug) if bug else contextlib.nullcontext():
        model.fit(inputs, targets, sample_weight=weights, batch_size=n, epochs=1, callbacks=[audit.recorder],
                  verbose=0)
    return audit, model, opt


def test_fdp_estimator_on_full_batch_runs():
    # One full-batch step at sigma = 4 is exactly 0.25-GDP (Dong, Roth & Su 2019, Corollary 3.3).
    audit, model, opt = _full_batch_run(4.0)
    assert audit.claimed_mu(opt) == pytest.approx(0.25)
    honest, score = audit.result(model, opt, delta=1e-5, estimator="fdp")
    assert score == "likelihood_ratio" and honest.mu <= audit.claimed_mu(opt)
    # Noise at 0.1 sigma C (true mu 2.5, ten times the claim): the f-DP bound rejects the claim, and with
    # these scores it is at least Steinke et al.'s epsilon bound.
    audit, model, opt = _full_batch_run(4.0, bug=0.1)
    broken, _ = audit.result(model, opt, delta=1e-5, estimator="fdp")
    steinke, _ = audit.result(model, opt, delta=1e-5)
    assert broken.mu > audit.claimed_mu(opt)
    assert broken.epsilon >= steinke.epsilon > 0


def test_fdp_estimator_refuses_subsampled_runs():
    audit, model, opt = _one_run(1.0, num_canaries=50, epochs=1)
    with pytest.raises(ValueError, match="not mu-GDP"):
        audit.result(model, opt, delta=1e-5, estimator="fdp")
    with pytest.raises(ValueError, match="estimator"):
        audit.result(model, opt, delta=1e-5, estimator="gdp")
