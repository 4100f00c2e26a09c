"""``SIDPOptimizer(weight_noise=s)``: a constant weight-noise std in the sound mode (Davody et al. 2020,
SI-DPSGD; Table 1 trains with a fixed s), its accounting and its configuration."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdpbnn

COMMON = dict(num_examples=40, batch_size=10, delta=1e-5, learning_rate=0.2)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _model(affine=True):
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(5),
                                tf.keras.layers.LayerNormalization(center=affine, scale=affine),
                                tfdpbnn.NoisyDense(3)])


def test_constant_weight_noise_is_used_and_keeps_the_dp_sgd_epsilon():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    fixed = tfdpbnn.SIDPOptimizer(1.0, 4.0, weight_noise=0.37, **COMMON)
    assert float(fixed.weight_noise_stddev().numpy()) == pytest.approx(0.37)
    model = _model()
    model.compile(optimizer=fixed, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    for layer in (model.layers[0], model.layers[2]):
        assert float(layer.noise_stddev.numpy()) == pytest.approx(0.37, rel=1e-6)
    default = tfdpbnn.SIDPOptimizer(1.0, 4.0, **COMMON)
    assert float(default.weight_noise_stddev().numpy()) == pytest.approx(0.2 * 1.0 * 4.0 / 10, rel=1e-6)
    # The weights are post-processing of mu (DP-SGD's sequence): the same epsilon as the default mode.
    assert fixed.epsilon() == pytest.approx(default.epsilon_after(fixed.steps), rel=1e-12)
    restored = tfdpbnn.SIDPOptimizer.from_config(fixed.get_config())
    assert restored.weight_noise == 0.37 and restored.steps == 4


def test_weight_noise_is_refused_in_paper_mode_and_out_of_range():
    with pytest.raises(ValueError, match="weight_noise.*sound mode"):
        tfdpbnn.SIDPOptimizer(1.0, 4.0, weight_noise=0.1, paper_mean_update=True, **COMMON)
    for bad in (-0.1, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="weight_noise"):
            tfdpbnn.SIDPOptimizer(1.0, 4.0, weight_noise=bad, **COMMON)


@pytest.mark.parametrize("kwargs", [{"momentum": 0.9}, {"momentum": 0.5, "nesterov": True}])
def test_paper_mode_refuses_momentum(kwargs):
    # The paper mode adds eta C / B to the mean's sensitivity per step (plain SGD); with momentum 0.9 one
    # example moved the mean by 0.0221 where 0.00625 was accounted (8 full-batch steps, lr 0.05): printed
    # 2.98 where the momentum bound gives 11.4.
    with pytest.raises(ValueError, match="momentum: paper_mean_update=True accounts for plain SGD"):
        tfdpbnn.SIDPOptimizer(1.0, 4.0, paper_mean_update=True, **kwargs, **COMMON)
    tfdpbnn.SIDPOptimizer(1.0, 4.0, **kwargs, **COMMON)  # the sound mode: momentum is post-processing


def test_paper_mode_statement_keeps_a_void_guarantee_void():
    # Replayable noise (debug_noise_seed): two runs on neighbouring data are told apart, no epsilon holds.
    # The paper mode's own accounting must not write a finite epsilon over that.
    import warnings

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lemma 4.1 and debug_noise_seed warn
        paper = tfdpbnn.SIDPOptimizer(1.0, 4.0, paper_mean_update=True, debug_noise_seed=3, **COMMON)
    model = _model(affine=False)
    model.compile(optimizer=paper, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    paper.release_weights(model)
    statement = paper.privacy_statement()
    assert statement["guarantee"] is False
    assert statement["epsilon"] == float("inf") and statement["quote"]["epsilon"] == float("inf")
    assert 0 < statement["epsilon_by_accountant"]["gdp_exact"] < float("inf")


@pytest.mark.parametrize("plain", ["dense head", "layer norm", "frozen"])
def test_paper_mode_refuses_trainable_variables_outside_the_noisy_layers(plain):
    # A plain Dense head, or a LayerNormalization's scale and offset, would be updated with the clipped mean
    # without noise and released as they are: bit-identical across two runs on the same data with fresh
    # noise, different on neighbouring data, while 2.98 was printed with guarantee: true. Frozen, they are
    # constants of the model.
    import warnings

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    tf.keras.utils.set_random_seed(0)
    extra = {"dense head": [tf.keras.layers.Dense(3)],
             "layer norm": [tf.keras.layers.LayerNormalization(), tfdpbnn.NoisyDense(3)],
             "frozen": [tf.keras.layers.LayerNormalization(trainable=False), tfdpbnn.NoisyDense(3)]}[plain]
    model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(5, activation="tanh"), *extra])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lemma 4.1
        paper = tfdpbnn.SIDPOptimizer(1.0, 4.0, paper_mean_update=True, **COMMON)
    model.compile(optimizer=paper, loss=LOSS)
    if plain == "frozen":
        model.fit(x, y, batch_size=10, epochs=1, verbose=0)
        assert paper.steps == 4
        return
    with pytest.raises(ValueError, match="paper_mean_update=True every trainable variable must be a noisy"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    assert paper.steps == 0
    # The sound mode trains the same model: every update is DP-SGD's.
    sound = tfdpbnn.SIDPOptimizer(1.0, 4.0, **COMMON)
    model.compile(optimizer=sound, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    assert sound.steps == 4


def test_paper_mode_statement_has_a_ledger_bound_over_its_records():
    # Its phase was rebuilt with a fresh id at each statement, so the per-record ledger's release of the
    # run (under the phase's own id) was not found: "unavailable (records unknown)" for a fit on arrays.
    import warnings

    import dp_accounting

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lemma 4.1 warns
        paper = tfdpbnn.SIDPOptimizer(1.0, 4.0, paper_mean_update=True, **COMMON)
    model = _model(affine=False)
    model.compile(optimizer=paper, loss=LOSS)
    model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    paper.release_weights(model)
    statement = paper.privacy_statement()
    mu = paper.paper_mode_gdp_mu()   # 4 steps: sqrt(sum_t (t / z)^2)
    assert mu == pytest.approx(np.sqrt(sum((t / 4.0) ** 2 for t in range(1, 5))), rel=1e-6)
    truth = dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(1.0 / mu)).get_epsilon(
        COMMON["delta"])
    assert statement["ledger_bound"]["records"] == 40
    assert statement["ledger_bound"]["epsilon"] >= truth * (1 - 1e-6)
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-6)


@pytest.mark.parametrize("how", ["noise set to 0 by hand", "a schedule raising the rate at the last step"])
def test_paper_mode_releases_the_sample_with_the_noise_it_accounts(how):
    # release_weights drew with the layers' noise_stddev: 0 after set_noise_stddev(0) released mu itself
    # (no epsilon holds; 2.98 was printed, guarantee true), and under PiecewiseConstantDecay([7], [0.05,
    # 0.5]) the last step's 0.125 where the accounting composed s = 1.25 (2.41 printed where 2.98 holds).
    import warnings

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    rate = 0.05 if how.startswith("noise") else tf.keras.optimizers.schedules.PiecewiseConstantDecay(
        [7], [0.05, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lemma 4.1 warns
        paper = tfdpbnn.SIDPOptimizer(1.0, 20.0, paper_mean_update=True, num_examples=64, batch_size=8,
                                      delta=1e-5, learning_rate=rate)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(64)])
    model.compile(optimizer=paper, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    layer = model.layers[-1]
    if how.startswith("noise"):
        layer.set_noise_stddev(0.0)
    means = [layer.kernel.numpy().copy(), layer.bias.numpy().copy()]
    s = float(paper.weight_noise_stddev().numpy())
    assert s == pytest.approx((0.05 if how.startswith("noise") else 0.5) * 1.0 * 20.0 / 8, rel=1e-6)
    paper.release_weights(model)
    drawn = np.concatenate([(layer.kernel.numpy() - means[0]).ravel(),
                            (layer.bias.numpy() - means[1]).ravel()])
    # 320 draws of N(0, s^2): their standard deviation within 20% of s (about 5 standard errors).
    assert np.std(drawn) == pytest.approx(s, rel=0.2)
    assert paper.privacy_statement()["gdp_mu"] == pytest.approx(paper.paper_mode_gdp_mu(), rel=1e-9)


def _paper_run(epochs=8):
    """SIDP paper mode, full batch (64 records, z = 20, lr 0.05), ``epochs`` steps: model, optimizer, x, y."""
    import warnings

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lemma 4.1 warns
        paper = tfdpbnn.SIDPOptimizer(1.0, 20.0, paper_mean_update=True, num_examples=64, batch_size=64,
                                      delta=1e-5, learning_rate=0.05)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(3)])
    model.compile(optimizer=paper, loss=LOSS)
    model.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
    return model, paper, x, y


def _exported(model, tmp_path, name):
    return tfdpbnn.read_privacy(tfdpbnn.export_saved_model(model, str(tmp_path / name), num_samples=2,
                                                           delta=1e-5))


def test_paper_mode_mean_carries_no_guarantee_wherever_its_weights_go(tmp_path):
    # mu (trained without noise) saved, loaded with compile=False, or set into a fresh model, exported with
    # 3.22 and guarantee true; a new optimizer training on from it inherited that epsilon.
    model, paper, x, y = _paper_run()
    model.save(tmp_path / "mu.keras")
    loaded = tf.keras.models.load_model(tmp_path / "mu.keras", compile=False)
    copied = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(3)])
    copied.set_weights(model.get_weights())
    for name, holder in (("loaded", loaded), ("copied", copied)):
        statement = _exported(holder, tmp_path, name)
        assert statement["guarantee"] is False
        assert statement["epsilon"] is None or statement["epsilon"] == float("inf")
        assert "paper_mean_update=True" in statement["guarantee_reason"]
        assert "release_weights" in statement["guarantee_reason"]
    sgd = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8, delta=1e-5)
    copied.compile(optimizer=sgd, loss=LOSS)
    copied.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert sgd.privacy_statement()["guarantee"] is False
    # a new paper-mode optimizer starts its mean's sensitivity at 0: it does not go on from mu either
    with pytest.warns(UserWarning):
        fresh = tfdpbnn.SIDPOptimizer(1.0, 20.0, paper_mean_update=True, num_examples=64, batch_size=64,
                                      delta=1e-5, learning_rate=0.05)
    loaded.compile(optimizer=fresh, loss=LOSS)
    loaded.fit(x, y, batch_size=64, epochs=1, verbose=0)
    fresh.release_weights(loaded)
    assert fresh.privacy_statement(model=loaded)["guarantee"] is False


def test_paper_mode_released_sample_keeps_its_epsilon_after_save_and_load(tmp_path):
    from tfdpbnn.privacy.gdp import gdp_epsilon

    truth = gdp_epsilon(np.sqrt(sum((t / 20.0) ** 2 for t in range(1, 9))), 1e-5)   # 2.98
    model, paper, x, y = _paper_run(epochs=4)
    model.save(tmp_path / "half.keras")   # mu after 4 steps, with the optimizer's accounting state
    resumed = tf.keras.models.load_model(tmp_path / "half.keras")
    resumed.fit(x, y, batch_size=64, epochs=4, verbose=0)
    resumed.optimizer.release_weights(resumed)
    statement = resumed.optimizer.privacy_statement(model=resumed)
    assert statement["guarantee"] is True
    assert statement["epsilon"] == pytest.approx(truth, rel=1e-6)
    resumed.save(tmp_path / "theta.keras")
    loaded = tf.keras.models.load_model(tmp_path / "theta.keras", compile=False)
    exported = _exported(loaded, tmp_path, "theta")
    assert exported["guarantee"] is True
    assert truth * (1 - 1e-6) <= exported["epsilon"] < 3.3


@pytest.mark.parametrize("validation", ["validation_data", "validation_split"])
def test_paper_mode_refuses_validation_in_fit(validation):
    # The noisy layers infer with mu, which paper mode trains without noise: every epoch's val_loss, even on
    # public records, was mu's loss exactly (a release no epsilon covers) while the statement printed 2.98
    # with guarantee: true, and EarlyStopping on it made the released sample's length depend on mu.
    import warnings

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    public = (rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, 16))
    model = tf.keras.Sequential([tf.keras.Input((4,)), tfdpbnn.NoisyDense(5, activation="tanh"),
                                 tfdpbnn.NoisyDense(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lemma 4.1
        paper = tfdpbnn.SIDPOptimizer(1.0, 4.0, paper_mean_update=True, **COMMON)
    model.compile(optimizer=paper, loss=LOSS)
    given = {"validation_data": public} if validation == "validation_data" else {"validation_split": 0.25}
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=f"{validation}: SIDPOptimizer\\(paper_mean_update=True\\)"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0, **given)
    assert paper.steps == 0
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    # The sound mode's validation is validation's usual business (public records: post-processing).
    sound = tfdpbnn.SIDPOptimizer(1.0, 4.0, **COMMON)
    model.compile(optimizer=sound, loss=LOSS)
    history = model.fit(x, y, batch_size=10, epochs=1, verbose=0, validation_data=public)
    assert "val_loss" in history.history
