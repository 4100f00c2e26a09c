"""Epsilon from what actually ran: every way a declaration can disagree with the training that ran.

Each test either expects a clear ``ValueError`` or compares the printed epsilon (rel. 1%) with an independent
dp-accounting computation from the realized steps, batch sizes and sampling.
"""

from __future__ import annotations

import json
import math
import warnings

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, gaussians_epsilon, rdp_epsilon, small_data, small_model
from _tiers import SLOW_ON_KERAS2, slow_on_keras2

import tfdpbnn
from tfdpbnn import _keras_version


def _poisson(sigma, q, steps):
    return rdp_epsilon(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))


def _compiled(sigma=1.0, batch_size=8, sampling="shuffle", num_examples=N, **kwargs):
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=num_examples, batch_size=batch_size, delta=DELTA,
                                 sampling=sampling, **kwargs)
    model.compile(optimizer=opt, loss=LOSS)
    return model, opt


# ------------------------------------------------------------------------ passes over the data (shuffle)
def test_unverifiable_pipeline_is_refused_and_an_assertion_counts_passes():
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # 2 batches a pass, not the declared 8
    with pytest.raises(ValueError, match="assert_sampling"):
        model.fit(batches, epochs=4, verbose=0)
    assert opt.steps == 0
    model.fit(tfdpbnn.data.assert_sampling(batches, "shuffle", num_examples=N), epochs=4, verbose=0)
    assert opt.steps == 8
    # 4 passes: the most-exposed example is in 4 noised sums (steps x declared batch / n would say 1).
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 4), rel=0.01)
    statement = opt.privacy_statement()
    assert statement["asserted_by_user"] and "asserted by the user" in statement["asserted_by_user"][0]


def test_asserted_pass_of_another_size_is_caught():
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    half = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(8),
                                        "shuffle", num_examples=N)  # asserts 64 examples, holds 32
    with pytest.raises(ValueError, match="held 32 examples"):
        model.fit(half, epochs=3, verbose=0)
    assert opt.steps == 4
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 4), rel=0.01)


def test_asserted_pass_of_fewer_examples_names_the_assertion_its_epsilon_rests_on():
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    half = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x[:32], y[:32])).batch(8),
                                        "shuffle", num_examples=N)
    with pytest.raises(ValueError, match="held 32 examples"):
        model.fit(half, epochs=1, verbose=0)
    statement = opt.privacy_statement()
    # One participation per step holds when no batch holds a record twice: the user's, and said so.
    assert statement["guarantee"] is True
    assert any("no batch holds a record twice" in a for a in statement["asserted_by_user"])


def test_asserted_pass_of_more_examples_than_records_holds_no_guarantee():
    # The last batch is row 0 eight times: its noised sum moves by 8 C for that record (dp-accounting: 69.4
    # for row 0), where nine steps of one participation each would say 17.8.
    from tfdpbnn.record.record_ledger import default_ledger

    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    rows = tf.data.Dataset.from_tensor_slices((x, y))
    pipeline = tfdpbnn.data.assert_sampling(rows.concatenate(rows.take(1).repeat(8)).batch(8), "shuffle",
                                            num_examples=N)
    with pytest.raises(ValueError, match="held 72 examples.*more than once"):
        model.fit(pipeline, epochs=2, verbose=0, record_ids=np.arange(N))
    assert opt.steps == 9
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(1.0),
                                                       dp_accounting.GaussianDpEvent(1.0 / 8)]))
    assert truth > 60
    statement = opt.privacy_statement()
    assert statement["guarantee"] is False and math.isinf(statement["epsilon"])
    assert "held 72 examples" in statement["guarantee_reason"]
    # The ledger holds a non-private release for the run's records: a later run on them quotes no bound.
    assert default_ledger().record_epsilons(None, DELTA) == [(N, math.inf)]


