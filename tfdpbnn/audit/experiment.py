"""The audits behind ``tfdpbnn audit`` and ``benchmarks/audit_table.py`` (DIGITS; see ``docs/audit.md``).

* ``audit_method``: one training run of a method's DIGITS model with m Dirac gradient canaries (one-run audit,
  Steinke et al. 2023), or of a deliberately BROKEN configuration (``BROKEN``).
* ``validate_dpsgd``: the multi-run audit of full-batch DP-SGD (an exact Gaussian composition, so the true
  epsilon is known) with one gradient canary.
* ``validate_gaussian``: the same estimators on the Gaussian mechanism itself, simulated in numpy.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings

import numpy as np
import tensorflow as tf

from tfdpbnn.audit.bounds import gdp_lower_bound, multi_run_epsilon
from tfdpbnn.audit.gradient_audit import GradientCanaryAudit

METHODS = ("dpsgd", "dpadam", "dpvd", "dpsgld", "sidp-ln", "sidp-bn", "dpbbp", "dpmcdropout")
#: Broken configurations: what each does and what it claims.
BROKEN = {
    "sigma0": "DP-SGD run with noise_multiplier 0; claim: the epsilon of the sigma calibrated for the budget",
    "sidp-paper": "SI-DPSGD paper_mean_update=True (mu updated without noise), the released sample audited; "
                  "claim: the SI-DPSGD paper's (Davody et al.), DP-SGD's epsilon for its z",
    "num-examples": "declared num_examples 10x the data and Poisson sampling, but the batches are shuffled "
                    "fixed-size passes over the real data (fit's input check bypassed with an untagged "
                    "tf.data pipeline); claim: Poisson accounting for the declared q",
    "unclipped": "a data-dependent model.losses term gives each canary an unclipped gradient of 10 C (DP "
                 "optimizers add model.losses after clipping); claim: the optimizer's epsilon",
}
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def claimed_epsilon(noise_multiplier, sample_rate, steps, delta) -> float:
    """Epsilon of the Poisson-subsampled Gaussian from dp-accounting's RDP accountant, as DECLARED.

    Computed directly with dp-accounting (independent of tfdpbnn's accounting code), for a configuration as
    declared.
    """
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), int(steps))
    return float(acc.get_epsilon(delta))


def _digits():
    from tfdpbnn.data import load_digits

    (x, y), (x_test, y_test) = load_digits()
    return (x - 0.5, y), (x_test - 0.5, y_test)


def build_method_model(method, num_examples, hidden, seed, x_public=None, num_features=64, num_classes=10):
    """The DIGITS model of ``method``, as ``tfdpbnn train`` builds it (``tfdpbnn/commands/train_recipes.py``).

    sidp-bn: NoisyDense with carried ``PublicBatchNormalization`` over ``x_public``. ``num_features`` and
    ``num_classes`` (DIGITS: 64 and 10) give the same architecture for other input and output sizes.
    """
    from tfdpbnn import layers
    from tfdpbnn.commands.train_recipes import build_model

    if method == "sidp-bn":
        tf.keras.utils.set_random_seed(seed)
        m = len(x_public)
        inp = tf.keras.Input((num_features,))
        h = layers.AppendPublicBatch(public_batch=np.asarray(x_public, np.float32))(inp)
        h = layers.NoisyDense(hidden)(h)
        h = tf.keras.layers.Activation("tanh")(layers.PublicBatchNormalization(num_public=m, carried=True)(h))
        out = layers.DropPublicBatch(m)(layers.NoisyDense(num_classes)(h))
        return tf.keras.Model(inp, out)
    base = {"dpadam": "dpsgd", "sidp-ln": "sidp"}.get(method, method)
    return build_model(base, (num_features,), num_classes, num_examples, hidden, seed)


@contextlib.contextmanager
def _without_poisson_test():
    """Switch off the Binomial test of realized batch sizes (only to audit a deliberately broken run)."""
    from tfdpbnn.callbacks import DPTrainingMonitor

    original = DPTrainingMonitor._poisson_check
    DPTrainingMonitor._poisson_check = lambda self, optimizer: None
    try:
        yield
    finally:
        DPTrainingMonitor._poisson_check = original


def _optimizer(method, budget, num_examples, batch_size, epochs, delta, noise_multiplier=None, **extra):
    from tfdpbnn import optimizers as O

    common = dict(num_examples=num_examples, batch_size=batch_size, delta=delta, sampling="poisson",
                  accountant="rdp", **extra)
    if noise_multiplier is None:
        common.update(target_epsilon=budget, epochs=epochs)
    if method == "dpsgld":
        return O.DPSGLDOptimizer(1.0, **common)
    if method == "dpadam":
        return O.DPAdamOptimizer(1.0, noise_multiplier, learning_rate=0.01, **common)
    cls = {"dpvd": O.DPVDOptimizer, "sidp-ln": O.SIDPOptimizer, "sidp-bn": O.SIDPOptimizer}.get(
        method, O.DPSGDOptimizer)
    return cls(1.0, noise_multiplier, learning_rate=1.0, **common)


def _blackbox(base_model, x_canary, y_canary, included, delta, confidence) -> dict:
    """Black-box baseline on mislabeled input canaries: loss-threshold scores, their AUC and one-run bound.

    Score = -loss of the trained model (the loss threshold attack of tensorflow-privacy's
    membership-inference tests, Yeom et al. 2018); returns its AUC and the one-run bound from the same scores.
    """
    from sklearn.metrics import roc_auc_score

    from tfdpbnn.audit.bounds import one_run_epsilon

    logits = base_model(x_canary, training=False)
    scores = -LOSS.call(y_canary, logits).numpy().astype(np.float64)
    result = one_run_epsilon(scores, included, delta=delta, confidence=confidence)
    return {"blackbox_lower_bound": result.epsilon, "blackbox_auc": float(roc_auc_score(included, scores)),
            "input_canaries": int(len(included))}


def audit_method(method="dpsgd", epsilon=1.0, delta=1e-5, num_canaries=1000, epochs=20, sample_rate=0.2,
                 hidden=64, seed=0, broken=None, confidence=0.95, input_canaries=200,
                 estimator="steinke") -> dict:
    """One-run audit of one method (or one ``BROKEN`` configuration) at a budget ``epsilon``.

    ``num_canaries`` Dirac gradient canaries (white-box) and ``input_canaries`` mislabeled DIGITS test
    images (black-box), each included with probability 1/2, in the same run. Returns a dict: the claimed
    epsilon and where it comes from, both lower bounds, the score used, steps, sigma and wall time.
    ``estimator``: the white-box bound's, "steinke" or "fdp" (``GradientCanaryAudit.result``; full-batch
    runs, ``sample_rate=1``, only; adds "gdp_mu_lb" and the run's exact "claimed_mu").
    """
    import tfdpbnn

    if broken is not None and broken not in BROKEN:
        raise ValueError(f"broken must be one of {sorted(BROKEN)} or None, got {broken!r}")
    if broken is None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if broken in ("sigma0", "num-examples", "unclipped"):
        method = "dpsgd"
    elif broken == "sidp-paper":
        method = "sidp-ln"
    if estimator not in ("steinke", "fdp"):
        raise ValueError(f"estimator must be 'steinke' or 'fdp', got {estimator!r}")
    if estimator == "fdp" and (method not in ("dpsgd", "dpadam") or sample_rate != 1):
        raise ValueError(f"estimator 'fdp' audits full-batch DP-SGD / DP-Adam (sample_rate=1; each step one "
                         f"Gaussian mechanism, mu = sqrt(steps) / sigma), got method={method!r}, "
                         f"sample_rate={sample_rate!r}")
    start = time.perf_counter()
    (x, y), (x_test, y_test) = _digits()
    if not 0 <= input_canaries <= len(x_test) - 64:
        raise ValueError(f"input_canaries must be in [0, {len(x_test) - 64}], got {input_canaries!r}")
    from tfdpbnn.audit.canaries import mislabeled_canaries, sample_inclusion

    if input_canaries:
        x_in, y_in = mislabeled_canaries(x_test[64:], y_test[64:], 10, input_canaries, seed)
        in_included = sample_inclusion(input_canaries, seed + 1)
        x, y = np.concatenate([x, x_in[in_included]]), np.concatenate([y, y_in[in_included]])
    audit = GradientCanaryAudit(num_canaries=num_canaries, seed=seed)
    n = len(x) + num_canaries
    batch_size = max(1, int(round(sample_rate * n)))
    notes = ""
    declared_n = 10 * n if broken == "num-examples" else n
    # The paper mode's real epsilon passes the budget its z was calibrated for: the broken run goes on.
    extra = {"paper_mean_update": True, "allow_exceeding_budget": True} if broken == "sidp-paper" else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = _optimizer(method, epsilon, declared_n, batch_size, epochs, delta, **extra)
        declared_sigma = opt.noise_multiplier
        if broken == "sigma0":
            opt = _optimizer(method, epsilon, n, batch_size, epochs, delta, noise_multiplier=0.0)
        base = build_method_model(method, len(x), hidden, seed, x_public=x_test[:64])
        if broken == "sidp-paper":  # paper mode trains noisy layers alone: the normalization's scale and
            for layer in base.layers:  # offset stay at 1 and 0 (a layer norm without its own parameters)
                if isinstance(layer, tf.keras.layers.LayerNormalization):
                    layer.trainable = False
        unclipped = 1.0 / batch_size if broken == "unclipped" else None
        model = audit.wrap(base, l2_norm_clip=1.0, noisy=method.startswith("sidp"),
                           unclipped_scale=unclipped)
        inputs, targets, weights = audit.data(x, y)
        model.compile(optimizer=opt, loss=audit.losses(LOSS))
        if broken == "num-examples":
            # Shuffled fixed-size passes over the real n examples, falsely asserted as Poisson at B / (10 n),
            # with the Binomial test of the realized batch sizes switched off: a deliberate bypass of the
            # checks that refuse this configuration, so the audit sees the broken training run.
            steps = epochs * math.ceil(declared_n / batch_size)
            data = tf.data.Dataset.from_tensor_slices((inputs, targets, weights)).shuffle(
                n, seed=seed, reshuffle_each_iteration=True).batch(batch_size, drop_remainder=True).repeat()
            data = tfdpbnn.data.assert_sampling(data, "poisson", num_examples=declared_n,
                                                sample_rate=opt.sample_rate)
            with _without_poisson_test():
                model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[audit.recorder], verbose=0)
            notes = f"each example in {steps * batch_size / n:.1f} batches, not Poisson at q/10"
        else:
            data = tfdpbnn.data.poisson_batches(inputs, targets, sample_rate=opt.sample_rate,
                                                sample_weight=weights)
            model.fit(data, epochs=epochs, callbacks=[audit.recorder], verbose=0)
        if method.startswith("sidp"):
            opt.release_weights(model)  # what SI-DPSGD releases: one sample theta = mu + s xi
        score = "displacement" if broken == "sidp-paper" else "auto"
        result, score = audit.result(model, opt, delta=delta, confidence=confidence, score=score,
                                     estimator=estimator)
        # The declared sigma's claim (a broken run keeps its declared accounting); add/remove neighbours.
        fdp = {"gdp_mu_lb": result.mu, "claimed_mu": math.sqrt(opt.steps) / declared_sigma} \
            if estimator == "fdp" else {}
        blackbox = _blackbox(base, x_in, y_in, in_included, delta, confidence) if input_canaries else {}
    steps = opt.steps
    reported = None if broken == "sigma0" else opt.epsilon()
    if broken is None or broken == "unclipped":
        claimed, source = reported, "optimizer.epsilon() (rdp)"
    else:
        claimed = claimed_epsilon(declared_sigma, batch_size / declared_n, steps, delta)
        source = "dp-accounting RDP for the declared sigma, q, steps"
    return {
        "method": method, "broken": broken, "budget": epsilon, "claimed_epsilon": claimed,
        "claim_source": source, "library_epsilon": reported, "lower_bound": result.epsilon,
        "caught": bool(result.epsilon > claimed), "score": score, "num_canaries": num_canaries,
        "guesses": result.num_guesses, "correct": result.num_correct, "steps": steps,
        "noise_multiplier": opt.noise_multiplier, "declared_noise_multiplier": declared_sigma,
        "sample_rate": batch_size / n, "confidence": confidence, "delta": delta, "notes": notes,
        "warnings": sorted({str(w.message)[:100] for w in caught if issubclass(w.category, UserWarning)}),
        "estimator": estimator, **fdp, **blackbox, "seconds": time.perf_counter() - start,
    }


def gaussian_mu(epsilon, delta) -> float:
    """Mu of the mu-GDP Gaussian mechanism whose epsilon at ``delta`` is ``epsilon``."""
    from scipy import optimize

    from tfdpbnn.privacy.gdp import gdp_epsilon

    return float(optimize.brentq(lambda m: gdp_epsilon(m, delta) - epsilon, 1e-6, 100.0, xtol=1e-12))


def _bounds(ins, outs, delta, threshold, confidence, seed):
    ed = multi_run_epsilon(ins, outs, delta=delta, confidence=confidence, threshold="split", seed=seed)
    gdp = gdp_lower_bound(ins, outs, delta=delta, confidence=confidence, threshold=threshold)
    return {"epsilon_lb": ed.epsilon, "gdp_mu_lb": gdp.mu, "gdp_epsilon_lb": gdp.epsilon}


def validate_gaussian(epsilon, delta=1e-5, num_runs=2000, seed=0, confidence=0.95) -> dict:
    """The estimators on the Gaussian mechanism N(mu, 1) against N(0, 1), whose epsilon is known.

    ``num_runs`` draws in all, half each; mu is set so its epsilon at ``delta`` is ``epsilon``; the GDP
    threshold mu / 2 is fixed in advance.
    """
    mu = gaussian_mu(epsilon, delta)
    rng = np.random.default_rng(seed)
    ins, outs = rng.normal(mu, 1.0, num_runs // 2), rng.normal(0.0, 1.0, num_runs // 2)
    return {"epsilon": epsilon, "mu": mu, "runs": num_runs,
            **_bounds(ins, outs, delta, mu / 2, confidence, seed)}


def validate_dpsgd(epsilon, delta=1e-5, num_runs=2000, steps=4, num_examples=255, hidden=64, seed=0,
                   confidence=0.95) -> dict:
    """Multi-run audit of full-batch DP-SGD on ``num_examples`` DIGITS images with one gradient canary.

    Every step is the Gaussian mechanism on the full clipped sum, so ``steps`` steps are exactly
    mu-GDP with mu = sqrt(steps) / sigma (Dong, Roth & Su 2019, Corollary 3.3); sigma is set so the
    optimizer's PLD epsilon (shuffle accounting: a Gaussian composition) is ``epsilon``. The GDP test's
    threshold is fixed in advance at half the designed shift, steps * lr * C / B / 2.
    """
    import tfdpbnn
    from tfdpbnn.audit.canaries import canary_losses, with_gradient_canaries
    from tfdpbnn.audit.multi_run import multi_run_scores

    start = time.perf_counter()
    (x, y), _ = _digits()
    x, y = x[:num_examples], y[:num_examples]
    n = num_examples + 1
    lr = 1.0
    sigma = tfdpbnn.privacy.calibrate_noise(epsilon, delta, 1.0, steps, accountant="pld", sampling="shuffle")
    # No delta in the optimizer: fit's monitor would compute the ledger's epsilon at every epoch end (one
    # epoch per run), a cost growing with the steps so far; the claim is computed once below instead.
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=n, batch_size=n, sampling="shuffle",
                                 accountant="pld", learning_rate=lr)
    model = with_gradient_canaries(build_method_model("dpsgd", n, hidden, seed), 1, 1.0)
    model.compile(optimizer=opt, loss=canary_losses(LOSS))
    ins, outs = multi_run_scores(model, opt, x, y, num_runs, steps)
    seconds = time.perf_counter() - start
    # One run's epsilon (the runs reuse the data: one run is audited).
    reported = opt.epsilon_after(steps, delta=delta)
    unit = lr * 1.0 / n
    return {"epsilon": epsilon, "reported_epsilon": reported, "noise_multiplier": opt.noise_multiplier,
            "mu": math.sqrt(steps) / opt.noise_multiplier, "runs": num_runs, "steps": steps,
            "seconds": seconds, **_bounds(ins / unit, outs / unit, delta, steps / 2, confidence, seed)}
