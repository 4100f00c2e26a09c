"""DP optimizers: bad input, the scalar-loss error, custom train steps, accounting state through checkpoints
and save formats, the SavedModel privacy statement, and each optimizer's own quantities."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn
from tfdpbnn import privacy
from tfdpbnn.privacy import gdp_epsilon

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
COMMON = dict(num_examples=40, batch_size=10, delta=1e-5)


def _data(n=40, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, 3, n)


def _model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("cls", [tfdpbnn.DPSGDOptimizer, tfdpbnn.DPAdamOptimizer, tfdpbnn.DPVDOptimizer,
                                 tfdpbnn.SIDPOptimizer])
@pytest.mark.parametrize("kwargs,argument", [
    (dict(l2_norm_clip=0.0, noise_multiplier=1.0, num_examples=40, batch_size=10), "l2_norm_clip"),
    (dict(l2_norm_clip=-1.0, noise_multiplier=1.0, num_examples=40, batch_size=10), "l2_norm_clip"),
    (dict(l2_norm_clip=1.0, num_examples=40, batch_size=10), "noise_multiplier and target_epsilon"),
    (dict(l2_norm_clip=1.0, target_epsilon=1.0, delta=1e-5, epochs=2, batch_size=10), "num_examples"),
    (dict(l2_norm_clip=1.0, target_epsilon=1.0, delta=1e-5, epochs=2, num_examples=40), "batch_size"),
    (dict(l2_norm_clip=1.0, target_epsilon=1.0, delta=1e-5, num_examples=40, batch_size=10), "epochs"),
    (dict(l2_norm_clip=1.0, target_epsilon=1.0, epochs=2, num_examples=40, batch_size=10), "delta"),
    (dict(l2_norm_clip=1.0, noise_multiplier=-1.0, num_examples=40, batch_size=10), "noise_multiplier"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_examples=40, batch_size=50), "batch_size"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_examples=40, batch_size=10, sampling="uniform"),
     "sampling"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_examples=40, batch_size=10, accountant="moments"),
     "accountant"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_examples=40, batch_size=10, neighboring="swap"),
     "neighboring"),
    (dict(l2_norm_clip=1.0, noise_multiplier=1.0, num_examples=40, batch_size=10, sampling="poisson",
          neighboring="replace_one"), "neighboring"),  # RDP cannot bound Poisson sampling under replace-one
])
def test_bad_input_names_the_argument(cls, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        cls(**kwargs)


@pytest.mark.parametrize("kwargs,argument", [
    (dict(l2_norm_clip=0.0, learning_rate=0.1), "l2_norm_clip"),
    (dict(l2_norm_clip=1.0), "learning_rate and target_epsilon"),
    (dict(l2_norm_clip=1.0, learning_rate=0.1, epsilon=1.0), "target_epsilon"),
    (dict(l2_norm_clip=1.0, target_epsilon=1.0, delta=1e-5), "epochs"),
    (dict(l2_norm_clip=1.0, learning_rate=0.1, momentum=0.9), "momentum"),
    (dict(l2_norm_clip=1.0, learning_rate=0.1, prior_stddev=0.0), "prior_stddev"),
])
def test_sgld_bad_input(kwargs, argument):
    kwargs = {"num_examples": 40, "batch_size": 10, **kwargs}
    with pytest.raises(ValueError, match=argument):
        tfdpbnn.DPSGLDOptimizer(**kwargs)


def test_budget_calibrates_sigma_to_the_accountant():
    opt = tfdpbnn.DPSGDOptimizer(1.0, target_epsilon=2.0, epochs=3, sampling="poisson", **COMMON)
    expected = privacy.calibrate_noise(2.0, 1e-5, 0.25, 12, accountant="rdp", sampling="poisson")
    assert opt.noise_multiplier == pytest.approx(expected, rel=1e-12)
    assert opt.epsilon_after(12) <= 2.0


# ------------------------------------------------------------------------------------- custom train steps
class CustomStepModel(tf.keras.Model):
    def __init__(self, reduce):
        super().__init__()
        self.dense = tf.keras.layers.Dense(3)
        self.reduce = reduce

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            per_example = tf.keras.losses.sparse_categorical_crossentropy(y, self(x), from_logits=True)
            loss = tf.reduce_mean(per_example) if self.reduce else per_example
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return {"loss": tf.reduce_mean(per_example)}


def test_scalar_loss_raises_and_says_what_to_pass():
    x, y = _data()
    model = CustomStepModel(reduce=True)
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, **COMMON))
    with pytest.raises(ValueError, match=r"per-example loss vector of shape \[batch\]"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0)


def test_per_example_loss_vector_in_custom_step_is_private():
    """tf-privacy's contract: a [batch] loss to minimize; sigma 0 and a huge clip give plain SGD."""
    x, y = _data()
    model = CustomStepModel(reduce=False)
    opt = tfdpbnn.DPSGDOptimizer(1e6, 0.0, learning_rate=0.1, **dict(COMMON, num_examples=10))
    model.compile(optimizer=opt)
    model(x[:1])
    w0 = [w.numpy() for w in model.trainable_variables]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y[:10], model(x[:10]),
                                                                              from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    model.fit(x[:10], y[:10], batch_size=10, epochs=1, verbose=0, shuffle=False)
    for v, w, g in zip(model.trainable_variables, w0, grads, strict=True):
        np.testing.assert_allclose(v.numpy(), w - 0.1 * g.numpy(), rtol=1e-5, atol=1e-6)
    assert opt.steps == 1


