"""The run owns its noise: DP noise never depends on a user-settable seed (``tfdpbnn.privacy.noise``).

After ``tf.keras.utils.set_random_seed(0)`` two identical DP runs must release different noise (else two
runs on neighbouring data sets are told apart every time: epsilon infinite); ``debug_noise_seed`` replays it
and the statement then says that no guarantee holds. These tests draw the library's real ``os.urandom``
keys (marker ``os_entropy_noise``), so they are not seeded: each test's statistical assertions together
raise a false alarm with probability below 1e-6 (stated at each; correlations by Fisher's z), while the
defects they catch (replayed or repeated noise: correlation near 1, or a wrong scale) fail them outright.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf
from _tiers import slow_on_keras2

import tfdpbnn
from tests._small_runs import DELTA, LOSS, D, N, gaussians_epsilon, small_data, small_model
from tfdpbnn.export import strict_json_value

pytestmark = pytest.mark.os_entropy_noise   # the real os.urandom keys (tests/conftest.py)

SIGMA, LR, B = 100.0, 1.0, 8
NOISE_STD = LR * SIGMA * 1.0 / B   # per coordinate and step; the clipped gradient moves it by <= C / B = 1/8


def _flat(weights):
    return np.concatenate([np.ravel(w) for w in weights])


def _fit_update(**kwargs):
    """The weight update of one DP epoch (8 steps) after set_random_seed(0), from the same initial weights."""
    x, y = small_data()
    model = small_model()   # set_random_seed(0) inside: the same initial weights every call
    w0 = _flat(model.get_weights())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # debug_noise_seed warns, tested in test_mechanism
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=B, delta=DELTA, learning_rate=0.5,
                                     **kwargs)
    model.compile(optimizer=opt, loss=LOSS)
    tf.keras.utils.set_random_seed(0)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    return _flat(model.get_weights()) - w0, opt


@slow_on_keras2   # two fits; fresh noise per step: the custom-loop and traced-step tests below
@pytest.mark.parametrize("store", ["on", "off"])
def test_training_on_from_a_replayable_run_holds_no_guarantee(store, monkeypatch, tmp_path):
    # A run with debug_noise_seed, then a new DP optimizer (secret noise) on the same model, or on a fresh
    # model that loaded its weights (found by the record store): before, the new statement composed the
    # replayable phase as if its noise were secret (guarantee true, 7.08 printed; store off: quoted too),
    # where no epsilon holds.
    if store == "off":
        monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", "off")
    x, y = small_data()
    seeded_model = small_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # debug_noise_seed warns, tested in test_mechanism
        seeded = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=B, delta=DELTA,
                                        debug_noise_seed=3)
    seeded_model.compile(optimizer=seeded, loss=LOSS)
    seeded_model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    replayed = [p for p in seeded.ledger.phases if p.released]
    assert replayed and all(p.noise_replayable for p in replayed)
    assert all(p["noise_replayable"] for p in seeded.get_config()["privacy_ledger"]["phases"])
    path = str(tmp_path / "seeded.weights.h5")
    seeded_model.save_weights(path)
    for how in ("the same model", "load_weights") if store == "on" else ("the same model",):
        if how == "the same model":
            target = seeded_model
        else:
            target = small_model(seed=2)
            target.load_weights(path)
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=B, delta=DELTA)
        target.compile(optimizer=opt, loss=LOSS)
        target.fit(x, y, batch_size=B, epochs=1, verbose=0)
        statement = opt.privacy_statement()
        assert statement["guarantee"] is False, how
        assert statement["quote"]["epsilon"] == float("inf") and opt.epsilon() == float("inf"), how
        assert "debug_noise_seed" in statement["guarantee_reason"], how
        # The seeded pass and this one (the weights were saved before the same model's second run).
        assert statement["epsilon_if_noise_were_secret"] == pytest.approx(gaussians_epsilon(1.0, 2),
                                                                          rel=0.01), how


def test_two_seeded_fits_release_different_noise_unless_replayable():
    first, opt = _fit_update()
    second, _ = _fit_update()
    # Noise per coordinate: 8 steps of std 0.5 / 8; identical noise would make the updates equal. Given
    # everything before it, the last step's noise alone makes a coordinate's difference N(0, 2 (0.5 / 8)^2)
    # plus an independent shift, so all 15 stay within 0.02 with probability <= 0.18^15 = 6e-12 (the bound
    # 0.05 was 0.43^15 = 3e-6 by this argument).
    assert first.size == 15 and np.max(np.abs(first - second)) > 0.02
    statement = opt.privacy_statement()
    assert statement["guarantee"] is True and statement["noise"]["replayable"] is False
    assert "os.urandom" in statement["noise"]["source"]
    assert opt.get_config()["debug_noise_seed"] is None

    first, opt = _fit_update(debug_noise_seed=7)
    second, _ = _fit_update(debug_noise_seed=7)
    np.testing.assert_allclose(first, second, rtol=0, atol=1e-7)
    statement = opt.privacy_statement()
    assert statement["guarantee"] is False and statement["noise"]["replayable"] is True
    assert statement["guarantee_reason"].startswith("noise replayable: no guarantee")
    assert statement["epsilon"] == float("inf")
    # Nothing derived from these records holds a guarantee either: the ledger counts the run as non-private.
    assert statement["run_epsilon"] == float("inf") and statement["quote"]["epsilon"] == float("inf")
    bound = statement["ledger_bound"]
    assert bound.get("epsilon_is_infinite") or bound["epsilon"] == float("inf"), bound
    assert statement["epsilon_if_noise_were_secret"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)
    # Every epsilon it prints is infinite (History's too); a budget plans the steps as for secret noise.
    assert opt.epsilon() == float("inf")
    assert opt.ledger.with_secret_noise().epsilon(DELTA) == pytest.approx(
        statement["epsilon_if_noise_were_secret"], rel=1e-9)
    stored = strict_json_value(statement)   # what privacy.json holds
    assert stored["epsilon"] is None and stored["epsilon_is_infinite"] is True
    assert stored["guarantee"] is False
    config = opt.get_config()
    assert config["debug_noise_seed"] == 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert tfdpbnn.DPSGDOptimizer.from_config(config).mechanism.noise_replayable
    for bad in (-1, 2 ** 63, 1.5, True):
        with pytest.raises(ValueError, match="debug_noise_seed"):
            tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=B, debug_noise_seed=bad)
    with pytest.raises(ValueError, match="debug_noise_seed"):
        tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=B, debug_noise_seed=1, secure_mode=True)


def _loss_fn(y, y_pred, sample_weight=None):
    return tf.keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)


def _loop_releases(**kwargs):
    """Two releases of a custom tf.function loop on a DPMechanism built after set_random_seed(0)."""
    x, y = small_data()
    model = small_model()
    tf.keras.utils.set_random_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mechanism = tfdpbnn.DPMechanism(1.0, SIGMA, B, **kwargs)

    @tf.function
    def step(xb, yb):
        return mechanism.privatize_model(model, xb, yb, loss_fn=_loss_fn).gradients

    return [_flat([g.numpy() for g in step(x[:B], y[:B])]) for _ in range(2)]


def test_custom_loop_on_the_mechanism_releases_fresh_noise_unless_replayable():
    a, b = _loop_releases(), _loop_releases()
    size = a[0].size
    # 15 coordinates of std 12.5 against a shift <= 1/8: replayed noise gives r near 1; two independent
    # draws exceed |r| = 0.9 with probability about 3e-7 (Fisher z: atanh(0.9) sqrt(12) = 5.1), where the
    # earlier bound 0.5 failed about 6% of runs (the noise is fresh, so no seed fixes the draw).
    assert abs(np.corrcoef(a[0], b[0])[0, 1]) < 0.9
    assert np.max(np.abs(a[0] - b[0])) > 1.0
    assert np.max(np.abs(a[0] - a[1])) > 1.0   # two traced steps of one loop
    r, s = _loop_releases(debug_noise_seed=3), _loop_releases(debug_noise_seed=3)
    np.testing.assert_allclose(r[0], s[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(r[1], s[1], rtol=0, atol=1e-6)
    assert np.max(np.abs(r[0] - r[1])) > 1.0 and size == D * 3 + 3


class _Weights(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(_flat(self.model.get_weights()))


def _noise_fit(steps_per_execution):
    """Weights after every executed train function of one fit of 8 steps, sigma 100 (noise dominates)."""
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(250)])  # 1,250 weights
    w0 = _flat(model.get_weights())
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=B, learning_rate=LR)
    model.compile(optimizer=opt, loss=LOSS, steps_per_execution=steps_per_execution)
    seen = _Weights()
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[seen])
    return np.diff(np.stack([w0] + seen.weights), axis=0)


def test_consecutive_traced_steps_draw_uncorrelated_noise():
    # One step per execution: 8 updates of 1,250 coordinates; consecutive ones must be uncorrelated and
    # each of std LR sigma C / B = 12.5 (10,000 numbers: relative SE 0.7%, tolerance 10%). Two fresh draws
    # exceed |r| = 0.2 with probability 8e-13 (Fisher z: atanh(0.2) sqrt(1247) = 7.2), 6e-12 over the 7
    # pairs; replayed noise gives r near 1. (The earlier bound 5 / sqrt(1250) = 0.14 was 5e-7 per pair,
    # 3.5e-6 per run.)
    deltas = _noise_fit(1)
    assert deltas.shape == (8, 1250)
    for t in range(7):
        assert abs(np.corrcoef(deltas[t], deltas[t + 1])[0, 1]) < 0.2, t
    assert abs(deltas.std() / NOISE_STD - 1) < 0.1
    # Two steps in one traced train function: the update holds two independent draws (std 12.5 sqrt 2);
    # one draw replayed within the function would give std 25.
    pairs = _noise_fit(2)
    assert pairs.shape == (4, 1250)
    assert abs(pairs.std() / (NOISE_STD * np.sqrt(2)) - 1) < 0.1


def test_restoring_an_optimizer_checkpoint_does_not_replay_noise(tmp_path):
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(250)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=B, learning_rate=LR)
    model.compile(optimizer=opt, loss=LOSS)
    opt.begin_training(model, x, y, batch_size=B)   # one run: the key is drawn once, here
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
    w0 = _flat(model.get_weights())
    path = checkpoint.save(str(tmp_path / "ckpt"))
    step = tf.function(lambda: opt.dp_train_step(model, (x[:B], y[:B])))
    step()
    first = _flat(model.get_weights()) - w0
    checkpoint.restore(path)   # what BackupAndRestore does: the optimizer and the model rewound
    assert opt.steps == 0
    np.testing.assert_allclose(_flat(model.get_weights()), w0, rtol=0, atol=0)
    step()
    second = _flat(model.get_weights()) - w0
    # 1,250 coordinates of two fresh draws: |r| >= 0.2 with probability 8e-13 (5 / sqrt(1250) was 5e-7).
    assert first.size == 1250 and abs(np.corrcoef(first, second)[0, 1]) < 0.2
    names = [name for name, _ in tf.train.list_variables(path)]
    assert names and not any("noise_key" in n or "noise_counter" in n for n in names)


def _sidp_paper_release():
    """SI-DPSGD in the paper's mode, one epoch after set_random_seed(0), then the released sample."""
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tfdpbnn.layers.NoisyDense(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # paper mode's warning
        opt = tfdpbnn.SIDPOptimizer(1.0, 1.0, paper_mean_update=True, num_examples=N, batch_size=B,
                                    delta=DELTA, learning_rate=0.5)
    model.compile(optimizer=opt, loss=LOSS)
    tf.keras.utils.set_random_seed(0)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    opt.release_weights(model)
    return _flat(model.get_weights())


@pytest.mark.slow   # two SI-DPSGD fits: about 10 s
def test_sidp_paper_mode_weight_noise_is_not_seeded():
    # In the paper's mode the weight noise xi of theta = mu + s xi is the privacy noise (s = 0.5 / 8 here):
    # the released samples of two seeded runs must differ by it.
    assert np.max(np.abs(_sidp_paper_release() - _sidp_paper_release())) > 0.01
