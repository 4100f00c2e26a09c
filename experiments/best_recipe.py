"""The main job's recipe (``./scripts/demo``) over seeds, with an ablation of each ingredient.

Recipe (``tfdpbnn train --method dpvd --public mnist5k --ema 0.95``): every one of DIGITS' 1437 training
records trains (no held-out split); non-private pretraining on the 5,000 public MNIST-5k images (centred,
``train_recipes.pretrain_on_public``); DP fine-tuning of the whole 64-unit network with noise calibrated by
PLD (delta 1e-5, Poisson q = 0.2, 20 epochs = 120 steps, C = 1) at the learning rate that the public data
choose for training *from scratch* at the same epsilon (``tfdpbnn.public.select_on_public`` on MNIST-5k;
``train_recipes.PUBLIC_FINE_TUNING_RATES``); then the exponential moving average of the DP iterates
(``tfdpbnn.uncertainty.IterateAverage``, decay 0.95, chosen on public data by ``--public-calibration``;
post-processing). No temperature: the raw ECE of this
recipe is already low, decided without reading private data.

Arms, each trained once per seed and epsilon (the post-processing arms read the same run):

- ``recipe``: the recipe above (EMA weights); ``ema 0.9``: the same run's average with the decay used before
  the public choice; ``last iterate``: the same run without the EMA;
- ``iterate gaussian``: the same run, MC average over 30 weight draws from the diagonal Gaussian fitted to the
  iterates of the second half of training (``IterateMoments``, SWAG-diagonal, Maddox et al. 2019);
- ``no pretraining``: the same steps from the recipe's random initialization at the learning rate 1 of
  ``tfdpbnn train`` (EMA applied);
- ``75% split (old demo)`` is not rerun here (docs/results.md, uncertainty-table, has it).

Scored on DIGITS' 360 test images: accuracy, ECE (15 bins), NLL, and the AUROC of predictive entropy against
uniform noise and inverted digits (1 - x). Secret sampling keys: 10_000 + seed (one key per seed, fixed).

Run: ``nice python experiments/best_recipe.py --seeds 0 1 2 3 4 --epsilons 1 0.3 --out runs/best_recipe``.
``--demo-command`` runs ``./scripts/demo``'s own command (``tfdpbnn train``, fresh batches every run) for
every seed and epsilon instead, and scores its SavedModel fed raw DIGITS: the figures the demo prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time

import numpy as np

DELTA = 1e-5
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from experiments.honest_common import auroc, entropy  # noqa: E402  (one AUROC: ties count half)

ARMS = ("recipe", "ema 0.9", "last iterate", "iterate gaussian", "iterate ensemble", "no pretraining")


def scores(predict, x_test, y_test, ood) -> dict:
    """Accuracy, ECE, NLL and AUROC of entropy against each OOD set for ``predict(x) -> probabilities``."""
    import tfdpbnn

    p = predict(x_test)
    out = {"accuracy": float(np.mean(p.argmax(1) == y_test)),
           "ece": float(tfdpbnn.uncertainty.expected_calibration_error(p, y_test)),
           "nll": float(-np.mean(np.log(np.clip(p[np.arange(len(y_test)), y_test], 1e-12, 1.0))))}
    for name, xo in ood.items():
        out[f"auroc_{name}"] = auroc(entropy(p), entropy(predict(xo)))
    return out


def ood_sets(x_test, seed=0):
    """Uniform noise images and inverted digits (1 - x), centred like the inputs (data-independent)."""
    rng = np.random.default_rng(seed)
    return {"noise": (rng.uniform(0, 1, size=x_test.shape) - 0.5).astype("float32"),
            "inverted": (-x_test).astype("float32")}  # 1 - (x + 0.5) - 0.5 = -x


#: The EMA decay of the recipe: 0.95, chosen on public data only (``public_calibration``; 0.9 before).
EMA_DECAY = 0.95


def run_one(method, epsilon, seed, learning_rate, weights, ema_decay=EMA_DECAY, epochs=None, sample_rate=None,
            copies=0, trainable_last=None, temperature_draws=True):
    """Fine-tune (from ``weights``, or the random initialization if None) on all DIGITS records; score.

    ``copies`` > 0: augmentation multiplicity (``tfdpbnn.layers.AugmentationCopies`` in front of the network,
    its per-example loss the mean over ``copies`` augmented copies, clipped once; De et al. 2022).
    ``trainable_last``: fine-tune only the last that many layers with weights
    (``tfdpbnn.public.freeze_layers``).
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import IterateAverage, IterateMoments, mc_predict

    recipe = dataclasses.replace(train_recipes.RECIPES[method], accountant="pld", learning_rate=learning_rate)
    if epochs is not None:
        recipe.epochs = epochs
    if sample_rate is not None:
        recipe.sample_rate = sample_rate
    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    x, x_test = (x - 0.5).astype("float32"), (x_test - 0.5).astype("float32")
    n = len(x)
    batch_size = int(round(recipe.sample_rate * n))
    model = train_recipes.build_model(method, (64,), 10, n, recipe.hidden, seed, kl_weight=recipe.kl_weight)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if copies:
        augment = tfdpbnn.layers.AugmentationCopies(copies, offset=-0.5)  # the inputs are centred
        model = tf.keras.Sequential([tf.keras.Input((64,)), augment] + model.layers)
        loss = tfdpbnn.layers.CopiesSparseCategoricalCrossentropy(from_logits=True)
    if weights is not None:
        model.set_weights(weights)
    if trainable_last is not None:
        tfdpbnn.public.freeze_layers(model, trainable_last)
    optimizer = train_recipes.build_optimizer(method, recipe, epsilon, DELTA, n, batch_size)
    model.compile(optimizer=optimizer, loss=loss)
    steps = int(math.ceil(n / batch_size))
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n, steps_per_epoch=steps,
                                           secret_seed=10_000 + seed)
    tf.random.set_seed(20_000 + seed)
    average = IterateAverage(ema_decay, swap_at_end=False)
    former = IterateAverage(0.9, swap_at_end=False)  # the decay of the recipe before the public choice
    moments = IterateMoments(burn_in=steps * recipe.epochs // 2, thinning=2, max_iterates=30)
    model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=[average, former, moments])
    epsilon_spent = float(optimizer.privacy_statement()["epsilon"])
    samples = recipe.mc_samples if method in train_recipes.STOCHASTIC else 1

    def mc(inputs):
        return np.asarray(mc_predict(model, inputs, num_samples=samples, from_logits=True).mean)

    ood = ood_sets(x_test)
    rows = {"last iterate": scores(mc, x_test, y_test, ood)}
    gaussian = moments.sample(30, seed=seed)
    rows["iterate gaussian"] = scores(lambda v: np.asarray(mc_predict(
        model, v, weight_snapshots=gaussian, from_logits=True).mean), x_test, y_test, ood)
    ensemble = moments.iterates
    rows["iterate ensemble"] = scores(lambda v: np.asarray(mc_predict(
        model, v, weight_snapshots=ensemble, from_logits=True).mean), x_test, y_test, ood)
    former.swap_in()
    rows["ema 0.9"] = scores(mc, x_test, y_test, ood)
    average.swap_in()
    rows["recipe"] = scores(mc, x_test, y_test, ood)
    if temperature_draws:
        rows["recipe"].update(private_temperature_draws(mc(x), y, mc(x_test), y_test, epsilon))
    if float(optimizer.privacy_statement()["epsilon"]) != epsilon_spent:  # post-processing: unchanged
        raise AssertionError("the statement's epsilon changed after post-processing")
    common = {"method": method, "target_epsilon": epsilon, "seed": seed, "learning_rate": learning_rate,
              "epsilon": epsilon_spent, "noise_multiplier": float(optimizer.noise_multiplier),
              "steps": int(optimizer.steps), "batch_size": batch_size}
    return [dict(common, arm=arm, **values) for arm, values in rows.items()]


