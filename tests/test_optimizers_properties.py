"""DP step properties for every optimizer on every layer type (the properties the tests must show).

For each (optimizer, layer type):
1. sigma = 0 and a clip above every per-example gradient norm: one DP step equals the non-private step of the
   same base optimizer on mean data loss + model.losses (KL, weight decay), to float32 tolerance.
2. sigma = 0, clip C small: zeroing one example's weight changes the clipped sum by exactly ||clip(g)|| = C
   (add/remove), replacing one example changes it by at most 2C (replace-one).
3. The added noise has std sigma*C/B on the gradient (DP-SGLD: the update's noise is N(0, eta)): chi-square
   test on the sample variance of >= 2000 coordinates, two-sided p > 1e-4 (seeded), and a z-test on the mean.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _dp_models import LAYER_KINDS, N_EXAMPLES, NOISY_KINDS, make_data, make_model
from _tiers import SLOW_ON_KERAS2
from scipy import stats

import tfdpbnn
from tfdpbnn import _keras_version
from tfdpbnn.record import attributes

B = 8
SEED = 1234
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
PRIOR_STDDEV = 2.0
SGLD_ETA = 1e-3
NOISE_SAMPLES = 600

OPTIMIZERS = ("dpsgd", "dpadam", "dpvd", "dpsgld", "sidp", "sidp_paper")
CASES = [(o, k) for o in OPTIMIZERS for k in LAYER_KINDS if not o.startswith("sidp") or k in NOISY_KINDS]
# The fast tier runs a covering subset: every layer kind under one of the four gradient optimizers (in turn,
# so each optimizer meets two or three kinds, noisy layers included) and each SIDP mode on one noisy kind.
# The per-example clipping depends only on the layer kind and the update rule only on the optimizer; the
# full suite runs every pair, and so does the Keras 3 set's fast tier (tests/_tiers.py).
_FAST = {(("dpsgd", "dpadam", "dpvd", "dpsgld")[i % 4], k) for i, k in enumerate(LAYER_KINDS)} | {
    ("sidp", "noisy_dense_ln"), ("sidp_paper", "noisy_conv2d_public_bn")}
assert {k for _, k in _FAST} == set(LAYER_KINDS) and {o for o, _ in _FAST} == set(OPTIMIZERS)
CASES = [pytest.param(o, k, marks=() if (o, k) in _FAST else SLOW_ON_KERAS2) for o, k in CASES]


def make_optimizer(name, clip, sigma, lr):
    common = dict(num_examples=N_EXAMPLES, batch_size=B, delta=1e-5)
    if name == "dpsgd":
        return tfdpbnn.DPSGDOptimizer(clip, sigma, learning_rate=lr, **common)
    if name == "dpadam":
        return tfdpbnn.DPAdamOptimizer(clip, sigma, learning_rate=lr, **common)
    if name == "dpvd":
        return tfdpbnn.DPVDOptimizer(clip, sigma, learning_rate=lr, **common)
    if name == "dpsgld":
        opt = tfdpbnn.DPSGLDOptimizer(clip, learning_rate=SGLD_ETA, prior_stddev=PRIOR_STDDEV, **common)
        opt._dp_noise_multiplier.assign(sigma)  # tests only: switch the Langevin noise off/on
        return opt
    if name.startswith("sidp"):
        with pytest.warns(UserWarning) if name == "sidp_paper" else _nullcontext():
            return tfdpbnn.SIDPOptimizer(clip, sigma, learning_rate=lr,
                                         paper_mean_update=name == "sidp_paper", **common)
    raise KeyError(name)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def base_optimizer(name, lr):
    """The non-private Keras optimizer a DP optimizer's update rule is built on (Keras 2: the legacy ones)."""
    optimizers = tf.keras.optimizers if _keras_version.KERAS_MAJOR == 3 else tf.keras.optimizers.legacy
    return optimizers.Adam(lr) if name == "dpadam" else optimizers.SGD(lr)


def compiled(kind, name, clip, sigma, lr):
    model = make_model(kind)
    if name == "sidp_paper":  # paper mode trains noisy layers alone: the normalizations' parameters frozen
        for layer in model.layers:
            if not isinstance(layer, tfdpbnn.NoisyDense | tfdpbnn.NoisyConv2D):
                layer.trainable = False
    opt = make_optimizer(name, clip, sigma, lr)
    model.compile(optimizer=opt, loss=LOSS)
    captured = []
    original = opt.apply_gradients

    def capture(grads_and_vars, **kwargs):
        grads_and_vars = list(grads_and_vars)
        captured.append([g.numpy() for g, _ in grads_and_vars])
        return original(grads_and_vars, **kwargs)

    opt.apply_gradients = capture
    return model, opt, captured


def open_phase(model, opt, x, y):
    """Declare the batches these tests feed by hand: passes over the N_EXAMPLES examples, asserted."""
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
    opt.begin_training(model, tfdpbnn.data.assert_sampling(batches, "shuffle", num_examples=N_EXAMPLES))


def dp_step(model, opt, x, y, sw=None, seed=SEED):
    if not attributes.ledger_state(opt).has_open_phase:
        open_phase(model, opt, x, y)
    tf.keras.utils.set_random_seed(seed)
    data = (x, y) if sw is None else (x, y, sw)
    return opt.dp_train_step(model, data)


def flat(arrays):
    return np.concatenate([np.ravel(a) for a in arrays])


def _clipped_sum(name, grads):
    """The clipped data-gradient sum S (up to a data-independent shift) from the applied gradient."""
    g = flat(grads)
    return g * B / N_EXAMPLES if name == "dpsgld" else g * B


