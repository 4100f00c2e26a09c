"""``sidp-tables``: Davody et al. (2020, SI-DPSGD) Tables 1 and 4 with sound privacy accounting.

Davody et al. (2020) claims that networks with normalization layers after every trainable layer tolerate large
Gaussian noise on their weights (Table 1: MNIST, LeNet-300-100 / LeNet-5 with and without BN/LN, noise
sigma in {0, 0.01, 0.1, 1, 2}, trained and tested with noisy weights, no DP), and that SI-DPSGD (noisy
weights theta_t = mu_t + s_t xi, s_t = eta_t C z / B, mu updated with the CLEAN clipped gradient) beats
DP-SGD at every epsilon (Table 4: MNIST, LeNet-5). Here, on DIGITS (8x8x1, offline), with a small
LeNet-style CNN (conv 3x3 (8) -> pool -> conv 3x3 (16) -> pool -> dense 32 -> 10; on MNIST/CIFAR-10 the
paper's LeNet-5: conv 5x5 (6) -> pool -> conv 5x5 (16) -> pool -> 120 -> 84 -> 10), normalization after
every trainable layer, the logits included (as the paper augments its networks):

- ``none``: no normalization;
- ``ln``: Keras ``LayerNormalization`` over all hidden units of the layer (Davody et al. 2020, eq. 3);
- ``bn``: ``PublicBatchNormalization`` in carried mode (``AppendPublicBatch`` / ``DropPublicBatch``):
  statistics from a public batch only (Davody et al. 2020, Algorithm 2 corrected, docs/soundness.md, finding
  1). DIGITS
  has no
  public data set (the paper uses 30 KMNIST / CIFAR-100 images), so ``NUM_PUBLIC`` = 30 training images
  (3 per class, fixed seed) are held out as "public": they are removed from the private training set of
  EVERY configuration (so every row trains on the same n private examples, and the accounting covers
  exactly those) and serve only as the BN statistics batch. The same on MNIST/CIFAR-10.

Table 1 analogue (``table1``): weight noise std s in ``noise_levels`` held fixed during training, in two
settings: non-private (the paper's Table 1 setting: noisy weights, no clipping, no gradient noise, Adam
with learning rate ``nonprivate_adam_lr`` as the paper trains with Adam), and DP with the sound
``SIDPOptimizer`` at ``table1_epsilons`` (default 1), whose s_t is replaced by the constant s (in the sound
mode the sampled weights are post-processing of the DP-SGD sequence mu_t, so any s keeps the guarantee).
BN under DP is the separate table ``table1-bn-dp``: its per-example clipping through the carried public
batch has no fast rule and takes the jacobian path, O(B^2) per step (minutes per run on 2 CPU cores).
Reported: accuracy of sampled networks (mean over ``eval_samples`` independent weight samples, what the
paper's "training and testing with noisy weights" measures) and of the mean weights mu.

Table 4 analogue (``table4``): accuracy against epsilon for the ``methods``:

- ``sidp-ln``: sound ``SIDPOptimizer`` (mu is DP-SGD's, s_t = eta C z / B), LN model;
- ``sidp``, ``sidp-bn``: the same without normalization / with public-statistics BN (optional rows);
- ``dpsgd``, ``dpsgd-ln``: ``DPSGDOptimizer`` on the same CNN with plain Keras layers, without / with LN;
- ``sidp-paper-ln``: ``SIDPOptimizer(paper_mean_update=True)`` (the paper's algorithm), LN model, with the
  noise multiplier z the paper's accounting calibrates for the target epsilon (the subsampled Gaussian by
  RDP: the epsilon the paper would claim). mu then accumulates un-noised gradients (docs/soundness.md, finding
  1), and
  the epsilon recorded is the optimizer's own statement (exact GDP composition of the released weight
  samples theta_t with sensitivity Delta_t = t eta C / B, plus the exported sample), beside the claimed one;
- ``sidp-paper-real-ln`` (optional): the paper's algorithm with z calibrated so that the epsilon that HOLDS
  (the GDP composition above) is the target (``paper_mode_noise_multiplier``).

For SI-DPSGD rows ``accuracy`` is that of one released sample theta_T (``release_weights``: what Davody et
al.'s (2020)
Algorithm 1 returns and what the recorded epsilon covers); ``accuracy_mu`` is that of the mean weights (in
the sound mode mu is itself DP; in paper mode mu is NOT covered by any epsilon, reported only to show what
the authors' code, which evaluates with noise 0, measures). DP-SGD rows: the final weights.

All training: Poisson sampling (``poisson_batches``), expected batch q n, constant learning rate (SGD),
sigma calibrated by RDP for exactly the steps run, delta 1e-5; every configuration's privacy is recorded in
``run.json`` (``Run.privacy``; paper mode: ``Run.privacy_statement``). Outputs: ``table1.csv`` /
``table4.csv`` (one row per configuration and seed), ``table1_summary.csv`` / ``table4_summary.csv``
(mean and std over seeds, the paper's MNIST numbers where the column matches), ``sidp_tables.png``
(accuracy against weight noise; accuracy against epsilon), ``run.json``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

__all__ = ["DATASETS", "EPSILONS", "METHODS", "NOISE_LEVELS", "NORMS", "PAPER_TABLE1", "PAPER_TABLE4",
           "build_model", "paper_mode_noise_multiplier", "public_split", "run", "train_one"]

DATASETS = ("digits", "mnist", "cifar10")
NORMS = ("none", "ln", "bn")
NOISE_LEVELS = (0.0, 0.01, 0.1, 1.0, 2.0)  # Davody et al. (2020, Table 1)'s columns
EPSILONS = (0.5, 1.0, 2.0, 5.0, 10.0)
METHODS = ("sidp-ln", "dpsgd", "dpsgd-ln", "sidp-paper-ln", "sidp", "sidp-bn", "sidp-paper-real-ln")
DEFAULT_METHODS = ("sidp-ln", "dpsgd", "dpsgd-ln", "sidp-paper-ln")
TABLES = ("table1", "table1-bn-dp", "table4")
DELTA = 1e-5
KINDS = ("sidp", "sidp-paper", "sidp-paper-real", "dpsgd", "nonprivate")
NUM_PUBLIC = 30  # Davody et al. (2020): 30 public images (KMNIST for MNIST, CIFAR-100 for CIFAR-10)

# Davody et al. (2020, Table 1) (MNIST test accuracy, %, mean over ten runs; "nc" = no convergence), LeNet-5
# rows.
PAPER_TABLE1 = {
    "none": {0.0: 99.20, 0.01: 98.94, 0.1: 98.40, 1.0: "nc", 2.0: "nc"},
    "bn": {0.0: 99.20, 0.01: 99.21, 0.1: 99.18, 1.0: 99.24, 2.0: 99.25},
    "ln": {0.0: 99.16, 0.01: 99.14, 0.1: 99.13, 1.0: 99.21, 2.0: 99.19},
}
# Davody et al. (2020, Table 4) (MNIST, LeNet-5, delta 1e-5, %), the columns it shares with EPSILONS (1 and
# 0.5; it also
# prints inf, 7, 3, 0.1, 0.05, 0.025). Its SI-DPSGD rows are the paper's mode under the paper's accounting.
PAPER_TABLE4 = {
    "dpsgd": {1.0: 94.11, 0.5: 91.10}, "dpsgd-ln": {1.0: 96.68, 0.5: 94.81},
    "sidp-paper": {1.0: 98.72, 0.5: 99.10}, "sidp-paper-ln": {1.0: 98.41, 0.5: 98.56},
    "sidp-paper-bn": {1.0: 99.15, 0.5: 99.18},
}

# Training settings per data set (untuned; one setting for every row, so rows differ only in the method).
SETTINGS = {
    "digits": dict(arch="small", sample_rate=0.1, epochs=15, learning_rate=0.5, clip=1.0, eval_samples=5,
                   nonprivate_adam_lr=0.01),
    "mnist": dict(arch="lenet5", sample_rate=0.01, epochs=5, learning_rate=0.5, clip=1.0, eval_samples=5,
                  nonprivate_adam_lr=0.001),
    "cifar10": dict(arch="lenet5", sample_rate=0.01, epochs=5, learning_rate=0.5, clip=1.0, eval_samples=5,
                    nonprivate_adam_lr=0.001),
}
SMOKE_SETTING = dict(arch="small", sample_rate=0.25, epochs=1, learning_rate=0.5, clip=1.0, eval_samples=2,
                     nonprivate_adam_lr=0.01)
SMOKE_N = 100  # smoke: private training and test examples kept


def _check_dataset(dataset, data_dir):
    if dataset not in DATASETS:
        raise ValueError(f"dataset: must be one of {DATASETS}, got {dataset!r}")
    if dataset != "digits" and data_dir is None:
        raise ValueError(f"data_dir: dataset {dataset!r} is read from a TFDS data directory (no download); "
                         "pass data_dir (--data-dir) or use dataset='digits'")


def load_data(dataset: str, data_dir=None):
    """((x_train, y_train), (x_test, y_test)) as float32 NHWC images in [0, 1] and int labels."""
    from tfdpbnn import data

    _check_dataset(dataset, data_dir)
    if dataset == "digits":
        (x_train, y_train), (x_test, y_test) = data.load_digits(flatten=False)
    else:
        (x_train, y_train), (x_test, y_test) = data.load_tfds(dataset, data_dir=data_dir, download=False)
    x_train, x_test = np.asarray(x_train, np.float32), np.asarray(x_test, np.float32)
    if x_train.ndim == 3:  # [N, H, W] -> [N, H, W, 1]
        x_train, x_test = x_train[..., None], x_test[..., None]
    y_train = np.asarray(y_train).astype(np.int32).ravel()
    y_test = np.asarray(y_test).astype(np.int64).ravel()
    return (x_train, y_train), (x_test, y_test)


def public_split(x, y, num_public=NUM_PUBLIC, seed=4321):
    """Split off the public batch: returns (x_private, y_private, x_public).

    ``num_public`` examples (balanced over classes as far as possible,
    fixed seed) held out of the training set as the public BN batch; the rest is the private set.
    """
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    picked = []
    per_class = {c: rng.permutation(np.nonzero(y == c)[0]) for c in classes}
    k = 0
    while len(picked) < num_public and any(len(v) > k for v in per_class.values()):
        for c in classes:
            if len(picked) < num_public and len(per_class[c]) > k:
                picked.append(per_class[c][k])
        k += 1
    if len(picked) < num_public:
        raise ValueError(f"num_public: the training set has only {len(y)} examples, need more than "
                         f"{num_public}")
    mask = np.zeros(len(y), bool)
    mask[picked] = True
    return x[~mask], y[~mask], x[mask]


def build_model(input_shape, norm: str, noisy: bool, x_public, arch: str = "small", seed: int = 0,
                affine: bool = True):
    """The CNN (see module doc) with ``norm`` in ``NORMS`` after every trainable layer.

    ``noisy``: ``NoisyConv2D``/``NoisyDense`` (SI-DPSGD) or Keras ``Conv2D``/``Dense`` (DP-SGD). Inputs are
    centred (x - 0.5, data-independent). ``x_public``: the public batch (used by ``norm="bn"`` only).
    ``affine=False``: the normalization has no trainable scale and offset (paper mode, whose accounting
    covers the noisy layers' weights alone).
    """
    import tensorflow as tf

    from tfdpbnn import layers

    if norm not in NORMS:
        raise ValueError(f"norm: must be one of {NORMS}, got {norm!r}")
    tf.keras.utils.set_random_seed(seed)
    m = len(x_public) if norm == "bn" else 0

    def conv(filters, size, padding):
        if noisy:
            return layers.NoisyConv2D(filters, size, padding=padding)
        return tf.keras.layers.Conv2D(filters, size, padding=padding)

    def dense(units):
        return layers.NoisyDense(units) if noisy else tf.keras.layers.Dense(units)

    def normalize(h, rank):
        if norm == "ln":
            return tf.keras.layers.LayerNormalization(axis=list(range(1, rank)), center=affine,
                                                      scale=affine)(h)
        if norm == "bn":
            return layers.PublicBatchNormalization(num_public=m, carried=True, center=affine,
                                                   scale=affine)(h)
        return h

    if arch == "small":
        convs, hidden = [(8, 3, "same"), (16, 3, "same")], [32]
    elif arch == "lenet5":
        convs, hidden = [(6, 5, "same"), (16, 5, "valid")], [120, 84]
    else:
        raise ValueError(f"arch: must be 'small' or 'lenet5', got {arch!r}")
    inp = tf.keras.Input(tuple(input_shape))
    h = tf.keras.layers.Rescaling(1.0, offset=-0.5)(inp)
    if norm == "bn":
        h = layers.AppendPublicBatch(public_batch=np.asarray(x_public, np.float32) - 0.5)(h)
    for filters, size, padding in convs:
        h = conv(filters, size, padding)(h)
        h = tf.keras.layers.Activation("relu")(normalize(h, 4))
        h = tf.keras.layers.MaxPooling2D(2)(h)
    h = tf.keras.layers.Flatten()(h)
    for units in hidden:
        h = dense(units)(h)
        h = tf.keras.layers.Activation("relu")(normalize(h, 2))
    out = normalize(dense(10)(h), 2)  # the paper normalizes after every trainable layer, logits included
    if norm == "bn":
        out = layers.DropPublicBatch(m)(out)
    return tf.keras.Model(inp, out)


def _all_layers(model):
    """Every layer of ``model``, nested models included (public ``layers``; Keras 3 has no ``submodules``)."""
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)


def paper_mode_noise_multiplier(epsilon: float, steps: int, delta: float = DELTA) -> float:
    """The noise multiplier z that gives the paper mode the epsilon that holds of ``epsilon``.

    ``SIDPOptimizer(paper_mean_update=True)`` with a constant step after ``steps`` steps and the exported
    sample: its mu-GDP is
    sqrt(T (T + 1) (2 T + 1) / 6) / z (``docs/optimizers.md``), inverted here.
    """
    from scipy import optimize

    from tfdpbnn.privacy import gdp_epsilon

    mu = optimize.brentq(lambda m: gdp_epsilon(m, delta) - epsilon, 1e-6, 1e3, xtol=1e-12)
    return math.sqrt(steps * (steps + 1) * (2 * steps + 1) / 6.0) / mu


def _accuracy(logits, y):
    return float(np.mean(np.argmax(np.asarray(logits), axis=1) == y))


def _predict(model, x, batch=2000):
    return np.concatenate([np.asarray(model(x[i:i + batch], training=False))
                           for i in range(0, len(x), batch)])


def train_one(kind: str, norm: str, epsilon, setting: dict, x_train, y_train, x_test, y_test, x_public,
              seed: int, weight_noise=None) -> tuple[dict, dict | None]:
    """Train one configuration on Poisson batches and evaluate it; returns (result row, paper-mode statement).

    ``kind``: "sidp" (sound SIDPOptimizer), "sidp-paper" (``paper_mean_update=True``, z calibrated as the
    paper would), "sidp-paper-real" (the same, z calibrated for the epsilon that holds), "dpsgd" or
    "nonprivate".
    ``epsilon``: target (RDP-calibrated sigma for the steps run), or None for sigma 0 (clipping kept).
    ``weight_noise``: a constant weight-noise std (sound "sidp" only; Table 1), or None for s_t = eta C z/B.
    """
    import tensorflow as tf

    from tfdpbnn import DPSGDOptimizer, SIDPOptimizer, data, privacy
    from tfdpbnn.layers import mc_sampling

    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if (weight_noise is not None) != (kind == "nonprivate") and kind != "sidp":
        raise ValueError("weight_noise: a fixed weight-noise level is for kinds 'sidp' (sound) and "
                         "'nonprivate' (required there)")
    if kind == "nonprivate" and epsilon is not None:
        raise ValueError("epsilon: kind 'nonprivate' trains without DP; pass epsilon=None")
    n = len(x_train)
    batch = max(1, int(round(setting["sample_rate"] * n)))
    q = batch / n
    spe = int(math.ceil(n / batch))
    steps = spe * setting["epochs"]
    if epsilon is None:
        sigma = 0.0
    elif kind == "sidp-paper-real":
        sigma = paper_mode_noise_multiplier(epsilon, steps)
    else:
        sigma = float(privacy.calibrate_noise(epsilon, DELTA, q, steps, accountant="rdp", sampling="poisson"))
    noisy = kind != "dpsgd"
    # Paper mode updates every trainable variable with the clipped mean without noise: only the noisy layers'
    # weights are released with noise (SIDPOptimizer refuses others), so its normalizations have no scale and
    # offset of their own.
    model = build_model(x_train.shape[1:], norm, noisy, x_public, arch=setting["arch"], seed=seed,
                        affine=not kind.startswith("sidp-paper"))
    common = dict(l2_norm_clip=setting["clip"], noise_multiplier=sigma,
                  learning_rate=setting["learning_rate"], num_examples=n, batch_size=batch,
                  sampling="poisson", accountant="rdp", delta=DELTA,
                  # carried public rows feed the BN statistics of every later layer: no fast-clipping rule
                  clipping_method="jacobian" if norm == "bn" else "auto")
    if kind == "nonprivate":  # Davody et al. 2020, Table 1: noisy weights, no clipping, no DP noise
        opt = tf.keras.optimizers.Adam(setting["nonprivate_adam_lr"])
        for layer in _all_layers(model):
            if hasattr(layer, "set_noise_stddev"):
                layer.set_noise_stddev(weight_noise)
    elif kind == "dpsgd":
        opt = DPSGDOptimizer(**common)
    elif weight_noise is not None:  # sound mode: theta_t is post-processing of mu_t, so any s keeps epsilon
        opt = SIDPOptimizer(weight_noise=weight_noise, **common)
    else:
        import warnings

        with warnings.catch_warnings():  # paper mode warns that Lemma 4.1 does not hold: recorded below
            warnings.simplefilter("ignore", UserWarning)
            opt = SIDPOptimizer(paper_mean_update=kind.startswith("sidp-paper"), **common)
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = data.poisson_batches(x_train, y_train, sample_rate=q, steps_per_epoch=spe)  # secret seed
    start = time.time()
    model.fit(batches, epochs=setting["epochs"], steps_per_epoch=spe, verbose=0)
    wall = time.time() - start
    acc_mu = _accuracy(_predict(model, x_test), y_test)
    if weight_noise is None:
        weight_noise = float(opt.weight_noise_stddev().numpy()) if noisy else 0.0  # s_T = eta C z / B
    result = dict(kind=kind, norm=norm, epsilon_target=epsilon if epsilon is not None else math.inf,
                  weight_noise=weight_noise, seed=seed, sigma=sigma, sample_rate=q, steps=steps,
                  steps_run=int(opt.iterations.numpy()), accuracy_mu=acc_mu, train_time_s=wall)
    statement = None
    if noisy:
        if not kind.startswith("sidp-paper"):
            # Sound mode (or no DP): sampled networks are post-processing of mu; evaluate several.
            with mc_sampling():
                accs = [_accuracy(_predict(model, x_test), y_test) for _ in range(setting["eval_samples"])]
            result["accuracy_sample"] = float(np.mean(accs))
        # One released sample theta_T (Davody et al. 2020, Algorithm 1's output; all the paper-mode epsilon
        # covers).
        if kind == "nonprivate":
            for layer in _all_layers(model):
                if hasattr(layer, "sample_weights_into_kernel"):
                    layer.sample_weights_into_kernel()
        else:
            opt.release_weights(model)
        result["accuracy"] = _accuracy(_predict(model, x_test), y_test)
        if kind.startswith("sidp-paper"):
            result["accuracy_sample"] = result["accuracy"]
            statement = opt.privacy_statement(delta=DELTA)
            result["epsilon"] = statement["epsilon"]
            result["gdp_mu"] = statement["gdp_mu"]
    else:
        result["accuracy"] = acc_mu
    if not kind.startswith("sidp-paper"):
        result["epsilon"] = opt.epsilon(delta=DELTA, accountant="rdp") if sigma > 0 else math.inf
    # What the paper's accounting (the subsampled Gaussian with z, as for DP-SGD) would claim.
    result["epsilon_claimed"] = (privacy.compute_epsilon(sigma, q, result["steps_run"], DELTA,
                                                         accountant="rdp", sampling="poisson")
                                 if sigma > 0 else math.inf)
    return result, statement


def _method_spec(method):
    """(kind, norm) of a Table 4 method name."""
    norm = "ln" if method.endswith("-ln") else ("bn" if method.endswith("-bn") else "none")
    kind = method[:-3] if norm != "none" else method
    return kind, norm


def _summarize(rows, keys, paper):
    from experiments.runner import mean_std

    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        row = dict(zip(keys, key, strict=True))
        row["seeds"] = len(rs)
        for name in ("accuracy", "accuracy_sample", "accuracy_mu"):
            vals = [r[name] for r in rs if r.get(name, "") != ""]
            if vals:
                row[name + "_mean"], row[name + "_std"] = mean_std(vals)
        for name in ("sigma", "weight_noise", "steps_run", "sample_rate", "epsilon_claimed"):
            row[name] = rs[0][name]
        eps = [r["epsilon"] for r in rs]
        row["epsilon"] = max(eps)  # the largest over seeds (paper mode's depends on the learning rates only)
        row["paper_mnist"] = paper(row)
        out.append(row)
    return out


def _plot(path, t1_summary, t4_summary, dataset):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    for s_eps in sorted({r["epsilon_target"] for r in t1_summary}):
        for norm, color in zip(NORMS, ("C0", "C1", "C2"), strict=True):
            pts = sorted((r["weight_noise"], r["accuracy_sample_mean"], r["accuracy_sample_std"])
                         for r in t1_summary if r["norm"] == norm and r["epsilon_target"] == s_eps)
            if not pts:
                continue
            x, y, e = zip(*pts, strict=True)
            label = f"{norm}, eps={'inf' if math.isinf(s_eps) else f'{s_eps:g}'}"
            ax.errorbar(x, y, yerr=e, marker="o", color=color, capsize=3,
                        linestyle="-" if math.isinf(s_eps) else "--", label=label)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("weight noise std s (fixed during training)")
    ax.set_ylabel("test accuracy of a sampled network")
    ax.set_title(f"Table 1 analogue ({dataset}): solid non-private, dashed sound SI-DPSGD", fontsize=9)
    ax.set_ylim(0, 1.02)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax = axes[1]
    for i, method in enumerate(sorted({r["method"] for r in t4_summary})):
        pts = sorted((r["epsilon"], r["accuracy_mean"], r["accuracy_std"])
                     for r in t4_summary if r["method"] == method and math.isfinite(r["epsilon"]))
        if not pts:
            continue
        x, y, e = zip(*pts, strict=True)
        label = method + (" (at its REAL epsilon)" if "paper" in method else "")
        ax.errorbar(x, y, yerr=e, marker="o", capsize=3, color=f"C{i}", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (delta 1e-5; an upper bound for what ran)")
    ax.set_ylabel("test accuracy (released weights)")
    ax.set_title(f"Table 4 analogue ({dataset})")
    ax.set_ylim(0, 1.02)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out_dir: str, seeds: int | None = None, smoke: bool = False, data_dir: str | None = None,
        log: Callable[[str], None] | None = print, dataset: str = "digits", epsilons=None, methods=None,
        noise_levels=None, table1_epsilons=(1.0,), tables=TABLES, norms=NORMS, epochs=None,
        **unknown) -> dict:
    """Run the tables (module doc) over the seeds; write CSVs, the figure and ``run.json``.

    Args beyond the common ones: ``dataset`` in ``DATASETS`` (mnist/cifar10 need ``data_dir``, read with
    ``download=False``); ``epsilons`` (Table 4; default ``EPSILONS``); ``methods`` (Table 4; default
    ``DEFAULT_METHODS``, any of ``METHODS``); ``noise_levels`` (Table 1; default ``NOISE_LEVELS``);
    ``table1_epsilons`` (the DP budgets of Table 1; its non-private column always runs); ``tables``
    (subset of ``TABLES``: "table1" = every norm without DP and "none"/"ln" at ``table1_epsilons``;
    "table1-bn-dp" = "bn" at ``table1_epsilons``, separate because per-example clipping through the
    carried public batch takes the O(B^2) jacobian path; "table4"); ``norms`` (Table 1's rows, subset of
    ``NORMS``); ``epochs`` (overrides the data set's).
    """
    from experiments.runner import Run

    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an option of sidp-tables")
    _check_dataset(dataset, data_dir)
    tables = tuple(tables)
    if not tables or any(t not in TABLES for t in tables):
        raise ValueError(f"tables: each must be one of {TABLES}, got {tables!r}")
    norms = tuple(norms)
    if not norms or any(n not in NORMS for n in norms):
        raise ValueError(f"norms: each must be one of {NORMS}, got {norms!r}")
    methods = tuple(methods or DEFAULT_METHODS)
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: each must be one of {METHODS}, got {m!r}")
    epsilons = tuple(float(e) for e in (epsilons or EPSILONS))
    if any(not (e > 0 and math.isfinite(e)) for e in epsilons):
        raise ValueError(f"epsilons: need finite epsilons > 0, got {epsilons!r}")
    noise_levels = tuple(float(s) for s in (NOISE_LEVELS if noise_levels is None else noise_levels))
    if not noise_levels or any(not (s >= 0 and math.isfinite(s)) for s in noise_levels):
        raise ValueError(f"noise_levels: need finite weight-noise stds >= 0, got {noise_levels!r}")
    table1_epsilons = tuple(float(e) for e in table1_epsilons)
    if any(not (e > 0 and math.isfinite(e)) for e in table1_epsilons):
        raise ValueError(f"table1_epsilons: need finite epsilons > 0, got {table1_epsilons!r}")
    setting = dict(SMOKE_SETTING) if smoke else dict(SETTINGS[dataset])
    if epochs is not None:
        if isinstance(epochs, bool) or int(epochs) != epochs or epochs < 1:
            raise ValueError(f"epochs: must be an integer >= 1, got {epochs!r}")
        setting["epochs"] = int(epochs)
    n_seeds = (1 if smoke else 5) if seeds is None else int(seeds)
    if smoke:  # every code path once (one noise level, one epsilon) on a subsample: seconds
        noise_levels, epsilons, table1_epsilons = (0.5,), epsilons[:1], table1_epsilons[:1]
    settings = dict(dataset=dataset, setting=setting, tables=list(tables), methods=list(methods),
                    epsilons=list(epsilons), noise_levels=list(noise_levels),
                    table1_epsilons=list(table1_epsilons), norms=list(norms), delta=DELTA, sampling="poisson",
                    accountant_for_sigma="rdp", num_public=NUM_PUBLIC, smoke=smoke)
    run_ = Run("sidp-tables", out_dir, settings, seeds=range(n_seeds), log=log)
    (x_train, y_train), (x_test, y_test) = load_data(dataset, data_dir)
    x_priv, y_priv, x_pub = public_split(x_train, y_train)
    if smoke:
        x_priv, y_priv = x_priv[:SMOKE_N], y_priv[:SMOKE_N]
        x_test, y_test = x_test[:SMOKE_N], y_test[:SMOKE_N]
    run_.note("data", dict(dataset=dataset, train_private=len(x_priv), public_held_out=len(x_pub),
                           test=len(x_test), image_shape=list(x_train.shape[1:])))
    run_.log(f"{dataset}: {len(x_priv)} private training examples, {len(x_pub)} held out as the public BN "
             f"batch, {len(x_test)} test")

    def fmt(e):
        return "inf" if e is None or math.isinf(e) else f"{e:g}"

    grid = []  # Table 1: (epsilon or None, norm)
    if "table1" in tables:
        grid += [(None, norm) for norm in norms]
        grid += [(e, norm) for e in table1_epsilons for norm in norms if norm != "bn"]
    if "table1-bn-dp" in tables and "bn" in norms:
        grid += [(e, "bn") for e in table1_epsilons]
    t1_rows, t1_summary = [], []
    for eps, norm in run_.progress(grid, "table1 setting"):
        kind = "nonprivate" if eps is None else "sidp"
        for s in noise_levels:
            for seed in range(n_seeds):
                r, _ = train_one(kind, norm, eps, setting, x_priv, y_priv, x_test, y_test, x_pub, seed,
                                 weight_noise=s)
                t1_rows.append(r)
                run_.log(f"table1 eps={fmt(eps)} {norm} s={s:g} seed={seed}: sampled acc "
                         f"{r['accuracy_sample']:.4f} mu acc {r['accuracy_mu']:.4f} {r['train_time_s']:.1f}s")
            if eps is not None:
                run_.privacy(f"table1/eps={fmt(eps)}/{norm}/s={s:g}", r["sigma"], r["sample_rate"],
                             r["steps_run"], DELTA, sampling="poisson", clip=setting["clip"])
    if t1_rows:
        run_.write_csv("table1.csv", t1_rows)
        t1_summary = _summarize(
            t1_rows, ("epsilon_target", "norm", "weight_noise"),
            lambda row: PAPER_TABLE1[row["norm"]].get(row["weight_noise"], "")
            if math.isinf(row["epsilon_target"]) else "")
        run_.write_csv("table1_summary.csv", t1_summary)
        for s in t1_summary:
            run_.log(f"table1 eps={fmt(s['epsilon_target'])} {s['norm']:4s} s={s['weight_noise']:<5g} "
                     f"sampled {s['accuracy_sample_mean']:.4f} +- {s['accuracy_sample_std']:.4f}  mu "
                     f"{s['accuracy_mu_mean']:.4f}  paper (MNIST, LeNet-5, non-private) {s['paper_mnist']}")

    t4_rows, t4_summary = [], []
    if "table4" in tables:
        for method in run_.progress(methods, "table4 method"):
            kind, norm = _method_spec(method)
            for eps in epsilons:
                for seed in range(n_seeds):
                    r, statement = train_one(kind, norm, eps, setting, x_priv, y_priv, x_test, y_test, x_pub,
                                             seed)
                    r["method"] = method
                    t4_rows.append(r)
                    run_.log(f"table4 {method} eps={eps:g} seed={seed}: acc {r['accuracy']:.4f} (mu "
                             f"{r['accuracy_mu']:.4f}) sigma {r['sigma']:.3f} epsilon {r['epsilon']:.4g} "
                             f"(claimed {r['epsilon_claimed']:.4g}) {r['train_time_s']:.1f}s")
                    if statement is not None:  # paper mode: its own (much larger) epsilon, per seed
                        run_.privacy_statement(f"table4/{method}/eps={eps:g}/seed={seed}", statement,
                                               epsilon_claimed_by_paper=r["epsilon_claimed"])
                if not kind.startswith("sidp-paper"):
                    run_.privacy(f"table4/{method}/eps={eps:g}", r["sigma"], r["sample_rate"], r["steps_run"],
                                 DELTA, sampling="poisson", clip=setting["clip"])
        run_.write_csv("table4.csv", t4_rows)
        t4_summary = _summarize(
            t4_rows, ("method", "epsilon_target"),
            lambda row: PAPER_TABLE4.get(row["method"], {}).get(row["epsilon_target"], ""))
        run_.write_csv("table4_summary.csv", t4_summary)
        for s in t4_summary:
            run_.log(f"table4 {s['method']:14s} target eps={s['epsilon_target']:<4g} "
                     f"acc {s['accuracy_mean']:.4f} +- {s['accuracy_std']:.4f}  epsilon that holds "
                     f"{s['epsilon']:.4g}  paper (MNIST) "
                     f"{s['paper_mnist']}")
    _plot(run_.path("sidp_tables.png"), t1_summary, t4_summary, dataset)
    return run_.finish()