def test_asserted_pass_is_checked_with_steps_per_epoch_equal_to_its_cardinality():
    # steps_per_epoch equal to the pipeline's own cardinality (Keras starts a new iteration each epoch)
    # turned the pass check off: 4 iterations of 32 of the 64 examples were counted as 2 participations
    # (7.08 printed where 10.73 holds).
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    half = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N).take(32).batch(8), "shuffle", num_examples=N)
    assert int(half.cardinality()) == 4
    with pytest.raises(ValueError, match="held 32 examples"):
        model.fit(half, epochs=4, steps_per_epoch=4, verbose=0)
    assert opt.steps == 4
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 4), rel=0.01)  # each step one participation
    whole, whole_opt = _compiled(batch_size=8)
    passes = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N).batch(8), "shuffle", num_examples=N)
    whole.fit(passes, epochs=3, steps_per_epoch=8, verbose=0)  # three whole passes: checked, and counted so
    assert whole_opt.steps == 24
    assert whole_opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


@pytest.mark.parametrize("steps_per_epoch", [None, 7])
def test_an_asserted_pass_that_drops_its_last_partial_batch_is_one_pass(steps_per_epoch):
    # shuffle(60).batch(8, drop_remainder=True): each iteration 7 batches of 56 of the 60 records, each at
    # most once. The pass check refused it (held 56 examples, asserted 60) and counted the steps taken as
    # one participation each (15.18 for 7 steps); 3 iterations are 3 participations: 9.01 (dp-accounting).
    x, y = small_data(n=60)
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=60, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    dropped = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60).batch(8, drop_remainder=True), "shuffle",
        num_examples=60)
    model.fit(dropped, epochs=3, steps_per_epoch=steps_per_epoch, verbose=0)
    assert opt.steps == 21
    statement = opt.privacy_statement()
    assert statement["guarantee"]
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=1e-6)
    # A pass short by a batch or more is still refused (num_examples other than the data's).
    short = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x[:52], y[:52])).shuffle(52).batch(8, drop_remainder=True),
        "shuffle", num_examples=60)
    with pytest.raises(ValueError, match="held 48 examples"):
        model.fit(short, epochs=1, verbose=0)


def test_full_batch_pipeline_counts_every_step_as_a_participation():
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    full = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x, y)).batch(N), "shuffle",
                                        num_examples=N)
    model.fit(full, epochs=6, verbose=0)
    assert opt.steps == 6
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 6), rel=0.01)


def test_shuffle_optimizer_fed_poisson_batches_is_refused():
    x, y = small_data()
    model, opt = _compiled()
    with pytest.raises(ValueError, match="sampling"):
        model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=0.5), verbose=0)
    assert opt.steps == 0


def test_arrays_must_match_num_examples():
    x, y = small_data()
    model, opt = _compiled(num_examples=10 * N)
    with pytest.raises(ValueError, match=rf"num_examples={10 * N}.*{N} examples"):
        model.fit(x, y, batch_size=8, verbose=0)
    assert opt.steps == 0


def test_validation_split_is_counted():
    x, y = small_data()
    model, opt = _compiled(num_examples=N)
    with pytest.raises(ValueError, match="validation_split"):
        model.fit(x, y, batch_size=8, validation_split=0.25, verbose=0)
    model, opt = _compiled(num_examples=48)
    model.fit(x, y, batch_size=8, validation_split=0.25, epochs=3, verbose=0)
    assert opt.steps == 18  # 3 epochs of 48 / 8
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


def test_arrays_epsilon_counts_epochs_from_examples_processed():
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # a second fit continues the same phase
    assert opt.steps == 24 and len(opt.ledger.phases) == 1
    assert opt.ledger.phases[0].examples == 3 * N
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


# ------------------------------------------------------------------------------------ Poisson sampling
def test_prefetched_poisson_batches_keep_their_declaration():
    x, y = small_data()
    model, opt = _compiled(batch_size=8, sampling="poisson")
    model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125).prefetch(1), epochs=2, verbose=0)
    assert opt.steps == 16
    assert opt.epsilon() == pytest.approx(_poisson(1.0, 0.125, 16), rel=0.01)
    assert 0 < opt.ledger.phases[0].examples < 16 * N