TEMPERATURE_DRAWS = 100


def private_temperature_draws(train_probs, y, test_probs, y_test, epsilon, share=0.2):
    """Test ECE after a private temperature fit on the training records, over ``TEMPERATURE_DRAWS`` draws.

    What calibrating would do (``fit_temperature_private``, 4 steps, at ``share`` of epsilon; under sequential
    composition the training noise would also grow, which is ignored here, in the temperature's favour).
    Measured, not used: the recipe applies no temperature.
    """
    import tfdpbnn

    eces = []
    for draw in range(TEMPERATURE_DRAWS):
        fit = tfdpbnn.uncertainty.fit_temperature_private(train_probs, y, share * epsilon, DELTA, steps=4,
                                                          accountant="pld", seed=draw)
        eces.append(tfdpbnn.uncertainty.expected_calibration_error(fit.apply(test_probs), y_test))
    eces = np.array(eces)
    return {"ece_private_temperature_mean": float(eces.mean()),
            "ece_private_temperature_std": float(eces.std())}


def select_rate(method, epsilon, normalization=None):
    """The learning rate the public data choose for training from scratch at ``epsilon`` (no privacy cost)."""
    from tfdpbnn.commands import train_recipes

    recipe = dataclasses.replace(train_recipes.RECIPES[method], accountant="pld")
    return train_recipes.public_fine_tuning_rate(
        method, recipe, epsilon, DELTA, normalization=normalization or train_recipes.PUBLIC_NORMALIZATION)