def check_equals_non_private_step(name, kind, model, opt, x, y):
    """sigma = 0, clip 1e6: the DP step is the base optimizer's step on mean loss + model.losses."""
    lr = float(opt.learning_rate.numpy())
    w0 = [w.copy() for w in model.get_weights()]
    dp_step(model, opt, x, y)
    w_dp = model.get_weights()
    model.set_weights(w0)
    tf.keras.utils.set_random_seed(SEED)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = tf.reduce_mean(LOSS(y, y_pred))
        if model.losses:
            loss = loss + tf.add_n(model.losses)
    grads = tape.gradient(loss, variables)
    if kind not in ("dense", "conv2d") and "dropout" not in kind and "noisy" not in kind:
        assert model.losses  # the Bayesian layers' KL terms take part
    if name == "dpsgld":  # SGLD: eta * (n * grad(mean loss + losses) + w / prior^2), noise switched off
        grads = [N_EXAMPLES * g + v / PRIOR_STDDEV ** 2 for g, v in zip(grads, variables, strict=True)]
    base_optimizer(name, lr).apply_gradients(zip(grads, variables, strict=True))
    for a, b in zip(w_dp, model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    assert any(not np.allclose(a, b) for a, b in zip(w0, w_dp, strict=True))  # the step moved the weights
    # The DP step's own weights back, bit for bit: the next DP step refuses weights written outside it
    # (the reference step above agrees with it only to float32 rounding).
    model.set_weights(w_dp)


def check_sensitivity(name, kind, model, opt, captured, x, y):
    """sigma = 0, clip C: zeroing one example moves S by exactly C; replacing one, by at most 2C."""
    clip = 1e-3
    opt._dp_l2_norm_clip.assign(clip)
    x_other, _ = make_data(kind, batch=B, seed=7)
    ones = np.ones(B, np.float32)
    removed = ones.copy()
    removed[0] = 0.0
    x_rep, y_rep = x.copy(), y.copy()
    x_rep[0], y_rep[0] = x_other[0], (y[0] + 1) % 3
    dp_step(model, opt, x, y, ones)
    dp_step(model, opt, x, y, removed)
    dp_step(model, opt, x_rep, y_rep, ones)
    s_all, s_removed, s_replaced = (_clipped_sum(name, g) for g in captured[-3:])
    add_remove = np.linalg.norm(s_all - s_removed)
    replace = np.linalg.norm(s_all - s_replaced)
    assert clip * 0.99 <= add_remove <= clip * (1 + 1e-3)  # g_0 exceeded C and was clipped to norm C
    assert 0 < replace <= 2 * clip * (1 + 1e-3)


def check_noise_std(name, model, opt, captured, x, y):
    """Noise std sigma*C/B on the gradient (DP-SGLD: N(0, eta) on the update); paper-mode SIDP: none."""
    clip, sigma = 0.5, 2.0
    opt._dp_l2_norm_clip.assign(clip)
    zero_weight = np.zeros(B, np.float32)  # data term 0: the gradient is regularization + noise only
    dp_step(model, opt, x, y, zero_weight)
    g0 = flat(captured[-1])
    if name == "dpsgld":
        sigma = B / (N_EXAMPLES * np.sqrt(SGLD_ETA) * clip)  # Theorem 1's sigma for eta
    opt._dp_noise_multiplier.assign(sigma)
    if name == "sidp_paper":  # paper mode: the noise is on the weights only, the mean update is clean
        dp_step(model, opt, x, y, zero_weight, seed=SEED + 1)
        np.testing.assert_allclose(flat(captured[-1]), g0, atol=1e-6)
        return
    samples = []
    for i in range(int(np.ceil(NOISE_SAMPLES / g0.size))):
        dp_step(model, opt, x, y, zero_weight, seed=SEED + 1 + i)
        samples.append(flat(captured[-1]) - g0)
    noise = np.concatenate(samples)
    if name == "dpsgld":  # the update's noise: eta * n/B * N(0, (sigma C)^2) = N(0, eta)
        noise, expected = noise * SGLD_ETA, np.sqrt(SGLD_ETA)
    else:
        expected = sigma * clip / B
    k = noise.size
    stat = np.sum(noise ** 2) / expected ** 2  # chi-square with k degrees of freedom (the mean is 0)
    p_var = 2 * min(stats.chi2.cdf(stat, k), stats.chi2.sf(stat, k))
    assert p_var > 1e-4, (np.std(noise), expected)
    assert abs(noise.mean()) < 5 * expected / np.sqrt(k)


@pytest.mark.parametrize("name,kind", CASES)
def test_dp_step_properties(name, kind):
    model, opt, captured = compiled(kind, name, clip=1e6, sigma=0.0, lr=0.05)
    x, y = make_data(kind, batch=B)
    check_equals_non_private_step(name, kind, model, opt, x, y)
    opt.learning_rate = 0.0  # from here on the weights stay fixed; only the applied gradient is inspected
    check_sensitivity(name, kind, model, opt, captured, x, y)
    check_noise_std(name, model, opt, captured, x, y)


@pytest.mark.parametrize("kind", ["dense", "dense_variational"])
def test_sidp_needs_noisy_layers(kind):
    model = make_model(kind)
    opt = tfdpbnn.SIDPOptimizer(1.0, 1.0, num_examples=N_EXAMPLES, batch_size=B)
    model.compile(optimizer=opt, loss=LOSS)
    x, y = make_data(kind, batch=B)
    with pytest.raises(ValueError, match="NoisyDense"):
        dp_step(model, opt, x, y)