def test_plain_batches_under_poisson_are_refused_and_asserted_ones_are_tested():
    x, y = small_data()
    model, opt = _compiled(batch_size=8, sampling="poisson")
    with pytest.raises(ValueError, match="assert_sampling"):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(N), verbose=0)
    # Asserted Poisson, but every batch is the whole data set: the Binomial test stops training.
    fake = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x, y)).batch(N).repeat(),
                                        "poisson", num_examples=N, sample_rate=0.125)
    with pytest.raises(ValueError, match="not Poisson"):
        model.fit(fake, epochs=1, steps_per_epoch=20, verbose=0)
    steps = opt.steps
    assert 1 <= steps <= 16
    # The steps that ran are accounted without amplification: every step as a full Gaussian.
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, steps), rel=0.01)


def test_fixed_size_batches_of_the_expected_size_fail_the_poisson_test():
    x, y = small_data()
    model, opt = _compiled(batch_size=8, sampling="poisson")
    fixed = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8),
                                         "poisson", num_examples=N, sample_rate=0.125)
    with pytest.raises(ValueError, match="too-regular"):
        model.fit(fixed, epochs=1, steps_per_epoch=40, verbose=0)
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, opt.steps), rel=0.01)


def test_fixed_sampling_seed_needs_a_flag_and_voids_amplification():
    x, y = small_data()
    with pytest.raises(ValueError, match="debug_fixed_seed"):
        tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125, seed=0)
    model, opt = _compiled(batch_size=8, sampling="poisson")
    ds = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125, seed=0, debug_fixed_seed=True)
    model.fit(ds, epochs=1, verbose=0)
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 8), rel=0.01)
    assert "fixed sampling seed" in opt.privacy_statement()["phases"][0]["sampling"]


def test_secret_seed_ignores_the_global_seed():
    x, y = small_data()
    def drawn_rows():
        # which rows each batch holds (not only how many: two pairs of Binomial(64, 0.5) sizes agree
        # with probability about 0.005, which made a size-only comparison fail now and then)
        batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.5)
        return [tuple(np.asarray(b[0])[:, 0].round(6)) for b in batches]

    tf.keras.utils.set_random_seed(0)
    first = drawn_rows()
    tf.keras.utils.set_random_seed(0)
    second = drawn_rows()
    assert first != second  # two independent Poisson draws over 64 rows agree with probability about 2**-64


# ------------------------------------------------------------------ the ledger belongs to the training
def test_recompiling_with_a_fresh_optimizer_keeps_earlier_steps():
    x, y = small_data()
    model, first = _compiled(batch_size=8)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    second = tfdpbnn.DPSGDOptimizer(1.0, 2.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=second, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    expected = rdp_epsilon(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 2),
        dp_accounting.GaussianDpEvent(2.0)]))
    assert second.epsilon() == pytest.approx(expected, rel=0.01)
    assert second.epsilon() > first.epsilon()
    assert len(second.privacy_statement()["phases"]) == 2


def test_restoring_a_checkpoint_into_other_settings_never_rewrites_epsilon(tmp_path):
    x, y = small_data()
    model, opt = _compiled(batch_size=8, sampling="poisson")
    model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125), epochs=2, verbose=0)
    before = opt.epsilon()
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
    model2, opt2 = _compiled(batch_size=8, sampling="poisson", num_examples=32)
    tf.train.Checkpoint(model=model2, optimizer=opt2).restore(path).expect_partial()
    assert opt2.steps == 16
    assert opt2.epsilon() == pytest.approx(before, rel=1e-9)
    x2, y2 = small_data(n=32)
    model2.fit(tfdpbnn.data.poisson_batches(x2, y2, sample_rate=0.25), epochs=1, verbose=0)
    phases = opt2.ledger.phases
    assert [p.steps for p in phases] == [16, 4]
    expected = rdp_epsilon(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            0.125, dp_accounting.GaussianDpEvent(1.0)), 16),
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            0.25, dp_accounting.GaussianDpEvent(1.0)), 4)]))
    assert opt2.epsilon() == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("save_format", ["tf", "keras", pytest.param("h5", marks=SLOW_ON_KERAS2)])