def pretrained_weights(method, seed, normalization):
    """The network of ``seed`` pretrained on MNIST-5k with ``normalization``, and its DIGITS test accuracy.

    The accuracy (before any private step) is for the research notes only: nothing is chosen by it.
    """
    import tfdpbnn
    from tfdpbnn.commands import train_recipes

    model = train_recipes.build_model(method, (64,), 10, 1437, 64, seed, kl_weight=0.03)
    train_recipes.pretrain_on_public(model, "mnist5k", seed, normalization=normalization)
    _, (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    logits = np.asarray(model(x_test - 0.5, training=False))
    return model.get_weights(), float(np.mean(logits.argmax(1) == y_test))


def pretrained_table(method, seeds) -> str:
    """Markdown: DIGITS test accuracy of the network pretrained on MNIST-5k per normalization (notes only)."""
    lines = ["| normalization | seeds | DIGITS test accuracy before any private step | per seed |",
             "| --- | --- | --- | --- |"]
    for normalization in ("aspect", "nist"):
        accuracies = [pretrained_weights(method, seed, normalization)[1] for seed in seeds]
        lines.append(f"| {normalization} | {len(seeds)} | {np.mean(accuracies):.3f} ± "
                     f"{np.std(accuracies):.3f} | {', '.join(f'{a:.3f}' for a in accuracies)} |")
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def table(rows, method) -> str:
    """Markdown: mean ± std over seeds of every arm and epsilon."""
    lines = ["| epsilon | arm | seeds | accuracy | ECE | NLL | AUROC noise | AUROC inverted "
             "| epsilon spent |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for epsilon in dict.fromkeys(r["target_epsilon"] for r in rows):
        for arm in ARMS + tuple(dict.fromkeys(r["arm"] for r in rows if r["arm"] not in ARMS)):
            group = [r for r in rows if r["arm"] == arm and r["target_epsilon"] == epsilon
                     and r["method"] == method]
            if not group:
                continue

            def cell(key, group=group):
                v = np.array([r[key] for r in group])
                return f"{v.mean():.3f} ± {v.std():.3f}"

            lines.append(f"| {epsilon:g} | {arm} | {len(group)} | {cell('accuracy')} | {cell('ece')} | "
                         f"{cell('nll')} | {cell('auroc_noise')} | {cell('auroc_inverted')} | "
                         f"{max(r['epsilon'] for r in group):.3f} |")
    text = "\n".join(lines) + "\n"
    recipe = [r for r in rows if r["arm"] == "recipe" and "ece_private_temperature_mean" in r]
    if recipe:
        text += ("\n| epsilon | seed | raw ECE | ECE after a private temperature (mean ± std over "
                 f"{TEMPERATURE_DRAWS} noise draws) |\n| --- | --- | --- | --- |\n")
        text += "".join(f"| {r['target_epsilon']:g} | {r['seed']} | {r['ece']:.3f} | "
                        f"{r['ece_private_temperature_mean']:.3f} ± "
                        f"{r['ece_private_temperature_std']:.3f} |\n"
                        for r in recipe)
    return text


def accountant_table(epsilons, n=1437) -> str:
    """Markdown: what the accountant favours, from the budget alone (no data).

    PLD-calibrated sigma for T steps at sample rate q, the noise std on the mean gradient sigma / B (B = q n,
    C = 1), and sqrt(T) B / sigma, the whole run's signal-to-noise (T steps of signal against noise growing
    as sqrt(T)).
    """
    from tfdpbnn import privacy

    lines = ["| epsilon | steps T | q | sigma | sigma / B | sqrt(T) B / sigma |",
             "| --- | --- | --- | --- | --- | --- |"]
    for epsilon in epsilons:
        for steps in (60, 120, 240):
            for q in (0.1, 0.2, 0.5, 0.8):
                sigma = privacy.calibrate_noise(epsilon, DELTA, q, steps, "pld")
                lines.append(f"| {epsilon:g} | {steps} | {q:g} | {sigma:.2f} | {sigma / (q * n):.4f} | "
                             f"{math.sqrt(steps) * q * n / sigma:.0f} |")
    return "\n".join(lines) + "\n"


def mnist5k_sets(seeds, epsilon=1.0, draws=100) -> list:
    """Private 90% prediction sets where the size allows: MNIST-5k as the private data.

    1,000 images (a public permutation) are the test set; of the other 4,000, ``split_by_record`` holds out
    about 30% (about 1,200, above ``CalibrationPlan().min_calibration_size``) for a private temperature and
    a private conformal threshold (parallel composition, ``CalibrationPlan()``), the rest train the DPVD
    recipe from scratch (lr 1, q 0.2, 20 epochs, PLD, EMA 0.9). Coverage and mean set size on the test set,
    averaged over ``draws`` noise draws of the two calibration releases.
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import CalibrationPlan, IterateAverage, coverage_and_size, mc_predict

    x_all, y_all = tfdpbnn.data.load_mnist5k_as_digits()
    x_all = (x_all - 0.5).astype("float32")
    plan, rows = CalibrationPlan(), []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(len(x_all))
        test, rest = order[:1000], order[1000:]
        held = tfdpbnn.uncertainty.split_by_record([x_all[rest], y_all[rest]], 0.3, key=seed)
        x, y = x_all[rest][~held], y_all[rest][~held]
        x_cal, y_cal = x_all[rest][held], y_all[rest][held]
        needed = plan.min_calibration_size(epsilon, DELTA, "pld")
        recipe = dataclasses.replace(train_recipes.RECIPES["dpvd"], accountant="pld")
        n = len(x)
        batch_size = int(round(recipe.sample_rate * n))
        model = train_recipes.build_model("dpvd", (64,), 10, n, recipe.hidden, seed,
                                          kl_weight=recipe.kl_weight)
        optimizer = train_recipes.build_optimizer("dpvd", recipe, epsilon, DELTA, n, batch_size)
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n,
                                               steps_per_epoch=int(math.ceil(n / batch_size)),
                                               secret_seed=10_000 + seed)
        tf.random.set_seed(20_000 + seed)
        model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=[IterateAverage(0.9)])
        cal = np.asarray(mc_predict(model, x_cal, num_samples=30, from_logits=True).mean)
        probs = np.asarray(mc_predict(model, x_all[test], num_samples=30, from_logits=True).mean)
        coverage, size, temperatures = [], [], []
        for draw in range(draws):
            temperature, threshold = plan.fit(cal, y_cal, epsilon, DELTA, "pld", seeds=(draw, 10_000 + draw))
            c, m = coverage_and_size(threshold.predict_sets(temperature.apply(probs)), y_all[test])
            coverage.append(c)
            size.append(m)
            temperatures.append(temperature.temperature)
        row = {"seed": seed, "epsilon": epsilon, "train": n, "held_out": int(held.sum()), "needed": needed,
               "accuracy": float(np.mean(probs.argmax(1) == y_all[test])),
               "coverage": float(np.mean(coverage)),
               "coverage_std": float(np.std(coverage)), "set_size": float(np.mean(size)),
               "set_size_std": float(np.std(size)), "temperature_median": float(np.median(temperatures)),
               "training_epsilon": float(optimizer.privacy_statement()["epsilon"])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


#: Post-processing candidates for the demo's calibration, compared on public data only
#: (``public_calibration``): (name, EMA decay or None for the last iterate or the iterate ensemble, whether a
#: temperature fitted on the public images is applied).
CALIBRATION_CANDIDATES = (("ema 0.9", 0.9, False), ("ema 0.9 + public temperature", 0.9, True),
                          ("ema 0.95", 0.95, False), ("ema 0.95 + public temperature", 0.95, True),
                          ("last iterate", None, False), ("iterate ensemble", None, False))


def public_calibration(seeds, epsilon=1.0, learning_rate=1.0) -> list:
    """The demo's recipe simulated on public data only, to choose its calibration post-processing.

    Per seed, a public permutation of MNIST-5k (NIST normalization, centred) gives 3,000 pretraining images
    (the stand-in of the demo's 5,000 public images), 1,437 stand-ins of DIGITS' private training records,
    and 563 public validation images. The DPVD network is pretrained on the first part as the demo does
    (``pretrain_arrays``), fine-tuned with DP on the second (the demo's q, steps, C, PLD noise for
    ``epsilon``; ``learning_rate``: the rate the public data choose at epsilon 1, "best-recipe"), and each of
    ``CALIBRATION_CANDIDATES`` is scored on the validation part: the EMA decay, the last iterate, the
    ensemble of the second half's iterates, and a temperature fitted without privacy on the pretraining
    images after fine-tuning (``fit_temperature``; what the demo would fit on its 5,000 public images).
    Reads no DIGITS record: choosing by it costs no privacy. The rule, fixed before the run: the demo takes
    the candidate with the lowest mean ECE over the seeds at epsilon 1 if it is at least 0.003 below the
    current recipe's (``ema 0.9``) and its mean accuracy is at most 0.005 below; else it keeps ``ema 0.9``.
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import IterateAverage, IterateMoments, fit_temperature, mc_predict

    x_all, y_all = tfdpbnn.data.load_mnist5k_as_digits(normalization=train_recipes.PUBLIC_NORMALIZATION)
    x_all = (x_all - 0.5).astype("float32")
    recipe = dataclasses.replace(train_recipes.RECIPES["dpvd"], accountant="pld", learning_rate=learning_rate)
    rows = []
    for seed in seeds:
        order = np.random.default_rng(50_000 + seed).permutation(len(x_all))
        pre, private, validation = order[:3000], order[3000:4437], order[4437:]
        x, y = x_all[private], y_all[private]
        n = len(x)
        batch_size = int(round(recipe.sample_rate * n))
        steps = int(math.ceil(n / batch_size))
        model = train_recipes.build_model("dpvd", (64,), 10, n, recipe.hidden, seed,
                                          kl_weight=recipe.kl_weight)
        train_recipes.pretrain_arrays(model, x_all[pre], y_all[pre], seed, train_recipes.PublicPretraining())
        optimizer = train_recipes.build_optimizer("dpvd", recipe, epsilon, DELTA, n, batch_size)
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n, steps_per_epoch=steps,
                                               secret_seed=60_000 + seed)
        tf.random.set_seed(70_000 + seed)
        averages = {decay: IterateAverage(decay, swap_at_end=False) for decay in (0.9, 0.95)}
        moments = IterateMoments(burn_in=steps * recipe.epochs // 2, thinning=2, max_iterates=30)
        model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=[*averages.values(), moments])

        def mc(inputs, model=model):
            return np.asarray(mc_predict(model, inputs, num_samples=recipe.mc_samples, from_logits=True).mean)

        predictions = {"last iterate": mc(x_all[validation]),
                       "iterate ensemble": np.asarray(mc_predict(model, x_all[validation],
                                                                 weight_snapshots=moments.iterates,
                                                                 from_logits=True).mean)}
        temperatures = {}
        for decay, average in averages.items():
            average.swap_in()
            predictions[f"ema {decay:g}"] = mc(x_all[validation])
            temperatures[decay] = fit_temperature(mc(x_all[pre]), y_all[pre])
        for name, decay, temperature in CALIBRATION_CANDIDATES:
            p = temperatures[decay].apply(predictions[f"ema {decay:g}"]) if temperature else predictions[name]
            row = {"seed": seed, "epsilon": epsilon, "candidate": name,
                   "accuracy": float(np.mean(p.argmax(1) == y_all[validation])),
                   "ece": float(tfdpbnn.uncertainty.expected_calibration_error(p, y_all[validation])),
                   "nll": float(-np.mean(np.log(np.clip(p[np.arange(len(p)), y_all[validation]], 1e-12, 1)))),
                   "temperature": temperatures[decay].temperature if temperature else 1.0}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def calibration_table(rows) -> str:
    """Markdown: mean ± std over seeds of each calibration candidate on the public validation images."""
    lines = ["| candidate | seeds | accuracy | ECE | NLL | temperature |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, _, _ in CALIBRATION_CANDIDATES:
        group = [r for r in rows if r["candidate"] == name]
        cells = [f"{np.mean([r[k] for r in group]):.3f} ± {np.std([r[k] for r in group]):.3f}"
                 for k in ("accuracy", "ece", "nll", "temperature")]
        lines.append(f"| {name} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


DEMO = ["train", "--method", "dpvd", "--dataset", "digits", "--accountant", "pld", "--verbose", "0",
        "--public", "mnist5k", "--ema", str(EMA_DECAY)]  # ./scripts/demo's command, less --epsilon and --seed


def run_demo_command(seeds, epsilons, out, rescore=False) -> list:
    """``./scripts/demo``'s command per seed and epsilon, scored through its SavedModel fed raw DIGITS.

    Each run draws its own batches (the runs in docs/results.md shared the key file's, as the command then
    did); the export applies the centring itself.
    ``rescore``: score the SavedModels of earlier runs in ``out`` instead of training again.
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn import cli

    rows = []
    for epsilon in epsilons:
        for seed in seeds:
            _, (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)  # --seed also draws the test split
            ood = {name: v + 0.5 for name, v in ood_sets(x_test - 0.5).items()}  # raw: the export centres
            directory = os.path.join(out, f"demo-eps{epsilon:g}-seed{seed}")
            if rescore and os.path.exists(os.path.join(directory, "summary.json")):
                pass  # score the SavedModel already written
            elif cli.main(DEMO + ["--epsilon", str(epsilon), "--seed", str(seed), "--out", directory]):
                raise RuntimeError(f"tfdpbnn train failed for seed {seed}, epsilon {epsilon}")
            with open(os.path.join(directory, "summary.json")) as handle:
                summary = json.load(handle)
            signature = tf.saved_model.load(os.path.join(directory, "saved_model")).signatures["mc_predict"]

            def served(inputs, signature=signature):
                out = signature(x=tf.constant(inputs, tf.float32), num_samples=tf.constant(30))
                return out["mean"].numpy()

            row = {"target_epsilon": epsilon, "seed": seed, "printed_accuracy": summary["test_accuracy"],
                   "printed_ece": summary["ece"], "epsilon": summary["epsilon"],
                   "learning_rate": summary["recipe"]["learning_rate"]}
            row.update(scores(served, x_test, y_test, ood))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def demo_table(rows) -> str:
    """Markdown: the demo's printed accuracy and ECE, and NLL / AUROC of its SavedModel, per epsilon."""
    lines = ["| epsilon | seeds | learning rate (public) | accuracy (printed) | ECE (printed) "
             "| NLL (SavedModel) | AUROC noise | AUROC inverted | epsilon (PLD) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for epsilon in dict.fromkeys(r["target_epsilon"] for r in rows):
        group = [r for r in rows if r["target_epsilon"] == epsilon]

        def cell(key, group=group):
            v = np.array([r[key] for r in group])
            return f"{v.mean():.3f} ± {v.std():.3f}"

        lines.append(f"| {epsilon:g} | {len(group)} | {sorted({r['learning_rate'] for r in group})} | "
                     f"{cell('printed_accuracy')} | {cell('printed_ece')} | {cell('nll')} | "
                     f"{cell('auroc_noise')} | {cell('auroc_inverted')} | "
                     f"{max(r['epsilon'] for r in group):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Run the recipe and its ablation arms for the given seeds and epsilons; write results.json, table.md."""
    from experiments.runner import paired_arms_without_ledger

    paired_arms_without_ledger()  # its arms share one sampling key per seed
    from tfdpbnn.commands import train_recipes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 0.3])
    parser.add_argument("--method", default="dpvd", choices=("dpvd", "dpsgd"))
    parser.add_argument("--no-scratch", action="store_true", help="skip the no-pretraining arm")
    parser.add_argument("--no-aspect", action="store_true",
                        help="skip the arm pretrained on MNIST-5k normalized with the aspect ratio kept")
    parser.add_argument("--last-layer", action="store_true",
                        help="also fine-tune only the pretrained network's last layer (arm 'last layer')")
    parser.add_argument("--copies", type=int, nargs="+", default=[],
                        help="also run the recipe with augmentation multiplicity K (arm 'copies K')")
    parser.add_argument("--no-temperature-draws", action="store_true",
                        help="skip the private temperature's 100 noise draws per run (a measurement only)")
    parser.add_argument("--rates", type=float, nargs="+", default=None,
                        help="the fine-tuning rates the public data chose, one per epsilon, as printed by an "
                             "earlier run (skips the public selection, which reads no private data)")
    parser.add_argument("--out", default=os.path.join("runs", "best_recipe"))
    parser.add_argument("--render-only", action="store_true", help="only rewrite table.md from results.json")
    parser.add_argument("--demo-command", action="store_true",
                        help="run ./scripts/demo's command per seed and epsilon instead (demo.json, demo.md)")
    parser.add_argument("--rescore", action="store_true",
                        help="with --demo-command: score the SavedModels already in --out, do not train")
    parser.add_argument("--mnist5k-sets", action="store_true",
                        help="private 90%% sets with MNIST-5k as the private data (mnist5k_sets.json)")
    parser.add_argument("--public-calibration", action="store_true",
                        help="only the calibration candidates on public data (public_calibration.json/.md)")
    parser.add_argument("--pretrained-table", action="store_true",
                        help="only the pretrained network's DIGITS accuracy, per normalization")
    parser.add_argument("--accountant-table", action="store_true",
                        help="only print sigma against steps and sample rate (no training)")
    args = parser.parse_args(argv)
    if args.mnist5k_sets:
        os.makedirs(args.out, exist_ok=True)
        rows = mnist5k_sets(args.seeds, args.epsilons[0])
        with open(os.path.join(args.out, "mnist5k_sets.json"), "w") as handle:
            json.dump({"rows": rows, "machine": platform.platform()}, handle, indent=1)
        return 0
    if args.public_calibration:
        os.makedirs(args.out, exist_ok=True)
        start = time.time()
        rows = public_calibration(args.seeds, args.epsilons[0])
        text = calibration_table(rows)
        with open(os.path.join(args.out, "public_calibration.json"), "w") as handle:
            json.dump({"rows": rows, "machine": platform.platform(), "wall_seconds": time.time() - start},
                      handle, indent=1)
        with open(os.path.join(args.out, "public_calibration.md"), "w") as handle:
            handle.write(text)
        print(text)
        return 0
    if args.accountant_table:
        print(accountant_table(args.epsilons))
        return 0
    if args.pretrained_table:
        os.makedirs(args.out, exist_ok=True)
        text = pretrained_table(args.method, args.seeds)
        with open(os.path.join(args.out, "pretrained.md"), "w") as handle:
            handle.write(text)
        print(text)
        return 0
    if args.demo_command:
        os.makedirs(args.out, exist_ok=True)
        rows = run_demo_command(args.seeds, args.epsilons, args.out, args.rescore)
        text = demo_table(rows)
        with open(os.path.join(args.out, "demo.json"), "w") as handle:
            json.dump({"rows": rows, "machine": platform.platform()}, handle, indent=1)
        with open(os.path.join(args.out, "demo.md"), "w") as handle:
            handle.write(text)
        print(text)
        return 0
    if args.render_only:
        with open(os.path.join(args.out, "results.json")) as handle:
            text = table(json.load(handle)["rows"], args.method)
        with open(os.path.join(args.out, "table.md"), "w") as handle:
            handle.write(text)
        print(text)
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows, start = [], time.time()
    rates, aspect_rates, pretrained = {}, {}, []
    if args.rates is not None and len(args.rates) != len(args.epsilons):
        parser.error(f"--rates needs one rate per epsilon ({len(args.epsilons)}), got {len(args.rates)}")
    for i, epsilon in enumerate(args.epsilons):  # on public data only, once per epsilon
        rates[epsilon] = (select_rate(args.method, epsilon) if args.rates is None
                          else {"learning_rate": args.rates[i], "given": True})
        print("chosen on public data:", epsilon, rates[epsilon], flush=True)
        if not args.no_aspect:
            aspect_rates[epsilon] = select_rate(args.method, epsilon, "aspect")
            print("chosen on public data (aspect):", epsilon, aspect_rates[epsilon], flush=True)
    for seed in args.seeds:
        weights, accuracy = pretrained_weights(args.method, seed, train_recipes.PUBLIC_NORMALIZATION)
        pretrained.append({"seed": seed, "normalization": train_recipes.PUBLIC_NORMALIZATION,
                           "digits_test_accuracy": accuracy})
        if not args.no_aspect:
            aspect_weights, accuracy = pretrained_weights(args.method, seed, "aspect")
            pretrained.append({"seed": seed, "normalization": "aspect", "digits_test_accuracy": accuracy})
        print(json.dumps([p for p in pretrained if p["seed"] == seed]), flush=True)
        for epsilon in args.epsilons:
            before = len(rows)
            rate = rates[epsilon]["learning_rate"]
            draws = not args.no_temperature_draws
            rows += run_one(args.method, epsilon, seed, rate, weights, temperature_draws=draws)
            if not args.no_scratch:
                scratch_rate = train_recipes.RECIPES[args.method].learning_rate
                scratch = run_one(args.method, epsilon, seed, scratch_rate, None, temperature_draws=draws)
                rows += [dict(r, arm="no pretraining") for r in scratch if r["arm"] == "recipe"]
            if not args.no_aspect:
                aspect = run_one(args.method, epsilon, seed, aspect_rates[epsilon]["learning_rate"],
                                 aspect_weights)
                rows += [dict(r, arm="aspect public data") for r in aspect if r["arm"] == "recipe"]
            if args.last_layer:
                head = run_one(args.method, epsilon, seed, rate, weights, trainable_last=1,
                               temperature_draws=draws)
                rows += [dict(r, arm="last layer") for r in head if r["arm"] == "recipe"]
            for k in args.copies:
                augmented = run_one(args.method, epsilon, seed, rate, weights, copies=k,
                                    temperature_draws=draws)
                rows += [dict(r, arm=f"copies {k}") for r in augmented if r["arm"] == "recipe"]
            for r in rows[before:]:
                print(json.dumps(r), flush=True)
            with open(os.path.join(args.out, "results.json"), "w") as handle:
                json.dump({"rows": rows, "rates": {str(k): v for k, v in rates.items()},
                           "aspect_rates": {str(k): v for k, v in aspect_rates.items()},
                           "pretrained": pretrained,
                           "wall_seconds": time.time() - start, "machine": platform.platform(),
                           "cpus": os.cpu_count()}, handle, indent=1)
    text = table(rows, args.method)
    with open(os.path.join(args.out, "table.md"), "w") as handle:
        handle.write(text)
    print(text)
    print(f"wall time {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
