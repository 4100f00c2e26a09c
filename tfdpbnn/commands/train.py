"""``tfdpbnn train``: train a DP Bayesian network at a privacy budget, evaluate, export.

Optionally pretrained without privacy on public data first (``--public mnist5k``; Tramer & Boneh 2021).
Poisson-sampled batches (``tfdpbnn.data.poisson_batches``, the sampler's own key from OS entropy at every
run, as the DP noise's, so no two runs draw the same batches), noise calibrated by RDP for the epochs run, a
Keras progress bar; then test accuracy (MC-averaged for stochastic models, posterior snapshots for DP-SGLD),
epsilon by every sound accountant, ECE; writes ``saved_model/`` (with ``assets/privacy.json``),
``reliability.png`` and ``summary.json`` under ``--out``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

# The parser's choices live here, not in train_recipes (which imports TensorFlow): ``tfdpbnn train --help``
# loads this module alone (tfdpbnn.cli), so its top level imports nothing but the standard library.
# train_recipes.METHODS and PUBLIC_SOURCES are the same names (tests/test_train_cli.py checks it).
METHODS = ("dpvd", "dpsgld", "dpbbp", "dpmcdropout", "dpd", "sidp", "dpsgd")
PUBLIC_SOURCES = ("mnist5k",)
#: tfdpbnn.data.public.NORMALIZATIONS, the recipe's (train_recipes.PUBLIC_NORMALIZATION) first
PUBLIC_NORMALIZATIONS = ("nist", "aspect")
DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10")


def read_or_create_secret(path: str) -> int:
    """A 63-bit secret seed from ``path``, created from ``os.urandom`` (mode 0600) on first use.

    It seeds the model's own randomness (``tf.random.set_seed``: weight draws, dropout), never the batches:
    one key for every run would draw the same batches in every run on the same records, and the per-record
    ledger would compose those runs as independent (an understated epsilon).
    """
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(os.urandom(8).hex() + "\n")
    with open(path) as handle:
        text = handle.read().strip()
    try:
        return int(text, 16) % (2 ** 63)
    except ValueError as err:
        raise ValueError(f"--secret-key-file: {path} does not hold a hexadecimal seed") from err


def add_parser(subparsers) -> None:
    """Register the ``train`` subcommand."""
    p = subparsers.add_parser("train", help="train a DP Bayesian network at a privacy budget and export it",
                              description=__doc__)
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--dataset", default="digits", choices=DATASETS)
    p.add_argument("--epsilon", type=float, required=True, help="privacy budget epsilon > 0")
    p.add_argument("--delta", type=float, default=1e-5, help="delta in (0, 1) (default 1e-5)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default: the method's recipe)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="expected Poisson batch size (default: 20%% of the training set)")
    p.add_argument("--out", default=None, help="output directory (default runs/<method>-<dataset>-eps<E>)")
    p.add_argument("--mc-samples", type=int, default=None,
                   help="Monte Carlo samples for evaluation and the export's default (recipe: 30)")
    p.add_argument("--hidden", type=int, default=None,
                   help="tanh units of the hidden layer, 0 for none (default: the method's recipe, 64)")
    p.add_argument("--accountant", default=None, choices=("rdp", "pld"),
                   help="accountant that calibrates the noise (default: the recipe's, rdp)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialization (public); the run is one "
                   "seed (docs/results.md gives the spread over seeds)")
    p.add_argument("--secret-key-file", default=os.path.join("runs", ".sampling-key"),
                   help="file holding this machine's secret seed of the model's own randomness (weight "
                        "draws, dropout; created from OS entropy if missing, readable by you only; default "
                        "runs/.sampling-key). The batch sampling and the DP noise are keyed from OS entropy "
                        "at every run, never from this file: two runs never draw the same batches")
    p.add_argument("--public", default=None, choices=PUBLIC_SOURCES,
                   help="pretrain without privacy on this public data set before the private training "
                        "(mnist5k: 5,000 MNIST images in DIGITS' format, --dataset digits only; needs "
                        "pip install 'tfdpbnn[public]'); public data cost no privacy: epsilon is unchanged")
    p.add_argument("--public-normalization", default=None, choices=PUBLIC_NORMALIZATIONS,
                   help="size normalization of the public MNIST-5k images (needs --public): nist (default), "
                        "the NIST system's that made DIGITS (20x32 box, stroke-width normalization; Garris "
                        "et al. 1994), or aspect (aspect ratio kept, no stroke normalization)")
    p.add_argument("--public-epochs", type=int, default=None,
                   help="epochs of the public pretraining (default: the pretraining recipe, 20)")
    p.add_argument("--ema", type=float, default=None,
                   help="evaluate and export the exponential moving average of the DP iterates with this "
                        "decay in [0, 1) (De et al. 2022; post-processing: epsilon is unchanged; default: "
                        "the last iterate)")
    p.add_argument("--copies", type=int, default=None,
                   help="augmentation multiplicity (De et al. 2022; --dataset digits only): train on this "
                        "many augmented copies of each example (quarter-cell shifts and count jitter, "
                        "tfdpbnn.layers.AugmentationCopies), their losses averaged before clipping, so each "
                        "example still contributes at most C and epsilon is unchanged (default: none)")
    p.add_argument("--calibration-split", type=float, default=0.0,
                   help="hold out about this fraction of the training records (private; chosen record by "
                        "record) to fit a temperature and 90%% prediction sets privately after training "
                        "(tfdpbnn.uncertainty.CalibrationPlan); --epsilon covers training and calibration "
                        "(default 0: no calibration)")
    p.add_argument("--calibration-composition", default="parallel", choices=("parallel", "sequential"),
                   help="parallel (default): the held-out records are disjoint from training, so each part "
                        "gets the whole epsilon (McSherry 2009); sequential: the training noise leaves room "
                        "for the calibration releases")
    p.add_argument("--data-dir", default=None, help="TFDS data directory (mnist, fashion_mnist, cifar10: "
                   "they need pip install 'tfdpbnn[tfds]')")
    p.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Keras fit verbosity")
    p.set_defaults(func=run)


def _load(dataset, data_dir, seed):
    from tfdpbnn import data

    if dataset == "digits":
        (x, y), (xt, yt) = data.load_digits(seed=seed)
    else:
        (x, y), (xt, yt) = data.load_tfds(dataset, data_dir=data_dir)
    return (x - 0.5, y), (xt - 0.5, yt)  # centred inputs


def _check(args):
    if not (args.epsilon > 0 and math.isfinite(args.epsilon)):
        raise ValueError(f"--epsilon must be a finite number > 0, got {args.epsilon}")
    if not 0 < args.delta < 1:
        raise ValueError(f"--delta must be in (0, 1), got {args.delta}")
    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"--epochs must be an integer >= 1, got {args.epochs}")
    if args.mc_samples is not None and args.mc_samples < 1:
        raise ValueError(f"--mc-samples must be an integer >= 1, got {args.mc_samples}")
    if args.hidden is not None and args.hidden < 0:
        raise ValueError(f"--hidden must be an integer >= 0, got {args.hidden}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be an integer >= 1, got {args.batch_size}")
    public_epochs = getattr(args, "public_epochs", None)
    if public_epochs is not None and (public_epochs < 1 or getattr(args, "public", None) is None):
        raise ValueError(f"--public-epochs must be an integer >= 1 and needs --public, got {public_epochs}")
    normalization = getattr(args, "public_normalization", None)
    if normalization is not None and getattr(args, "public", None) is None:
        raise ValueError(f"--public-normalization needs --public, got --public-normalization {normalization}")
    ema = getattr(args, "ema", None)
    if ema is not None and not (0.0 <= ema < 1.0):
        raise ValueError(f"--ema must be a decay in [0, 1), got {ema}")
    split = getattr(args, "calibration_split", 0.0)
    if not (0.0 <= split < 1.0):
        raise ValueError(f"--calibration-split must be in [0, 1) (0: no calibration), got {split}")
    if split > 0 and args.method == "sidp":
        raise ValueError("--calibration-split: sidp's released sample is accounted by its own rule; "
                         "calibrating it is not supported (use another --method, or 0)")
    copies = getattr(args, "copies", None)
    if copies is not None and (copies < 1 or args.dataset != "digits"):
        raise ValueError(f"--copies must be an integer >= 1 and needs --dataset digits (its augmentations "
                         f"are DIGITS' 8x8 count images), got --copies {copies} --dataset {args.dataset}")
    if getattr(args, "public", None) is not None and args.dataset != "digits":
        raise ValueError(f"--public {args.public} is in DIGITS' format: it needs --dataset digits, got "
                         f"--dataset {args.dataset}")


def train(args) -> dict:
    """Run the training described by the parsed ``args``; returns the summary written to summary.json."""
    import numpy as np
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn import privacy
    from tfdpbnn.commands.train_recipes import RECIPES, STOCHASTIC, build_model, build_optimizer
    from tfdpbnn.uncertainty import (
        CalibrationPlan,
        coverage_and_size,
        expected_calibration_error,
        mc_predict,
        reliability_diagram,
        split_by_record,
    )

    _check(args)
    recipe = dataclasses.replace(RECIPES[args.method])
    if args.epochs is not None:
        recipe.epochs = args.epochs
    if args.mc_samples is not None:
        recipe.mc_samples = args.mc_samples
    if args.hidden is not None:
        recipe.hidden = args.hidden
    if args.accountant is not None:
        recipe.accountant = args.accountant
    (x, y), (x_test, y_test) = _load(args.dataset, args.data_dir, args.seed)
    plan = None
    if getattr(args, "calibration_split", 0.0) > 0:  # held-out private records for the calibration releases
        plan = CalibrationPlan(composition=args.calibration_composition)
        held = split_by_record([x, y], args.calibration_split, key=args.seed)  # record by record (public key)
        if held.sum() < 10 or (~held).sum() < 10:
            raise ValueError(f"--calibration-split {args.calibration_split} leaves {held.sum()} calibration "
                             f"and {(~held).sum()} training examples; each needs at least 10")
        (x_cal, y_cal), (x, y) = (x[held], y[held]), (x[~held], y[~held])
        needed = plan.min_calibration_size(args.epsilon, args.delta, recipe.accountant)
        if len(x_cal) < needed:  # before any budget is spent
            raise ValueError(f"--calibration-split {args.calibration_split} holds out {len(x_cal)} examples; "
                             f"private 90% prediction sets at --epsilon {args.epsilon:g} and --delta "
                             f"{args.delta:g} need at least {needed} to be informative (fewer give sets of "
                             "every label); raise --calibration-split or --epsilon, or use 0")
    n = len(x)
    batch_size = args.batch_size or max(1, int(round(recipe.sample_rate * n)))
    if batch_size > n:
        raise ValueError(f"--batch-size must be <= the training set size {n}, got {batch_size}")
    q = batch_size / n
    out = args.out or os.path.join("runs", f"{args.method}-{args.dataset}-eps{args.epsilon:g}")
    os.makedirs(out, exist_ok=True)

    num_classes = int(max(y.max(), y_test.max()) + 1)
    model = build_model(args.method, x.shape[1:], num_classes, n, recipe.hidden, args.seed,
                        kl_weight=recipe.kl_weight)
    public = getattr(args, "public", None)
    public_info = None
    if public is not None:
        from tfdpbnn.commands.train_recipes import public_fine_tuning_rate

        start = time.time()
        normalization = getattr(args, "public_normalization", None) or PUBLIC_NORMALIZATIONS[0]
        simulated = dataclasses.replace(recipe, sample_rate=q)
        chosen = public_fine_tuning_rate(args.method, simulated, args.epsilon, args.delta, public,
                                         normalization=normalization)
        recipe.learning_rate = chosen["learning_rate"]  # fine-tuning rate chosen on public data only
        print(f"tfdpbnn train: fine-tuning learning rate {recipe.learning_rate:g}, the best of "
              f"{chosen['candidates']} for training from scratch at this epsilon simulated on public "
              f"{public} (public validation accuracy {[round(v, 3) for v in chosen['scores']]}; no privacy "
              f"cost) in {time.time() - start:.1f} s")
        from tfdpbnn.commands.train_recipes import PublicPretraining, pretrain_on_public

        settings = PublicPretraining()
        if getattr(args, "public_epochs", None) is not None:
            settings.epochs = args.public_epochs
        start = time.time()
        public_info = pretrain_on_public(model, public, args.seed, settings, normalization=normalization)
        public_info["seconds"] = time.time() - start
        public_info["fine_tuning_learning_rate"] = chosen
        print(f"tfdpbnn train: pretrained on public {public} ({normalization} normalization, "
              f"{public_info['examples']} examples, "
              f"{public_info['settings']['epochs']} epochs, no privacy cost; train accuracy "
              f"{public_info['final_train_accuracy']:.3f}) in {public_info['seconds']:.1f} s")
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if getattr(args, "copies", None) is not None:  # after any public pretraining, which sees no copies
        augment = tfdpbnn.layers.AugmentationCopies(args.copies, offset=-0.5)  # _load's centring
        model = tf.keras.Sequential([tf.keras.Input(x.shape[1:]), augment] + model.layers)
        loss = tfdpbnn.layers.CopiesSparseCategoricalCrossentropy(from_logits=True)
    other_events = plan.training_events(args.epsilon, args.delta, recipe.accountant) if plan else ()
    optimizer = build_optimizer(args.method, recipe, args.epsilon, args.delta, n, batch_size,
                                other_events=other_events)
    model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
    steps_per_epoch = int(math.ceil(n / batch_size))
    secret = read_or_create_secret(args.secret_key_file)
    tf.random.set_seed(secret % (2 ** 31))  # the model's own randomness (the DP noise is keyed by os.urandom)
    # The sampler's own key, from OS entropy for this run: one key for every run (the key file's, before)
    # drew the same batches in every run on the same records, which the per-record ledger composed as
    # independent runs (1.395 printed for two runs on DIGITS where 1.594 held).
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=q, steps_per_epoch=steps_per_epoch)
    callbacks = [tfdpbnn.PrivacyCallback(args.delta, stop_at_epsilon=args.epsilon)]
    if getattr(args, "ema", None) is not None:  # loaded into the model when training ends
        callbacks.append(tfdpbnn.uncertainty.IterateAverage(args.ema))
    sampler = None
    if args.method == "dpsgld":
        total = steps_per_epoch * recipe.epochs
        sampler = tfdpbnn.PosteriorSampler(burn_in=total // 2, thinning=max(1, total // 40), max_samples=20)
        callbacks.append(sampler)
    print(f"tfdpbnn train: {args.method} on {args.dataset} ({n} train / {len(x_test)} test), "
          f"epsilon={args.epsilon:g}, delta={args.delta:g}: sigma={optimizer.noise_multiplier:.4g}, "
          f"C={optimizer.l2_norm_clip:g} (calibrated by {recipe.accountant}), expected batch {batch_size} "
          f"(q={q:.4g}, Poisson), {recipe.epochs} epochs x {steps_per_epoch} steps, "
          f"{recipe.hidden or 'no'} hidden units, seed {args.seed}"
          + (f", KL weight {recipe.kl_weight:g} (chosen on public data)" if args.method == "dpvd" else "")
          + (f", learning rate {recipe.learning_rate:g}" if args.method != "dpsgld" else "")
          + (f", EMA of the iterates (decay {args.ema:g})" if getattr(args, "ema", None) is not None else "")
          + (f", {args.copies} augmented copies per example" if getattr(args, "copies", None) else ""))
    start = time.time()
    model.fit(batches, epochs=recipe.epochs, verbose=args.verbose, callbacks=callbacks)
    train_seconds = time.time() - start

    if args.method == "sidp":
        # Release (and evaluate, and export) one sample theta = mu + s xi, what Davody et al. (2020) releases.
        optimizer.release_weights(model)
    def predict(inputs):
        if sampler is not None and sampler.samples:
            snapshots = sampler.samples
            return np.asarray(mc_predict(model, inputs, weight_snapshots=snapshots, from_logits=True).mean)
        samples = recipe.mc_samples if args.method in STOCHASTIC else 1
        return np.asarray(mc_predict(model, inputs, num_samples=samples, from_logits=True).mean)

    probs = predict(x_test)
    accuracy = float(np.mean(np.argmax(probs, axis=1) == y_test))
    ece = expected_calibration_error(probs, y_test)
    calibration = None
    temperature = threshold = None
    if plan is not None:  # private fits on the held-out split, composed into the statement's epsilon
        # Their noise is secret (the operating system's entropy, as the optimizer's): a seed would make it
        # replayable and void the statement.
        # Both reserved in the per-record ledger before either fit reads the held-out split, and recorded in
        # the optimizer's statement; "parallel" is checked there: no held-out record may have trained.
        temperature, threshold = plan.fit(predict(x_cal), y_cal, args.epsilon, args.delta, recipe.accountant,
                                          optimizer=optimizer, x=x_cal, y=y_cal)
        calibrated = temperature.apply(probs)
        coverage, set_size = coverage_and_size(threshold.predict_sets(calibrated), y_test)
        calibration = {"held_out_examples": len(x_cal), "temperature": temperature.temperature,
                       "threshold": threshold.threshold, "ece_calibrated": expected_calibration_error(
                           calibrated, y_test), "coverage": coverage, "set_size": set_size,
                       "alpha": plan.alpha, "plan": dataclasses.asdict(plan),
                       "release_epsilons": plan.release_epsilons(args.epsilon, args.delta, recipe.accountant)}
    statement = optimizer.privacy_statement()
    saved_model = tfdpbnn.export_saved_model(model, os.path.join(out, "saved_model"),
                                             num_samples=recipe.mc_samples, privacy=statement,
                                             from_logits=True, calibration=temperature,
                                             prediction_sets=threshold, input_offset=-0.5)  # _load's centring
    title = f"{args.method} on {args.dataset}, epsilon {statement['epsilon']:.3g}"
    diagram = os.path.join(out, "reliability.png")
    reliability_diagram(probs, y_test, diagram, title=title)  # returns the Figure; saved at `diagram`
    summary = {
        "method": args.method, "dataset": args.dataset, "target_epsilon": args.epsilon, "delta": args.delta,
        "test_accuracy": accuracy, "ece": ece, "epsilon": statement["epsilon"],
        "epsilon_by_accountant": statement["epsilon_by_accountant"],
        "approximate_epsilon_gdp": (None if getattr(optimizer, "paper_mean_update", False)
                                    else _approximate_gdp(optimizer, privacy)),
        "noise_multiplier": optimizer.noise_multiplier, "l2_norm_clip": optimizer.l2_norm_clip,
        "batch_size": batch_size, "sample_rate": q, "steps": optimizer.steps, "epochs": recipe.epochs,
        "train_seconds": train_seconds, "seed": args.seed, "recipe": dataclasses.asdict(recipe),
        "privacy_statement": statement, "saved_model": saved_model, "reliability_diagram": diagram,
        "public_data": public_info, "calibration": calibration, "copies": getattr(args, "copies", None),
    }
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2, default=float)
    print(f"test accuracy: {accuracy:.4f}   ECE: {ece:.4f}   ({train_seconds:.1f} s training, "
          f"{optimizer.steps} steps; one seed: --seed {args.seed}; batches and DP noise drawn fresh for "
          "this run)")
    if calibration is not None:
        print(f"calibrated (private temperature {calibration['temperature']:.3g} and 90% prediction sets, "
              f"fit on {calibration['held_out_examples']} held-out training examples): ECE "
              f"{calibration['ece_calibrated']:.4f}   prediction sets: coverage "
              f"{calibration['coverage']:.3f}, mean size {calibration['set_size']:.2f}")
    print(f"epsilon at delta={args.delta:g}, upper bounds for everything this command did with the training "
          "data (one training run" + (", the private temperature and prediction sets, composed"
                                      if calibration else "") + "; the test set is public):")
    if public_info is not None:
        print(f"  (public data used: {public} pretraining, {public_info['examples']} examples; public data "
              f"cost no privacy, so these bounds are those of the private run alone)")
    for name, value in statement["epsilon_by_accountant"].items():
        print(f"  {name:>6}: {value:.4f}")
    if summary["approximate_epsilon_gdp"] is not None:
        print(f"  (gdp, CLT approximation, not a bound: {summary['approximate_epsilon_gdp']:.4f})")
    print(f"wrote {saved_model} (assets/privacy.json), {diagram}, {os.path.join(out, 'summary.json')}")
    return summary


def _approximate_gdp(optimizer, privacy):
    """GDP's central-limit epsilon (Zhang et al. 2022, Thm. 2), printed marked as an approximation.

    It is not a bound.
    """
    import warnings

    if "gdp" not in privacy.available_accountants():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its under-reporting warning: we already label it as approximate
        return optimizer.ledger.approximate_epsilon(optimizer.delta, "gdp")


def run(args) -> int:
    """Entry point of ``tfdpbnn train``."""
    train(args)
    return 0