def test_model_save_formats_keep_the_ledger(tmp_path, save_format):
    if _keras_version.KERAS_MAJOR == 3 and save_format != "keras":
        pytest.skip({"tf": "Keras 3's model.save writes no SavedModel (tfdpbnn.export does)",
                     "h5": "Keras 3 cannot fit a model loaded from .h5 with its optimizer (plain SGD alike: "
                           "'Unknown variable', the optimizer is built on other variables)"}[save_format])
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    path = str(tmp_path / ("m.keras" if save_format == "keras" else "m.h5" if save_format == "h5" else "m"))
    model.save(path) if save_format == "keras" else model.save(path, save_format=save_format)
    loaded = tf.keras.models.load_model(path)
    assert loaded.optimizer.epsilon() == pytest.approx(opt.epsilon(), rel=1e-9)
    loaded.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert loaded.optimizer.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


def test_custom_loop_needs_begin_training():
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    with pytest.raises(ValueError, match="begin_training"):
        with tf.GradientTape() as tape:
            loss = tf.keras.losses.sparse_categorical_crossentropy(y[:8], model(x[:8]), from_logits=True)
        opt.minimize(loss, model.trainable_variables, tape=tape)
    opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="per-example cross-entropy")
    for start in range(0, N, 8):
        with tf.GradientTape() as tape:
            loss = tf.keras.losses.sparse_categorical_crossentropy(y[start:start + 8],
                                                                   model(x[start:start + 8]),
                                                                   from_logits=True)
        opt.minimize(loss, model.trainable_variables, tape=tape)
    assert opt.ledger.phases[0].examples == N
    # The loop picks its batches (it could feed one batch 8 times): each step is one participation.
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 8), rel=0.01)


# ------------------------------------------------------------------------------ accountants, sigma = 0
def test_optimizer_epsilon_comes_from_a_sound_accountant():
    with pytest.raises(ValueError, match="sound"):
        tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, accountant="gdp")
    x, y = small_data()
    model, opt = _compiled(batch_size=8, sampling="poisson")
    model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125), epochs=1, verbose=0)
    statement = opt.privacy_statement()
    assert set(statement["epsilon_by_accountant"]) == set(tfdpbnn.privacy.sound_accountants())
    assert "gdp" in statement["approximate_epsilon"]["values"]
    assert "not guarantees" in statement["approximate_epsilon"]["note"]
    with pytest.raises(ValueError, match="sound"):
        opt.epsilon(accountant="gdp")


def test_sigma_zero_is_infinite_epsilon():
    x, y = small_data()
    model, opt = _compiled(sigma=0.0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert math.isinf(opt.epsilon())


# ---------------------------------------------------------------------------------------- sensitivity
class _ActivityLoss(tf.keras.layers.Layer):
    """Adds a loss computed from its input (an activity penalty): data-dependent."""

    def call(self, inputs):
        self.add_loss(tf.reduce_mean(tf.square(inputs)))
        return inputs


def test_data_dependent_add_loss_is_refused():
    inputs = tf.keras.Input((D,))
    hidden = _ActivityLoss()(tf.keras.layers.Dense(5)(inputs))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(hidden))
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8), loss=LOSS)
    x, y = small_data()
    with pytest.raises(ValueError, match="model.losses depends on the input"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_weight_regularization_is_allowed():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3, kernel_regularizer="l2")])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8), loss=LOSS)
    x, y = small_data()
    model.fit(x, y, batch_size=8, verbose=0)
    assert model.optimizer.steps == 8


