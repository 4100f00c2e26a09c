"""``heteroscedastic``: Zhang et al. (2022, sec. 5.2; Table 3, Fig. 4), heteroscedastic regression.

DP and non-DP.

Zhang et al. (2022) fits SGLD, BBP and MC dropout networks with a Gaussian prior to 1-D data drawn from a
Gaussian
process with input-dependent noise, trains "with DP-GD for 200 epochs" at epsilon 4.21, delta 1/250, and
reports the median test MSE over 20 simulations (DP / non-DP: SGLD 0.510 / 0.523, BBP 1.276 / 0.562, MC
dropout 0.682 / 0.591). Its appendix with the exact data recipe is missing from our copy, so the data here
follow the main text's description: x ~ U(-3, 3), f ~ GP(0, RBF(length 1, variance 1)), y = f(x) + s(x) e
with s(x) = 0.1 + 0.3 |x| (noise grows away from 0); n = 250 training points (delta = 1/n as in the
paper), 200 test points on a grid; every simulation draws new data.

Models: 1-50-ReLU networks with a heteroscedastic Gaussian head (mean, log-variance; loss
``HeteroscedasticGaussianNLL``): ``sgld`` = dense + ``DPSGLDOptimizer`` (prior N(0, 1), posterior samples
from the second half of training); ``bbp`` = ``DenseBayesByBackprop`` layers (prior N(0, 1)) + DP-SGD;
``mcdropout`` = dense + ``MCDropout(0.1)`` (weight decay 1/(2n), i.e. prior N(0, 1)) + DP-SGD. DP-GD:
sample rate 1 (every example in every step, so no sampling assumption is involved), 200 steps, sigma from
RDP for (4.21, 1/250); DP-SGLD's step size is capped at 0.05 / n (so its epsilon is at most 4.21,
recorded per run). Non-DP: sigma 0 and C = 1e6 (SGLD keeps its Langevin noise).

Outputs: ``heteroscedastic.csv`` (one row per method, DP flag and simulation: test MSE against the noisy
targets and against f), ``heteroscedastic_summary.csv`` (medians over simulations beside Zhang et al.'s (2022)
Table 3), ``heteroscedastic.png`` (simulation 0: mean, epistemic and aleatoric bands), ``run.json``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["PAPER_TABLE3", "make_data", "run"]

METHODS = ("sgld", "bbp", "mcdropout")
PAPER_TABLE3 = {"sgld": (0.510, 0.523), "bbp": (1.276, 0.562), "mcdropout": (0.682, 0.591)}
EPSILON, N_TRAIN, N_TEST = 4.21, 250, 200
SETTING = dict(hidden=50, steps=200, clip=1.0, sgld_clip=5.0, sgld_max_lr=0.05, learning_rate=0.05,
               momentum=0.9,
               mc_samples=50, simulations=20)
SMOKE_SETTING = dict(SETTING, steps=4, mc_samples=3, simulations=1)


def make_data(seed: int, n_train: int = N_TRAIN, n_test: int = N_TEST):
    """(x_train, y_train, x_test, y_test, f_test) from the GP-with-heteroscedastic-noise recipe above."""
    rng = np.random.default_rng(seed)
    x_train = rng.uniform(-3.0, 3.0, n_train)
    x_test = np.linspace(-3.0, 3.0, n_test)
    x = np.concatenate([x_train, x_test])
    k = np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2) + 1e-6 * np.eye(len(x))
    f = np.linalg.cholesky(k) @ rng.standard_normal(len(x))
    s = 0.1 + 0.3 * np.abs(x)
    y = f + s * rng.standard_normal(len(x))
    col = lambda a: a.astype(np.float32)[:, None]
    return col(x_train), col(y[:n_train]), col(x_test), col(y[n_train:]), f[n_train:]


def _model(method, n, hidden, seed):
    import tensorflow as tf

    from tfdpbnn import layers, uncertainty

    tf.keras.utils.set_random_seed(seed)
    if method == "bbp":
        body = [layers.DenseBayesByBackprop(hidden, num_examples=n, prior_scale=1.0, activation="relu"),
                layers.DenseBayesByBackprop(2, num_examples=n, prior_scale=1.0)]
    else:
        reg = tf.keras.regularizers.l2(1.0 / (2.0 * n)) if method == "mcdropout" else None
        body = [tf.keras.layers.Dense(hidden, activation="relu", kernel_regularizer=reg)]
        if method == "mcdropout":
            body.append(layers.MCDropout(0.1))
        body.append(uncertainty.HeteroscedasticHead(1))
    return tf.keras.Sequential([tf.keras.Input((1,))] + body)


def _train(method, dp, setting, x, y, xt, seed):

    from tfdpbnn import callbacks, data, optimizers, privacy, uncertainty
    from tfdpbnn.optimizers import sgld_learning_rate

    n, steps = len(x), setting["steps"]
    delta = 1.0 / n
    sigma = float(privacy.calibrate_noise(EPSILON, delta, 1.0, steps, accountant="rdp", sampling="poisson"))
    common = dict(num_examples=n, batch_size=n, sampling="poisson", accountant="rdp", delta=delta)
    cbs, sampler = [], None
    if method == "sgld":
        clip = setting["sgld_clip"]
        # Full-batch DP-SGLD's budget-implied step (B / (n sigma C))^2 is too large to be stable here; a
        # smaller step means more noise relative to it (a larger equivalent sigma), so epsilon only drops.
        eta = min(sgld_learning_rate(sigma, clip, n, n), setting["sgld_max_lr"] / n)
        opt = optimizers.DPSGLDOptimizer(clip if dp else 1e6, learning_rate=eta, prior_stddev=1.0, **common)
        sampler = callbacks.PosteriorSampler(burn_in=steps // 2, thinning=max(1, steps // 100))
        cbs.append(sampler)
    else:
        opt = optimizers.DPSGDOptimizer(setting["clip"] if dp else 1e6, sigma if dp else 0.0,
                                        learning_rate=setting["learning_rate"], momentum=setting["momentum"],
                                        **common)
    model = _model(method, n, setting["hidden"], seed)
    model.compile(optimizer=opt, loss=uncertainty.HeteroscedasticGaussianNLL())
    batches = data.poisson_batches(x, y, sample_rate=1.0, steps_per_epoch=1)  # q = 1: every example
    model.fit(batches, epochs=steps, steps_per_epoch=1, verbose=0, callbacks=cbs)
    if sampler is not None and sampler.samples:
        pred = uncertainty.mc_predict(model, xt, weight_snapshots=sampler.samples, task="regression")
    else:
        pred = uncertainty.mc_predict(model, xt, num_samples=setting["mc_samples"], task="regression")
    eps = opt.epsilon(delta=delta, accountant="rdp") if dp else float("inf")
    return pred, sigma, eps, int(opt.iterations.numpy())


def _plot(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(METHODS), figsize=(4.2 * len(METHODS), 6.5), sharex=True, sharey=True,
                             squeeze=False)
    for (method, dp), (x, y, xt, pred) in curves.items():
        ax = axes[0 if not dp else 1][METHODS.index(method)]
        m = np.ravel(pred.mean)
        epi = np.sqrt(np.ravel(pred.epistemic_variance))
        tot = np.sqrt(np.ravel(pred.epistemic_variance) + np.ravel(pred.aleatoric_variance))
        xs = np.ravel(xt)
        ax.scatter(np.ravel(x), np.ravel(y), s=4, color="0.6")
        ax.fill_between(xs, m - 2 * tot, m + 2 * tot, color="tab:blue", alpha=0.25,
                        label="data (aleatoric) + posterior")
        ax.fill_between(xs, m - 2 * epi, m + 2 * epi, color="tab:orange", alpha=0.5,
                        label="posterior (epistemic)")
        ax.plot(xs, m, color="k", lw=1.2, label="mean")
        ax.set_title(f"{'DP-' if dp else ''}{method}")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Zhang et al. 2022, Fig. 4, our GP data: +-2 std bands (DP: epsilon {EPSILON}, "
                 f"delta 1/{N_TRAIN})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out_dir: str, seeds: int | None = None, smoke: bool = False, data_dir: str | None = None,
        log: Callable[[str], None] | None = print, methods=None, **unknown) -> dict:
    """Run every method, DP and non-DP, over the simulations; write CSVs, the figure and ``run.json``."""
    from experiments.runner import Run

    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an option of heteroscedastic")
    if data_dir is not None:
        raise ValueError("data_dir: heteroscedastic generates its own data")
    methods = tuple(methods or METHODS)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: each must be one of {METHODS}, got {m!r}")
    setting = SMOKE_SETTING if smoke else SETTING
    sims = setting["simulations"] if seeds is None else int(seeds)
    run_ = Run("heteroscedastic", out_dir, dict(setting=setting, methods=list(methods), epsilon=EPSILON,
                                                delta=1.0 / N_TRAIN, sample_rate=1.0, smoke=smoke),
               seeds=range(sims), log=log)
    rows, curves = [], {}
    for method in run_.progress(methods, "method"):
        for dp in (True, False):
            for sim in range(sims):
                x, y, xt, yt, ft = make_data(sim)
                pred, sigma, eps, steps_run = _train(method, dp, setting, x, y, xt, seed=sim)
                mean = np.ravel(pred.mean)
                rows.append(dict(method=method, dp=dp, simulation=sim, sigma=sigma if dp else 0.0,
                                 epsilon_rdp=eps, steps_run=steps_run,
                                 mse=float(np.mean((mean - np.ravel(yt)) ** 2)),
                                 mse_f=float(np.mean((mean - ft) ** 2)),
                                 aleatoric_std=float(np.mean(np.sqrt(np.ravel(pred.aleatoric_variance)))),
                                 epistemic_std=float(np.mean(np.sqrt(np.ravel(pred.epistemic_variance))))))
                if sim == 0:
                    curves[(method, dp)] = (x, y, xt, pred)
                run_.log(f"{'DP' if dp else 'non-DP'} {method} sim {sim}: test MSE {rows[-1]['mse']:.3f}")
            if dp:
                run_.privacy(method, sigma, 1.0, steps_run, 1.0 / N_TRAIN, sampling="poisson",
                             clip=setting["sgld_clip"] if method == "sgld" else setting["clip"])
    run_.write_csv("heteroscedastic.csv", rows)
    summary = []
    for method in methods:
        for dp in (True, False):
            rs = [r for r in rows if r["method"] == method and r["dp"] == dp]
            summary.append(dict(method=method, dp=dp, simulations=len(rs),
                                median_mse=float(np.median([r["mse"] for r in rs])),
                                median_mse_f=float(np.median([r["mse_f"] for r in rs])),
                                paper_median_mse=PAPER_TABLE3[method][0 if dp else 1]))
    run_.write_csv("heteroscedastic_summary.csv", summary)
    _plot(curves, run_.path("heteroscedastic.png"))
    return run_.finish()