def test_trainable_batch_norm_is_refused():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, **COMMON), loss=LOSS)
    x, y = _data()
    with pytest.raises(ValueError, match="BatchNormalization"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0)


def test_activity_regularizer_is_refused():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activity_regularizer="l2")])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, **COMMON), loss=LOSS)
    x, y = _data()
    with pytest.raises(ValueError, match="activity_regularizer"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0)


def test_empty_poisson_batches_do_not_crash():
    x, y = _data(n=5)
    model = _model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=5, batch_size=1, sampling="poisson", delta=1e-5,
                                 release_training_metrics=("loss",))
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
    # Three empty Poisson batches (probability 0.8^15 = 0.035 at q = 0.2: rare, not impossible).
    empty = tf.data.Dataset.from_tensors((x[:0], y[:0])).repeat(3)
    ds = tfdpbnn.data.assert_sampling(empty, "poisson", num_examples=5, sample_rate=0.2)
    w0 = model.get_weights()
    history = model.fit(ds, epochs=1, verbose=0)
    assert opt.steps == 3 and np.isfinite(history.history["loss"][0])
    assert any(not np.allclose(a, b) for a, b in zip(w0, model.get_weights(), strict=True))  # noise only


# ------------------------------------------------------------------------------ accounting state survives
CHECKPOINT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, tensorflow as tf
    import tfdpbnn
    ckpt, data = sys.argv[1], np.load(sys.argv[2])
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    # Deliberately different sigma: the checkpoint's accounting state must win.
    opt = tfdpbnn.DPSGDOptimizer(1.0, 5.0, num_examples=40, batch_size=10, delta=1e-5)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    tf.train.Checkpoint(model=model, optimizer=opt).restore(ckpt).assert_existing_objects_matched()
    model.fit(data["x"], data["y"], batch_size=10, epochs=1, verbose=0)
    print(repr((opt.steps, opt.noise_multiplier, opt.epsilon())))