def test_batch_statistics_in_a_lambda_are_refused():
    model = tf.keras.Sequential([
        tf.keras.Input((D,)), tf.keras.layers.Dense(5),
        tf.keras.layers.Lambda(lambda h: h - tf.reduce_mean(h, axis=0, keepdims=True)),
        tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8), loss=LOSS)
    x, y = small_data()
    with pytest.raises(ValueError, match="mixes examples"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_already_reduced_compiled_loss_is_refused():
    model = small_model()

    def mean_loss(y_true, y_pred):
        per_example = tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        return tf.reduce_mean(per_example)

    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8), loss=mean_loss)
    x, y = small_data()
    with pytest.raises(ValueError, match="one loss per example"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_loss_that_couples_examples_is_refused():
    model = small_model()

    def centered(y_true, y_pred):
        per = tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        return per - tf.reduce_mean(per)

    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8), loss=centered)
    x, y = small_data()
    with pytest.raises(ValueError, match="other examples"):
        model.fit(x, y, batch_size=8, verbose=0)


# ---------------------------------------------------------------------------------------------- budgets
def test_budget_warns_and_stops_before_it_would_be_exceeded():
    x, y = small_data()
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, target_epsilon=2.0, delta=DELTA, num_examples=N, batch_size=8, epochs=2,
                                 sampling="poisson")
    model.compile(optimizer=opt, loss=LOSS)
    ds = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125)
    with pytest.warns(UserWarning, match="budget"):
        history = model.fit(ds, epochs=8, verbose=0)
    assert opt.steps < 8 * 8
    assert opt.epsilon() <= 2.0 < _poisson(opt.noise_multiplier, 0.125, opt.steps + 1) * 1.0001
    assert history.history["epsilon"][-1] == pytest.approx(opt.epsilon(), rel=1e-9)
    with pytest.raises(ValueError, match="spent"):
        model.fit(ds, epochs=1, verbose=0)


def test_budget_can_be_exceeded_only_by_asking():
    x, y = small_data()
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, target_epsilon=2.0, delta=DELTA, num_examples=N, batch_size=8, epochs=1,
                                 allow_exceeding_budget=True)
    model.compile(optimizer=opt, loss=LOSS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert any("allow_exceeding_budget" in str(w.message) for w in caught)
    assert opt.steps == 24 and opt.epsilon() > 2.0
    assert opt.privacy_statement()["target_epsilon"] == 2.0


@slow_on_keras2   # a reporting path (TensorBoard files); the epsilon it logs: the tests above
def test_epsilon_reaches_tensorboard_whatever_the_callback_order(tmp_path):
    x, y = small_data()
    model, opt = _compiled(batch_size=8)
    board = tf.keras.callbacks.TensorBoard(str(tmp_path / "logs"))
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                        callbacks=[board, tfdpbnn.PrivacyCallback(delta=DELTA)])
    assert history.history["epsilon"][-1] == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)
    events = list((tmp_path / "logs" / "train").glob("events.out.tfevents.*"))
    tags = set()
    for event_file in events:
        for record in tf.compat.v1.train.summary_iterator(str(event_file)):
            tags.update(v.tag for v in record.summary.value)
    assert "epoch_epsilon" in tags


def test_privacy_statement_is_json():
    x, y = small_data()
    model, opt = _compiled()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    text = json.dumps(opt.privacy_statement(), allow_nan=False)
    assert json.loads(text)["phases"][0]["participations"] == 1


def test_private_api_adapter_matches_the_pinned_versions():
    from tfdpbnn import _adapters, _private_api

    _private_api.check()
    _adapters.current().check()  # the adapter's own (Keras 2: the optimizer's slots; Keras 3 again)


def test_secure_mode_is_an_optimizer_argument_reported_in_the_statement():
    x, y = small_data()
    model, opt = _compiled(secure_mode=True)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    noise = opt.privacy_statement()["noise"]
    assert noise["secure_mode"] is True and noise["max_abs_noise_over_sigma_c"] > 13.0
    assert noise["tail_reveal_probability_per_step"] < 1e-28
    assert tfdpbnn.DPSGDOptimizer.from_config(opt.get_config())._dp_static["secure_mode"] is True
    with pytest.raises(ValueError, match="secure_mode"):
        _compiled(secure_mode="yes")
