"""``dpbnn-table``: Zhang et al. (2022, Tables 1-2) on DIGITS or MNIST.

Accuracy, time/epoch, ECE, MCE; DP and non-DP.

Zhang, Bu, Chen & Long (2022) compare, on MNIST with a two-layer MLP, DP-SGLD (Algorithm 2),
DP-BBP
(Algorithm 3), DP-MC Dropout (Algorithm 4) and DP-SGD, each with a Gaussian prior (weight decay) and
without one, beside their non-DP counterparts. By default on DIGITS (offline), a 64-128-10 ReLU MLP
(``SETTING``); with ``data_dir`` (or ``dataset="mnist"``) on MNIST from TFDS, never downloaded, with inputs
flattened to 784 and ``MNIST_SETTING``: the settings Zhang et al. (2022) states for MNIST (Fig. 1: expected
batch
256, 15 epochs, learning rate 0.25 for DP-SGD, C in [0.5, 5] -> 1, delta 1e-5) and, for the widths it does
not state, the two hidden ReLU layers of 1200 units of the BNN code it builds on (JavierAntoran/
Bayesian-Neural-Networks, ``Linear_2L``). Methods:

- ``sgld``: ``DPSGLDOptimizer`` (step size eta = (B / (n sigma C))^2, Zhang et al. (2022, Thm 1)), prediction
averaged
  over posterior samples kept by ``PosteriorSampler`` (second half of training, every 5th step; MNIST:
  every 50th);
- ``bbp``: ``DenseBayesByBackprop`` layers + ``DPSGDOptimizer``, MC prediction (``mc_predict``);
- ``mcdropout``: dense layers with ``MCDropout(0.2)`` + ``DPSGDOptimizer``, MC prediction;
- ``sgd``: dense layers + ``DPSGDOptimizer``, deterministic prediction.

Prior: "gaussian" is N(0, 1) per weight (weight decay 1/(2n) on the per-example loss; ``prior_stddev=1`` for
SGLD; ``prior_scale=1`` for BBP); "none" is no weight decay (SGLD: flat prior; BBP: prior scale 1e3, a
near-flat prior, since its KL needs one). DP: Poisson sampling, sigma calibrated by RDP to (epsilon, 1e-5);
non-DP: the same model and optimizer with sigma = 0 and no effective clipping (C = 1e6; for SGLD the
Langevin noise is kept, so it is plain SGLD). Zhang et al.'s (2022) own epsilon for these tables is in its
appendix,
which our copy lacks; we use epsilon 1 (``--epsilons`` to change).

Outputs: ``dpbnn_table.csv`` (one row per method, prior, DP flag and seed), ``dpbnn_summary.csv`` (means and
stds over seeds), ``reliability_<method>_<prior>_<dp|nondp>.png`` (seed 0), ``run.json``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

__all__ = ["METHODS", "PAPER_TABLE1", "PAPER_TABLE2", "run"]

METHODS = ("sgld", "bbp", "mcdropout", "sgd")
PRIORS = ("gaussian", "none")
DELTA = 1e-5
# Zhang et al. (2022, Table 1) (MNIST, MLP; Gaussian prior): DP time/epoch (s), DP accuracy, non-DP accuracy.
PAPER_TABLE1 = {"sgld": (10, 0.90, 0.95), "bbp": (480, 0.80, 0.97), "mcdropout": (9, 0.78, 0.98),
                "sgd": (10, 0.77, 0.97)}
# Zhang et al. (2022, Table 2) (MNIST, MLP): (DP-ECE, DP-MCE, non-DP ECE, non-DP MCE) per (method, prior).
PAPER_TABLE2 = {
    ("bbp", "gaussian"): (0.204, 0.641, 0.024, 0.052), ("bbp", "none"): (0.167, 0.141, 0.166, 0.166),
    ("sgld", "gaussian"): (0.007, 0.175, 0.035, 0.175), ("sgld", "none"): (0.126, 0.465, 0.008, 0.289),
    ("mcdropout", "gaussian"): (0.008, 0.080, 0.030, 0.041),
    ("mcdropout", "none"): (0.078, 0.225, 0.002, 0.725),
    ("sgd", "gaussian"): (0.013, 0.089, 0.016, 0.139), ("sgd", "none"): (0.106, 0.625, 0.005, 0.299),
}
DATASETS = ("digits", "mnist")
SETTING = dict(hidden=128, sample_rate=0.1, epochs=20, clip=1.0, learning_rate=0.5, mc_samples=20,
               dropout=0.2, nondp_clip=1e6)
SMOKE_SETTING = dict(SETTING, hidden=8, sample_rate=0.25, epochs=1, mc_samples=2)
# MNIST (n = 60000): Zhang et al. (2022, Fig. 1)'s batch 256, <= 15 epochs, eta_SGD 0.25; 3525 steps. SGLD
# keeps a
# posterior sample every 50th step of the second half (35 samples) instead of DIGITS's every 5th.
MNIST_SETTING = dict(hidden=(1200, 1200), sample_rate=256 / 60000, epochs=15, clip=1.0, learning_rate=0.25,
                     mc_samples=20, dropout=0.2, nondp_clip=1e6, sgld_thinning=50)
MNIST_SMOKE_SETTING = dict(MNIST_SETTING, hidden=(8, 8), sample_rate=0.25, epochs=1, mc_samples=2,
                           sgld_thinning=1)


def _model(method, prior, setting, n, seed, input_dim=64):
    """ReLU MLP ``input_dim``-hidden...-10 (``setting["hidden"]``: one width or a tuple of widths)."""
    import tensorflow as tf

    from tfdpbnn import layers

    tf.keras.utils.set_random_seed(seed)
    widths = (setting["hidden"],) if isinstance(setting["hidden"], int) else tuple(setting["hidden"])
    reg = (tf.keras.regularizers.l2(1.0 / (2.0 * n))
           if prior == "gaussian" and method in ("mcdropout", "sgd") else None)
    body = []
    if method == "bbp":
        scale = 1.0 if prior == "gaussian" else 1e3
        for h in widths:
            body.append(layers.DenseBayesByBackprop(h, num_examples=n, prior_scale=scale, activation="relu"))
        body.append(layers.DenseBayesByBackprop(10, num_examples=n, prior_scale=scale))
    else:
        for h in widths:
            body.append(tf.keras.layers.Dense(h, activation="relu", kernel_regularizer=reg))
            if method == "mcdropout":
                body.append(layers.MCDropout(setting["dropout"]))
        body.append(tf.keras.layers.Dense(10, kernel_regularizer=reg))
    return tf.keras.Sequential([tf.keras.Input((input_dim,))] + body)


class _EpochTimer:
    """Keras callback factory: wall time of each epoch."""

    def __new__(cls):
        import tensorflow as tf

        class Timer(tf.keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times = []

            def on_epoch_begin(self, epoch, logs=None):
                self._t = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.times.append(time.perf_counter() - self._t)

        return Timer()


def train_one(method, prior, dp, epsilon, setting, x_train, y_train, x_test, y_test, seed, out_png=None,
              dataset_label="DIGITS"):
    """Train one (method, prior, DP flag) on Poisson batches; return accuracy, ECE, MCE, timing, sigma.

    ``x_train`` and ``x_test`` are flat: ``[examples, features]``.
    """
    import tensorflow as tf

    from tfdpbnn import callbacks, data, optimizers, privacy, uncertainty
    from tfdpbnn.optimizers import sgld_learning_rate

    n = len(x_train)
    batch = max(1, int(round(setting["sample_rate"] * n)))
    q = batch / n
    spe = int(math.ceil(n / batch))
    steps = spe * setting["epochs"]
    sigma = float(privacy.calibrate_noise(epsilon, DELTA, q, steps, accountant="rdp", sampling="poisson"))
    clip = setting["clip"] if dp else setting["nondp_clip"]
    common = dict(num_examples=n, batch_size=batch, sampling="poisson", accountant="rdp", delta=DELTA)
    cbs = [_EpochTimer()]
    sampler = None
    if method == "sgld":
        # The same step size in both runs: with C = 1e6 clipping is inactive and the Langevin noise remains.
        eta = sgld_learning_rate(sigma, setting["clip"], n, batch)
        opt = optimizers.DPSGLDOptimizer(clip, learning_rate=eta,
                                         prior_stddev=1.0 if prior == "gaussian" else None, **common)
        thinning = setting.get("sgld_thinning", 5) if steps >= 40 else 1
        sampler = callbacks.PosteriorSampler(burn_in=steps // 2, thinning=thinning, max_samples=100)
        cbs.append(sampler)
    else:
        opt = optimizers.DPSGDOptimizer(clip, sigma if dp else 0.0, learning_rate=setting["learning_rate"],
                                        **common)
    model = _model(method, prior, setting, n, seed, input_dim=x_train.shape[1])
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = data.poisson_batches(x_train, y_train, sample_rate=q, steps_per_epoch=spe)  # secret seed
    model.fit(batches, epochs=setting["epochs"], steps_per_epoch=spe, verbose=0, callbacks=cbs)
    if method == "sgld" and sampler.samples:
        probs = uncertainty.mc_predict(model, x_test, weight_snapshots=sampler.samples,
                                       from_logits=True).mean
    elif method in ("bbp", "mcdropout"):
        probs = uncertainty.mc_predict(model, x_test, num_samples=setting["mc_samples"],
                                       from_logits=True).mean
    else:
        probs = tf.nn.softmax(tf.cast(model.predict(x_test, verbose=0), tf.float64)).numpy()
    probs = np.asarray(probs, np.float64)
    probs = probs / probs.sum(axis=1, keepdims=True)
    acc = float(np.mean(np.argmax(probs, axis=1) == y_test))
    ece = float(uncertainty.expected_calibration_error(probs, y_test))
    mce = float(uncertainty.maximum_calibration_error(probs, y_test))
    if out_png is not None:
        title = f"{'DP-' if dp else ''}{method} ({prior} prior), {dataset_label}"
        uncertainty.reliability_diagram(probs, y_test, out_png, title=title)
    times = cbs[0].times
    epoch_time = float(np.median(times[1:])) if len(times) > 1 else float(times[0])
    return dict(method=method, prior=prior, dp=dp, seed=seed, accuracy=acc, ece=ece, mce=mce,
                time_per_epoch_s=epoch_time, sigma=sigma if dp else 0.0, sample_rate=q, steps=steps,
                steps_run=int(opt.iterations.numpy()),
                epsilon_rdp=opt.epsilon(delta=DELTA, accountant="rdp") if dp else float("inf"),
                posterior_samples=len(sampler.samples) if sampler else "")


def _load(dataset, data_dir):
    """``((x_train, y_train), (x_test, y_test))`` with flat float32 inputs, int32/int64 labels."""
    from experiments.datasets import load_flat

    return load_flat(dataset, data_dir, "dpbnn-table")


def run(out_dir: str, seeds: int | None = None, smoke: bool = False, data_dir: str | None = None,
        log: Callable[[str], None] | None = print, epsilons=None, methods=None, dataset=None,
        **unknown) -> dict:
    """Run every method, prior and DP flag over the seeds; write CSVs, reliability diagrams, ``run.json``.

    ``dataset``: "digits" (bundled) or "mnist" (TFDS, read from ``data_dir``, never downloaded); default
    "mnist" when ``data_dir`` is given, else "digits".
    """
    from experiments.datasets import resolve_dataset
    from experiments.runner import Run, mean_std

    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an option of dpbnn-table")
    dataset = resolve_dataset("dpbnn-table", dataset, data_dir)
    methods = tuple(methods or METHODS)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: each must be one of {METHODS}, got {m!r}")
    epsilons = tuple(float(e) for e in (epsilons or (1.0,)))
    if len(epsilons) != 1 or not epsilons[0] > 0:
        raise ValueError(f"epsilons: dpbnn-table takes one epsilon > 0, got {epsilons!r}")
    epsilon = epsilons[0]
    if dataset == "digits":
        setting = SMOKE_SETTING if smoke else SETTING
    else:
        setting = MNIST_SMOKE_SETTING if smoke else MNIST_SETTING
    n_seeds = (1 if smoke else 5) if seeds is None else int(seeds)
    priors = ("gaussian",) if smoke else PRIORS
    (x_train, y_train), (x_test, y_test) = _load(dataset, data_dir)
    run_ = Run("dpbnn-table", out_dir, dict(setting=setting, methods=list(methods), priors=list(priors),
                                            epsilon=epsilon, delta=DELTA, sampling="poisson", smoke=smoke,
                                            dataset=dataset, data_dir=data_dir, n_train=len(x_train),
                                            n_test=len(x_test)),
               seeds=range(n_seeds), log=log)
    rows = []
    for method in run_.progress(methods, "method"):
        for prior in priors:
            for dp in (True, False):
                if smoke and not dp and method != "sgd":
                    continue
                for seed in range(n_seeds):
                    png = (run_.path(f"reliability_{method}_{prior}_{'dp' if dp else 'nondp'}.png")
                           if seed == 0 else None)
                    r = train_one(method, prior, dp, epsilon, setting, x_train, y_train, x_test, y_test,
                                  seed, out_png=png, dataset_label=dataset.upper())
                    rows.append(r)
                    run_.log(f"{'DP' if dp else 'non-DP'} {method} prior={prior} seed={seed}: acc "
                             f"{r['accuracy']:.4f} ECE {r['ece']:.3f} MCE {r['mce']:.3f} "
                             f"{r['time_per_epoch_s']:.2f} s/epoch")
                if dp:
                    run_.privacy(f"{method}/{prior}", r["sigma"], r["sample_rate"], r["steps_run"], DELTA,
                                 sampling="poisson", clip=setting["clip"])
    run_.write_csv("dpbnn_table.csv", rows)
    summary = []
    groups = {}
    for r in rows:
        groups.setdefault((r["method"], r["prior"], r["dp"]), []).append(r)
    for (method, prior, dp), rs in groups.items():
        row = dict(method=method, prior=prior, dp=dp, seeds=len(rs), sigma=rs[0]["sigma"],
                   epsilon_rdp=rs[0]["epsilon_rdp"])
        for key in ("accuracy", "ece", "mce", "time_per_epoch_s"):
            row[key + "_mean"], row[key + "_std"] = mean_std([r[key] for r in rs])
        paper2 = PAPER_TABLE2.get((method, prior))
        if paper2:
            row["paper_ece"], row["paper_mce"] = (paper2[0], paper2[1]) if dp else (paper2[2], paper2[3])
        if prior == "gaussian" and method in PAPER_TABLE1:
            t, dp_acc, np_acc = PAPER_TABLE1[method]
            row["paper_accuracy_mnist"] = dp_acc if dp else np_acc
            row["paper_dp_time_per_epoch_s_mnist"] = t if dp else ""
        summary.append(row)
    run_.write_csv("dpbnn_summary.csv", summary)
    return run_.finish()