""")


@pytest.mark.slow   # not in the fast tier: a fresh interpreter that imports TensorFlow
def test_checkpoint_restore_in_fresh_process_reports_three_epoch_epsilon(tmp_path):
    x, y = _data()
    model = _model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.1, **COMMON)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=2, verbose=0)
    assert opt.steps == 8
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
    np.savez(tmp_path / "data.npz", x=x, y=y)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", CHECKPOINT_SCRIPT, path, str(tmp_path / "data.npz")],
                         capture_output=True, text=True, env=env, timeout=240, check=True)
    steps, sigma, epsilon = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr
    three_epochs = privacy.compute_epsilon(1.1, 0.25, 12, 1e-5, accountant="rdp", sampling="shuffle")
    assert (steps, sigma) == (12, pytest.approx(1.1))
    assert epsilon == pytest.approx(three_epochs, rel=1e-9)
    assert opt.epsilon_after(12) == pytest.approx(three_epochs, rel=1e-9)  # what a 3-epoch run reports


@pytest.mark.parametrize("fmt", ["keras", "h5"])
def test_model_save_and_config_carry_accounting(tmp_path, fmt):
    x, y = _data()
    model = _model()
    opt = tfdpbnn.DPAdamOptimizer(0.7, 1.3, learning_rate=0.01, sampling="shuffle", neighboring="replace_one",
                                  **COMMON)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    path = str(tmp_path / f"model.{fmt}")
    model.save(path)
    loaded = tf.keras.models.load_model(path)
    restored = loaded.optimizer
    assert type(restored) is tfdpbnn.DPAdamOptimizer
    assert (restored.steps, restored.noise_multiplier, restored.l2_norm_clip, restored.sample_rate,
            restored.sampling, restored.neighboring) == (4, pytest.approx(1.3), pytest.approx(0.7), 0.25,
                                                         "shuffle", "replace_one")
    assert restored.epsilon() == pytest.approx(opt.epsilon(), rel=1e-9)
    clone = tfdpbnn.DPAdamOptimizer.from_config(opt.get_config())
    assert clone.epsilon() == pytest.approx(opt.epsilon(), rel=1e-9)
    assert float(clone.epsilon) == pytest.approx(1e-7)  # Adam's own epsilon is kept apart


def test_budget_and_adams_epsilon_cannot_be_confused():
    adam = tfdpbnn.DPAdamOptimizer(1.0, 1.0, epsilon=1e-4, **COMMON)  # Keras's meaning: Adam's constant
    assert float(adam.epsilon) == pytest.approx(1e-4) and adam.target_epsilon is None
    budget = tfdpbnn.DPAdamOptimizer(1.0, target_epsilon=2.0, epochs=2, **COMMON)
    assert budget.target_epsilon == 2.0 and budget.epsilon_after(8) <= 2.0
    for cls in (tfdpbnn.DPSGDOptimizer, tfdpbnn.DPVDOptimizer, tfdpbnn.SIDPOptimizer):
        with pytest.raises(ValueError, match="target_epsilon"):
            cls(1.0, epsilon=1.0, epochs=2, **COMMON)
    with pytest.raises(TypeError):  # learning_rate is keyword-only: no positional mix-up with sigma
        tfdpbnn.DPSGLDOptimizer(1.0, 0.1, **COMMON)


@pytest.mark.parametrize("cls", [tfdpbnn.DPSGDOptimizer, tfdpbnn.DPAdamOptimizer, tfdpbnn.DPVDOptimizer,
                                 tfdpbnn.SIDPOptimizer, tfdpbnn.DPSGLDOptimizer])
def test_signatures_show_every_documented_argument(cls):
    import inspect

    names = set(inspect.signature(cls.__init__).parameters)
    for name in ("l2_norm_clip", "target_epsilon", "delta", "num_examples", "batch_size", "epochs",
                 "accountant", "sampling", "neighboring", "clipping_method", "allow_exceeding_budget",
                 "learning_rate"):
        assert name in names, name


def test_saved_model_privacy_json(tmp_path):
    x, y = _data()
    model = _model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.2, sampling="poisson", **COMMON)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(tfdpbnn.data.poisson_batches(x, y, 0.25), epochs=1, verbose=0)
    tfdpbnn.export_saved_model(model, str(tmp_path / "sm"), num_samples=2)
    with open(tmp_path / "sm" / "assets" / "privacy.json") as fh:
        statement = json.load(fh)  # plain JSON: readable without tfdpbnn
    expected = privacy.compute_epsilon(1.2, 0.25, 4, 1e-5, accountant="rdp", sampling="poisson")
    assert statement["epsilon"] == pytest.approx(expected, rel=1e-9)
    keys = ("method", "accountant", "delta", "sampling", "steps", "neighboring")
    assert {k: statement[k] for k in keys} == {
        "method": "DP-SGD", "accountant": "rdp", "delta": 1e-5, "sampling": "poisson", "steps": 4,
        "neighboring": "add_or_remove"}
    assert statement["noise_multiplier"] == pytest.approx(1.2)
    assert statement["l2_norm_clip"] == 1.0 and statement["sample_rate"] == 0.25
    assert set(statement["epsilon_by_accountant"]) == set(privacy.sound_accountants())
    assert statement["epsilon_by_accountant"]["pld"] == pytest.approx(
        privacy.compute_epsilon(1.2, 0.25, 4, 1e-5, accountant="pld", sampling="poisson"), rel=1e-9)


# ------------------------------------------------------------------------------- optimizer-specific parts
def test_dpvd_logs_zeta_and_implied_dropout_rate():
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.DenseVariational(3, num_examples=40)])
    opt = tfdpbnn.DPVDOptimizer(1.5, 2.0, learning_rate=0.3, **dict(COMMON, num_examples=10))
    model.compile(optimizer=opt, loss=LOSS)
    history = model.fit(x[:10], y[:10], batch_size=10, epochs=1, verbose=0)
    zeta = 0.3 * 2.0 * 1.5 / 10
    assert history.history["zeta"][0] == pytest.approx(zeta, rel=1e-5)
    theta = model.layers[0].theta.numpy()  # one step, so the logged median is of the pre-update theta
    alpha = history.history["dp_alpha_median"][0]
    lo = np.median(zeta ** 2 / theta.ravel() ** 2) / 100
    assert lo < alpha < 100 * np.median(zeta ** 2 / theta.ravel() ** 2)
    opt2 = tfdpbnn.DPVDOptimizer(1.5, 2.0, learning_rate=0.3, **dict(COMMON, num_examples=10))
    model.compile(optimizer=opt2, loss=LOSS)
    opt2.begin_training(model, x[:10], y[:10], batch_size=10)
    logs = opt2.dp_train_step(model, (x[:10], y[:10]))
    np.testing.assert_allclose(float(logs["dp_alpha_median"]),
                               np.median(zeta ** 2 / model.layers[0].theta.numpy().ravel() ** 2), rtol=0.2)


def test_dpvd_alpha_median_subsample_tracks_exact_median_on_large_layers():
    # 200 x 100 = 20,000 weights > ALPHA_MEDIAN_SAMPLE: the logged median is over a strided subsample of
    # 10,000; for i.i.d. glorot-initialised theta it must be within 5% of the exact median.
    from tfdpbnn.optimizers.dpvd import ALPHA_MEDIAN_SAMPLE
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 200)).astype("float32")
    y = rng.integers(0, 3, size=10)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((200,)), tfdpbnn.DenseVariational(100, num_examples=40),
                                 tf.keras.layers.Dense(3)])
    assert model.layers[0].theta.shape.num_elements() > ALPHA_MEDIAN_SAMPLE
    opt = tfdpbnn.DPVDOptimizer(1.5, 2.0, learning_rate=0.3, **dict(COMMON, num_examples=10))
    model.compile(optimizer=opt, loss=LOSS)
    theta_before = model.layers[0].theta.numpy().ravel()
    opt.begin_training(model, x, y, batch_size=10)
    logs = opt.dp_train_step(model, (x, y))
    theta_after = model.layers[0].theta.numpy().ravel()
    zeta = 0.3 * 2.0 * 1.5 / 10
    # The step's noise (std zeta = 0.09) is of the weights' own size, so the two medians differ by far more
    # than 5%; the logged one must match one of them.
    medians = [np.median(zeta ** 2 / t ** 2) for t in (theta_before, theta_after)]
    assert abs(medians[0] - medians[1]) > 0.2 * medians[0]
    exact = min(medians, key=lambda m: abs(m - float(logs["dp_alpha_median"])))
    np.testing.assert_allclose(float(logs["dp_alpha_median"]), exact, rtol=0.05)


def test_sgld_equivalence_and_budget_calibration():
    n, b, clip = 40, 10, 0.5
    opt = tfdpbnn.DPSGLDOptimizer(clip, learning_rate=1e-3, num_examples=n, batch_size=b, delta=1e-5)
    assert opt.noise_multiplier == pytest.approx(b / (n * math.sqrt(1e-3) * clip))  # Zhang 2022 Thm. 1
    budget = tfdpbnn.DPSGLDOptimizer(clip, target_epsilon=3.0, delta=1e-5, epochs=2, num_examples=n,
                                     batch_size=b)
    eta = float(budget.learning_rate.numpy())
    sigma = privacy.calibrate_noise(3.0, 1e-5, 0.25, 8, accountant="rdp", sampling="shuffle")
    assert eta == pytest.approx((b / (n * sigma * clip)) ** 2, rel=1e-6)
    assert budget.epsilon_after(8) <= 3.0


def test_posterior_sampler_feeds_mc_predict():
    x, y = _data()
    model = _model()
    opt = tfdpbnn.DPSGLDOptimizer(0.5, learning_rate=1e-3, num_examples=40, batch_size=10, delta=1e-5)
    model.compile(optimizer=opt, loss=LOSS)
    sampler = tfdpbnn.PosteriorSampler(burn_in=3, thinning=2, max_samples=3)
    model.fit(x, y, batch_size=10, epochs=3, verbose=0, callbacks=[sampler])  # 12 steps
    assert list(sampler.sampled_steps) == [7, 9, 11]  # 5, 7, 9, 11 kept after step 3; the last 3 retained
    assert len(sampler.samples) == 3 and not np.allclose(sampler.samples[0][0], sampler.samples[-1][0])
    pred = tfdpbnn.mc_predict(model, x[:5], weight_snapshots=sampler.samples, from_logits=True)
    assert np.asarray(pred.mean).shape == (5, 3)


def test_sidp_sets_layer_noise_and_paper_mode_epsilon():
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    # No trainable scale and offset in the normalization: paper mode (below) trains noisy layers alone.
    model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(5),
                                 tf.keras.layers.LayerNormalization(center=False, scale=False),
                                 tfdpbnn.NoisyDense(3)])
    opt = tfdpbnn.SIDPOptimizer(1.0, 4.0, learning_rate=0.2, **COMMON)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    s = 0.2 * 1.0 * 4.0 / 10  # eta C z / B
    for layer in (model.layers[0], model.layers[2]):
        assert float(layer.noise_stddev.numpy()) == pytest.approx(s, rel=1e-6)
    assert opt.epsilon() == pytest.approx(
        privacy.compute_epsilon(4.0, 0.25, 4, 1e-5, accountant="rdp", sampling="shuffle"), rel=1e-9)

    with pytest.warns(UserWarning, match="Lemma 4.1"):
        paper = tfdpbnn.SIDPOptimizer(1.0, 4.0, learning_rate=0.2, paper_mean_update=True, **COMMON)
    model.compile(optimizer=paper, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    t = 4  # releases theta_1..theta_4 with Delta_k / s = k / z (theta_0 is data-independent)
    mu = math.sqrt(sum((k / 4.0) ** 2 for k in range(1, t + 1)))
    assert paper.paper_mode_gdp_mu() == pytest.approx(mu, rel=1e-5)
    assert paper.epsilon_after(4) == pytest.approx(gdp_epsilon(mu, 1e-5), rel=1e-5)
    # The model's ledger also holds the first optimizer's pass (one Gaussian of sigma 4): exact GDP of both.
    assert paper.epsilon() == pytest.approx(gdp_epsilon(math.sqrt(mu ** 2 + 1 / 16.0), 1e-5), rel=1e-5)
    assert paper.epsilon() > opt.epsilon()
    with pytest.raises(ValueError, match="release_weights"):  # the model still holds mu: no statement
        paper.privacy_statement()
    kernel = model.layers[0].kernel.numpy()
    paper.release_weights(model)
    assert not np.allclose(kernel, model.layers[0].kernel.numpy())  # mu replaced by one sample
    statement = paper.privacy_statement()
    assert "Lemma 4.1" in statement["note"] and statement["gdp_mu"] == pytest.approx(mu, rel=1e-5)


def test_gdp_epsilon_matches_gaussian_mechanism_duality():
    # mu-GDP <-> (eps, delta): delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong et al.)
    from scipy import stats

    for mu in (0.5, 1.0, 3.0):
        eps = gdp_epsilon(mu, 1e-5)
        delta = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
        assert delta == pytest.approx(1e-5, rel=1e-6)


def test_per_example_losses_from_every_kind_of_compiled_loss():
    from tfdpbnn.optimizers import compiled_per_example_loss_fn

    x, y = _data(n=6)
    inputs = tf.keras.Input((4,))
    a = tf.keras.layers.Dense(3, activation="softmax")(inputs)
    b = tf.keras.layers.Dense(2)(inputs)
    model = tf.keras.Model(inputs, [a, b])
    y2 = np.random.default_rng(1).normal(size=(6, 2)).astype(np.float32)
    sw = np.linspace(0.5, 2.0, 6).astype(np.float32)

    def mse(y_true, y_pred):  # a plain function
        return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)

    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=6, batch_size=6),
                  loss=["sparse_categorical_crossentropy", mse], loss_weights=[1.0, 0.3])
    fn = compiled_per_example_loss_fn(model)
    pa, pb = model(x)
    per_example = fn([y, y2], [pa, pb], sw).numpy()
    expected = (tf.keras.losses.sparse_categorical_crossentropy(y, pa).numpy()
                + 0.3 * mse(y2, pb).numpy()) * sw
    np.testing.assert_allclose(per_example, expected, rtol=1e-5)
    # Targets as a tuple (Keras 3's data adapters pass fit's list on so): paired by position all the same.
    np.testing.assert_allclose(fn((y, y2), [pa, pb], sw).numpy(), expected, rtol=1e-5)
    model.fit(x, [y, y2], batch_size=6, epochs=1, verbose=0)
    assert model.optimizer.steps == 1
    # its weighted mean is Keras's own (SUM_OVER_BATCH_SIZE) compiled loss
    keras_loss = float(model.compiled_loss([tf.constant(y), tf.constant(y2)], [pa, pb],
                                           sample_weight=tf.constant(sw)))
    assert per_example.mean() == pytest.approx(keras_loss, rel=1e-5)

    single = _model()
    single.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=6, batch_size=6),
                   loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"))
    logits = single(x)
    np.testing.assert_allclose(compiled_per_example_loss_fn(single)(y, logits).numpy(),
                               LOSS.call(tf.constant(y), logits).numpy(), rtol=1e-6)  # reduction ignored


def test_fit_refuses_sampling_the_accounting_does_not_cover():
    x, y = _data()
    model = _model()
    poisson = tfdpbnn.DPSGDOptimizer(1.0, 1.0, sampling="poisson", **COMMON)
    model.compile(optimizer=poisson, loss=LOSS)
    with pytest.raises(ValueError, match="sampling='poisson'"):  # arrays are shuffled fixed-size batches
        model.fit(x, y, batch_size=10, verbose=0)
    with pytest.raises(ValueError, match="rate 0.5"):  # sampled at another rate than accounted for
        model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=0.5), verbose=0)
    with pytest.raises(ValueError, match="assert_sampling"):  # an untagged dataset: cannot check, refuse
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(10), verbose=0)
    shuffle = tfdpbnn.DPSGDOptimizer(1.0, 1.0, **COMMON)
    model.compile(optimizer=shuffle, loss=LOSS)
    with pytest.raises(ValueError, match="batch_size"):  # Keras's default batch of 32 > the accounted 10
        model.fit(x, y, verbose=0)
    assert shuffle.steps == 0


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_budget_steps_left_before_any_fit_plans_the_declared_mechanism(sampling):
    # With no phase open (no fit yet), the planned steps counted nothing and the search ran to 2^30 steps.
    # Now they are the declared mechanism's: the largest count whose epsilon (dp-accounting, independently)
    # stays within the target.
    import dp_accounting

    import tfdpbnn
    from tfdpbnn.privacy import dp_sgd_event

    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, target_epsilon=5.0, delta=1e-5,
                                 sampling=sampling)

    def truth(steps):
        event = (dp_sgd_event(1.0, 8 / 64, steps) if sampling == "poisson" else
                 dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), math.ceil(steps / 8)))
        return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(1e-5)

    left = opt.budget_steps_left()
    assert 0 < left < 1000   # 19 and 8 here
    assert truth(left) <= 5.0 < truth(left + 1)
