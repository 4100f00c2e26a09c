"""The moving average of the DP iterates and the Gaussian fitted to them: closed forms, no privacy cost."""

import numpy as np
import pytest
import tensorflow as tf
from _float32 import F32
from _small_runs import DELTA, LOSS, N, small_data, small_model
from _tiers import slow_on_keras2

import tfdpbnn
from tfdpbnn.uncertainty import IterateAverage, IterateMoments, mc_predict

STEPS = 6


class _Record(tf.keras.callbacks.Callback):
    """The trainable weights after every step (what the iterate callbacks must summarize)."""

    def on_train_begin(self, logs=None):
        self.start = [w.numpy().astype(np.float64) for w in self.model.trainable_variables]
        self.iterates = []

    def on_train_batch_end(self, batch, logs=None):
        self.iterates.append([w.numpy().astype(np.float64) for w in self.model.trainable_variables])


def _fit(callbacks, seed=0):
    x, y = small_data()
    model = small_model(seed)
    # Replayable noise (no guarantee; only so that two runs can be compared step for step).
    with pytest.warns(UserWarning, match="debug_noise_seed"):
        optimizer = tfdpbnn.DPSGDOptimizer(1.0, noise_multiplier=1.5, num_examples=N, batch_size=16,
                                           delta=DELTA, sampling="poisson", learning_rate=0.5,
                                           debug_noise_seed=seed)
    model.compile(optimizer=optimizer, loss=LOSS)
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.25, steps_per_epoch=STEPS, secret_seed=seed)
    tf.random.set_seed(seed)
    model.fit(batches, epochs=1, verbose=0, callbacks=callbacks)
    return model, optimizer


def test_iterate_average_is_the_stated_recursion_and_costs_no_privacy():
    record = _Record()
    model, optimizer = _fit([record])
    reference = optimizer.privacy_statement()

    record2, average = _Record(), IterateAverage(0.5)
    model2, optimizer2 = _fit([record2, average])
    # same seeds: the same run (the callback only reads weights)
    for a, b in zip(record.iterates[-1], record2.iterates[-1], strict=True):
        np.testing.assert_allclose(a, b, **F32)
    # closed form: a_0 = w_0, a_t = r_t a_{t-1} + (1 - r_t) w_t, r_t = min(0.5, t / (t + 1))
    expected = [w.copy() for w in record2.start]
    for t, weights in enumerate(record2.iterates, start=1):
        r = min(0.5, t / (t + 1.0))
        expected = [r * a + (1 - r) * w for a, w in zip(expected, weights, strict=True)]
    for got, want in zip(model2.trainable_variables, expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want, **F32)
    for got, want in zip(average.last_iterate, record2.iterates[-1], strict=True):
        np.testing.assert_allclose(got, want, **F32)
    # post-processing: the statement (epsilon by every accountant, steps) is the run's without the callback
    statement = optimizer2.privacy_statement()
    assert statement["epsilon_if_noise_were_secret"] == pytest.approx(
        reference["epsilon_if_noise_were_secret"], rel=1e-12)
    assert statement["epsilon_by_accountant"] == pytest.approx(reference["epsilon_by_accountant"], rel=1e-12)
    assert optimizer2.steps == optimizer.steps == STEPS
    # and the averaged weights do differ from the last iterate (the test can fail)
    assert not np.allclose(model2.trainable_variables[0].numpy(), record2.iterates[-1][0])


@slow_on_keras2   # a fit; that iterates cost no privacy: the test above
def test_iterate_moments_match_numpy_and_sample_the_fitted_gaussian():
    record, moments = _Record(), IterateMoments(burn_in=2, thinning=2, max_iterates=1)
    model, optimizer = _fit([record, moments])
    reference = _fit([])[1].privacy_statement()
    assert optimizer.privacy_statement()["epsilon_if_noise_were_secret"] == pytest.approx(
        reference["epsilon_if_noise_were_secret"], rel=1e-12)
    kept = [record.iterates[i] for i in (3, 5)]  # steps 4 and 6: after burn-in 2, every 2nd
    assert moments.count == 2
    for k, variable in enumerate(model.trainable_variables):
        stack = np.stack([it[k] for it in kept])
        index = [i for i, w in enumerate(model.weights) if w is variable][0]
        np.testing.assert_allclose(moments.mean[index], stack.mean(0), **F32)
        np.testing.assert_allclose(moments.variance[k], stack.var(0), rtol=1e-4, atol=1e-7)
    assert len(moments.iterates) == 1  # max_iterates keeps the last only
    np.testing.assert_allclose(moments.iterates[0][0], kept[-1][0], **F32)
    # draws: mean and std of 4000 samples of each weight within 4 standard errors of the fitted ones
    draws = np.stack([s[0] for s in moments.sample(4000, seed=1)])
    mu, var = np.stack([it[0] for it in kept]).mean(0), moments.variance[0]
    se = np.sqrt(var / 4000) + 1e-9
    assert np.all(np.abs(draws.mean(0) - mu) <= 4 * se + 1e-6)
    np.testing.assert_allclose(draws.std(0), np.sqrt(var), rtol=0.1, atol=1e-6)
    # usable as mc_predict's weight snapshots; the model's own weights are restored afterwards
    before = [w.copy() for w in model.get_weights()]
    x, _ = small_data()
    mean = mc_predict(model, x[:5], weight_snapshots=moments.sample(3, seed=2), from_logits=True).mean
    np.testing.assert_allclose(np.sum(mean, axis=1), 1.0, **F32)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make, match", [
    (lambda: IterateAverage(1.0), "decay"),
    (lambda: IterateAverage(0.9, swap_at_end=1), "swap_at_end"),
    (lambda: IterateMoments(burn_in=-1), "burn_in"),
    (lambda: IterateMoments(thinning=0), "thinning"),
    (lambda: IterateMoments(scale=-1.0), "scale"),
])
def test_bad_arguments_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_moments_before_any_iterate_say_so():
    moments = IterateMoments(burn_in=100)
    _fit([moments])
    with pytest.raises(ValueError, match="no iterate"):
        moments.sample(2)
