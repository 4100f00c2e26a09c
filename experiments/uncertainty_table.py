"""The uncertainty table: every method x epsilon x public data, calibrated inside the stated epsilon.

For each seed, method (the recipes of ``tfdpbnn train``: dpsgd, dpvd, dpd, dpbbp, dpsgld, dpmcdropout; Poisson
q = 0.2, 20 epochs, clip 1), epsilon (0.3, 1, 4; delta 1e-5) and arm (``none``: no public data;
``mnist5k``: what ``tfdpbnn train --public mnist5k`` runs, non-private pretraining on the 5,000 public
MNIST images in DIGITS' format, then private fine-tuning at the learning rate chosen on public data), on
DIGITS:

- DIGITS' training split (1437 images) is split record by record (``split_by_record``, key 50000 + seed)
  into a training part (about 75%) and a private calibration part (about 25%); both are private.
- Everything private is inside the stated epsilon E (PLD, delta 1e-5), as ``tfdpbnn.uncertainty.
  CalibrationPlan`` shares it. ``--composition parallel`` (default): training gets E on its part, and the
  temperature (``fit_temperature_private``, 4 noisy bisection steps) and the 90% split-conformal threshold
  (``private_conformal_threshold``, 4 steps, gamma 0.3) together get E on the calibration part (parallel
  composition over disjoint records, McSherry 2009). ``--composition sequential``: the releases get 0.2 E
  and 0.5 E and the training noise the rest of E by composition
  (``tfdpbnn.privacy.calibrate_noise(other_events=...)``). The statement's epsilon (``total_epsilon``)
  covers all of it. Nothing is tuned on DIGITS.
- Reported on DIGITS' 360 test images: accuracy, ECE (15 bins) before and after the temperature, NLL, Brier
  score, the AUROC of predictive entropy against three out-of-distribution sets (uniform noise, inverted
  digits, digits rotated 180 degrees) and the prediction sets' coverage and mean size.
- Reference row ``sgd``: the same network (64 tanh units) without privacy (Adam, 20 epochs, batch 64), its
  temperature and threshold fit without noise on the calibration part.

Run: ``nice python experiments/uncertainty_table.py --seeds 0 1 2 3 4`` (writes results.json and
table.md under ``--out``, default docs/results/uncertainty_table; rows are appended as they finish, and a
rerun skips the rows already there).

``--recipe current`` (``run_recipe``; default out docs/results/uncertainty_table_recipe) runs instead the
current recipe: every training record trains, public MNIST-5k pretraining, the moving average of the
iterates, DP-SGD's free iterate ensemble, and the never-worse private temperature
(``fit_temperature_private(null_zone=2)``) fit on the training records at 0.2 of epsilon, composed
sequentially, measured over ``--draws`` noise draws per run. ``--zones 0 2 3 4`` compares null zones on
the probabilities it saved (``--probs-dir``), without training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

METHODS = ("dpsgd", "dpvd", "dpd", "dpbbp", "dpsgld", "dpmcdropout")
EPSILONS = (0.3, 1.0, 4.0)
ARMS = ("none", "mnist5k")
DELTA = 1e-5
CALIBRATION_FRACTION = 0.25


def _data(seed):
    """DIGITS centred: (training part, private calibration part, test); the parts split record by record."""
    import tfdpbnn
    from tfdpbnn.uncertainty import split_by_record

    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    x, x_test = x - 0.5, x_test - 0.5
    held = split_by_record([x, y], CALIBRATION_FRACTION, key=50_000 + seed)
    return (x[~held], y[~held]), (x[held], y[held]), (x_test, y_test)


def ood_sets(x_test, seed):
    """Uniform noise, inverted digits and digits rotated 180 degrees, centred like the inputs."""
    rng = np.random.default_rng(60_000 + seed)
    return {"noise": rng.uniform(-0.5, 0.5, size=x_test.shape).astype("float32"),
            "inverted": np.ascontiguousarray(-x_test),
            "rot180": np.ascontiguousarray(x_test.reshape(-1, 8, 8)[:, ::-1, ::-1].reshape(len(x_test), 64))}


#: the fine-tuning rate these tables ran with (chosen on public data by simulating the fine-tuning itself;
#: ``train_recipes.public_fine_tuning_rate`` now chooses it from scratch, docs/results.md)
PUBLIC_RATE = 0.03


def _model_and_optimizer(method, epsilon, n, seed, public, plan):
    """The recipe's model (pretrained on MNIST-5k if ``public``) and DP optimizer (room for calibration)."""
    import tensorflow as tf

    from tfdpbnn.commands import train_recipes

    recipe = train_recipes.RECIPES[method]
    if public:
        recipe = dataclasses.replace(recipe, learning_rate=PUBLIC_RATE)
    model = train_recipes.build_model(method, (64,), 10, n, recipe.hidden, seed, kl_weight=recipe.kl_weight)
    if public:
        train_recipes.pretrain_on_public(model, "mnist5k", seed)
    batch_size = int(round(recipe.sample_rate * n))
    recipe = dataclasses.replace(recipe, accountant="pld")
    events = plan.training_events(epsilon, DELTA, "pld")
    optimizer = train_recipes.build_optimizer(method, recipe, epsilon, DELTA, n, batch_size,
                                              other_events=events)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, optimizer, recipe, batch_size / n, int(np.ceil(n / batch_size))


def _probs(model, x, method):
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import mc_predict

    samples = train_recipes.RECIPES[method].mc_samples if method in train_recipes.STOCHASTIC else 1
    return np.asarray(mc_predict(model, x, num_samples=samples, from_logits=True).mean, dtype=np.float64)


def _scores(probs_test, labels, calibrated_test, sets, ood_probs):
    """Every column of the table from the test probabilities (raw and calibrated) and the OOD ones."""
    from experiments.honest_common import auroc, entropy
    from tfdpbnn.uncertainty import coverage_and_size, expected_calibration_error

    n = len(labels)
    onehot = np.eye(probs_test.shape[1])[labels]
    coverage, size = coverage_and_size(sets, labels)
    row = {"accuracy": float(np.mean(calibrated_test.argmax(1) == labels)),
           "ece": float(expected_calibration_error(probs_test, labels)),
           "ece_calibrated": float(expected_calibration_error(calibrated_test, labels)),
           "nll": float(-np.mean(np.log(np.clip(calibrated_test[np.arange(n), labels], 1e-12, None)))),
           "brier": float(np.mean(np.sum((calibrated_test - onehot) ** 2, axis=1))),
           "coverage": float(coverage), "set_size": float(size)}
    h_in = entropy(calibrated_test)
    for name, p in ood_probs.items():
        row[f"auroc_{name}"] = auroc(h_in, entropy(p))
    return row


def run_private(method, epsilon, arm, seed, composition="parallel", null_zone=None) -> dict:
    """One private row: train, calibrate privately, score; the statement's epsilon covers all of it.

    ``null_zone``: the private temperature's null zone (``CalibrationPlan(temperature_null_zone=...)``).
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.uncertainty import CalibrationPlan

    start = time.perf_counter()
    tf.keras.backend.clear_session()
    (x, y), (x_cal, y_cal), (x_test, y_test) = _data(seed)
    plan = CalibrationPlan(composition=composition, temperature_null_zone=null_zone)
    model, optimizer, recipe, q, steps_per_epoch = _model_and_optimizer(method, epsilon, len(x), seed,
                                                                        arm == "mnist5k", plan)
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=q, steps_per_epoch=steps_per_epoch,
                                           secret_seed=70_000 + seed)
    tf.random.set_seed(80_000 + seed)
    model.fit(batches, epochs=recipe.epochs, verbose=0)
    cal = _probs(model, x_cal, method)
    # Both reserved, then recorded, on the held-out records ("parallel" is checked on them); the table
    # measures the all-label sets too.
    temperature, threshold = plan.fit(cal, y_cal, epsilon, DELTA, "pld", seeds=(90_000 + seed, 91_000 + seed),
                                      allow_uninformative=True, optimizer=optimizer, x=x_cal, y=y_cal)
    test = _probs(model, x_test, method)
    calibrated = temperature.apply(test)
    ood = {name: temperature.apply(_probs(model, xo, method)) for name, xo in ood_sets(x_test, seed).items()}
    row = _scores(test, y_test, calibrated, threshold.predict_sets(calibrated), ood)
    statement = optimizer.privacy_statement()
    row.update({"method": method, "epsilon": epsilon, "arm": arm, "seed": seed,
                "noise_multiplier": float(optimizer.noise_multiplier),
                "composition": composition, "temperature_null_zone": null_zone,
                "training_epsilon": float(statement["training_epsilon"]),
                "temperature": float(temperature.temperature), "threshold": float(threshold.threshold),
                "temperature_epsilon": float(temperature.privacy.epsilon),
                "conformal_epsilon": float(threshold.privacy.epsilon),
                "total_epsilon": float(statement["epsilon"]),
                "seconds": time.perf_counter() - start})
    return row


def run_reference(arm, seed) -> dict:
    """The same network without privacy (Adam, 20 epochs, batch 64); temperature, threshold without noise."""
    import tensorflow as tf

    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import CalibrationPlan, conformal_threshold, fit_temperature

    start = time.perf_counter()
    tf.keras.backend.clear_session()
    (x, y), (x_cal, y_cal), (x_test, y_test) = _data(seed)
    model = train_recipes.build_model("dpsgd", (64,), 10, len(x), 64, seed)
    if arm == "mnist5k":
        train_recipes.pretrain_on_public(model, "mnist5k", seed)
    train_recipes.pretrain_arrays(model, x, y, seed, train_recipes.PublicPretraining())
    cal = _probs(model, x_cal, "sgd")
    temperature = fit_temperature(cal, y_cal)
    threshold = conformal_threshold(temperature.apply(cal), y_cal, alpha=CalibrationPlan().alpha)
    test = _probs(model, x_test, "sgd")
    calibrated = temperature.apply(test)
    ood = {name: temperature.apply(_probs(model, xo, "sgd")) for name, xo in ood_sets(x_test, seed).items()}
    row = _scores(test, y_test, calibrated, threshold.predict_sets(calibrated), ood)
    row.update({"method": "sgd", "epsilon": float("inf"), "arm": arm, "seed": seed,
                "temperature": float(temperature.temperature), "total_epsilon": float("inf"),
                "seconds": time.perf_counter() - start})
    return row


# --- the current recipe (``--recipe current``) -----------------------------------------------------------
#: the five DP optimizers' recipes of ``tfdpbnn train`` the current-recipe table runs
RECIPE_METHODS = ("dpsgd", "dpvd", "dpbbp", "dpsgld", "dpmcdropout")
RECIPE_EPSILONS = (1.0, 0.3)
#: the private temperature's share of the stated epsilon (sequential composition on the training records),
#: its queries and null zone: ``CalibrationPlan``'s defaults and docs/uncertainty.md's rule, fixed beforehand
TEMPERATURE_SHARE, TEMPERATURE_STEPS, NULL_ZONE = 0.2, 4, 2.0
EMA_DECAY = 0.9


def _public_rate(method, recipe, epsilon, cache_path):
    """``public_fine_tuning_rate`` as ``tfdpbnn train --public mnist5k`` calls it (seed 0), cached on disk."""
    from tfdpbnn.commands.train_recipes import public_fine_tuning_rate

    key = f"{method}/{epsilon:g}/{recipe.sample_rate:.6f}"
    cache = {}
    if os.path.exists(cache_path):
        with open(cache_path) as f:
            cache = json.load(f)
    if key not in cache:
        cache[key] = public_fine_tuning_rate(method, recipe, epsilon, DELTA, "mnist5k")
        with open(cache_path, "w") as f:
            json.dump(cache, f, indent=1)
    return cache[key]["learning_rate"]


def _temperature_draws(train_probs, y, test_probs, y_test, epsilon, draws, seed, null_zone=NULL_ZONE,
                       share=TEMPERATURE_SHARE):
    """The never-worse temperature (null zone) fit on the training records, over ``draws`` noise draws.

    Returns (mean test ECE after, its std, mean test NLL after, draws kept at T = 1, the first draw's fit).
    """
    from tfdpbnn.uncertainty import expected_calibration_error, fit_temperature_private

    eces, nlls, kept, first = [], [], 0, None
    n = len(y_test)
    for draw in range(draws):
        fit = fit_temperature_private(train_probs, y, share * epsilon, DELTA,
                                      steps=TEMPERATURE_STEPS, accountant="pld",
                                      seed=90_000 + 1000 * seed + draw, null_zone=null_zone)
        first = first or fit
        calibrated = fit.apply(test_probs)
        eces.append(expected_calibration_error(calibrated, y_test))
        nlls.append(-np.mean(np.log(np.clip(calibrated[np.arange(n), y_test], 1e-12, None))))
        kept += fit.temperature == 1.0
    return float(np.mean(eces)), float(np.std(eces)), float(np.mean(nlls)), int(kept), first


def _recipe_scores(predict, x, y, x_test, y_test, epsilon, draws, seed, save=None, share=TEMPERATURE_SHARE):
    """Raw scores of one predictive (accuracy, ECE, NLL, Brier, AUROCs) and the calibration over draws.

    ``save``: an npz path for the training and test probabilities (other calibration rules can be
    compared on them without training again).
    """
    from experiments.honest_common import auroc, entropy
    from tfdpbnn.uncertainty import expected_calibration_error

    test = predict(x_test)
    n = len(y_test)
    row = {"accuracy": float(np.mean(test.argmax(1) == y_test)),
           "ece": float(expected_calibration_error(test, y_test)),
           "nll": float(-np.mean(np.log(np.clip(test[np.arange(n), y_test], 1e-12, None)))),
           "brier": float(np.mean(np.sum((test - np.eye(test.shape[1])[y_test]) ** 2, axis=1)))}
    h_in = entropy(test)
    for name, xo in ood_sets(x_test, seed).items():
        row[f"auroc_{name}"] = auroc(h_in, entropy(predict(xo)))
    if epsilon is not None:
        train = predict(x)
        if save:
            os.makedirs(os.path.dirname(save), exist_ok=True)
            np.savez(save, train=train, y=y, test=test, y_test=y_test)
        ece, ece_std, nll, kept, first = _temperature_draws(train, y, test, y_test, epsilon, draws, seed,
                                                            share=share)
        row.update({"ece_calibrated": ece, "ece_calibrated_std": ece_std, "nll_calibrated": nll,
                    "temperature_kept": kept, "draws": draws})
        # the plain private temperature (no null zone) on the same draws, for comparison
        row["ece_plain_temperature"] = _temperature_draws(train, y, test, y_test, epsilon, draws, seed,
                                                          None, share)[0]
        return row, first
    return row, None


def run_recipe(method, epsilon, seed, draws=100, pretrained=None, cache_path="runs/public_rates.json",
               probs_dir="runs/uncertainty_recipe_probs", held_out=0.0):
    """Rows of the current recipe: every training record trains, public MNIST-5k pretraining, EMA 0.9.

    What ``tfdpbnn train --method M --public mnist5k --ema 0.9 --accountant pld`` runs, in process: the
    fine-tuning rate chosen on public data (``public_fine_tuning_rate``), pretraining on public MNIST-5k,
    the DP run on all 1,437 of DIGITS' training records with the moving average of its iterates, and for
    DP-SGD also the free posterior (the ensemble of its last 30 second-half iterates, every 2nd;
    ``IterateMoments``). Calibration: ``fit_temperature_private(null_zone=2)`` on the training records at
    ``TEMPERATURE_SHARE`` of epsilon, composed sequentially (the training noise leaves room for it, so
    the statement's epsilon covers both); its test ECE over ``draws`` noise draws. ``pretrained``: a dict
    (method, seed) -> weights, reused across epsilons. Returns a list of rows.
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.callbacks import PosteriorSampler
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.record.private_release import gaussian_queries
    from tfdpbnn.uncertainty import IterateAverage, IterateMoments, mc_predict

    start = time.perf_counter()
    tf.keras.backend.clear_session()
    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    x, x_test = (x - 0.5).astype("float32"), (x_test - 0.5).astype("float32")
    n = len(x)
    recipe = dataclasses.replace(train_recipes.RECIPES[method], accountant="pld")
    batch_size = int(round(recipe.sample_rate * n))
    recipe = dataclasses.replace(recipe, sample_rate=batch_size / n)
    recipe.learning_rate = _public_rate(method, recipe, epsilon, cache_path)
    x_cal = y_cal = None
    if held_out:  # a held-out part for the temperature instead (parallel composition; the same rate)
        from tfdpbnn.uncertainty import split_by_record

        held = split_by_record([x, y], held_out, key=50_000 + seed)
        (x_cal, y_cal), (x, y) = (x[held], y[held]), (x[~held], y[~held])
        n = len(x)
        batch_size = int(round(train_recipes.RECIPES[method].sample_rate * n))
        recipe = dataclasses.replace(recipe, sample_rate=batch_size / n)
    model = train_recipes.build_model(method, (64,), 10, n, recipe.hidden, seed, kl_weight=recipe.kl_weight)
    key = (method, seed)
    if pretrained is not None and key in pretrained:
        model.set_weights(pretrained[key])
    else:
        train_recipes.pretrain_on_public(model, "mnist5k", seed)
        if pretrained is not None:
            pretrained[key] = model.get_weights()
    room = gaussian_queries(TEMPERATURE_SHARE * epsilon, DELTA, TEMPERATURE_STEPS,
                            "temperature_scaling_gaussian_bisection", "pld")[1].dp_event
    optimizer = train_recipes.build_optimizer(method, recipe, epsilon, DELTA, n, batch_size,
                                              other_events=[] if held_out else [room])
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps_per_epoch = int(np.ceil(n / batch_size))
    total = steps_per_epoch * recipe.epochs
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=recipe.sample_rate,
                                           steps_per_epoch=steps_per_epoch, secret_seed=70_000 + seed)
    callbacks = [IterateAverage(EMA_DECAY)]
    sampler = moments = None
    if method == "dpsgld":  # as tfdpbnn train: its posterior samples
        sampler = PosteriorSampler(burn_in=total // 2, thinning=max(1, total // 40), max_samples=20)
        callbacks.append(sampler)
    if method == "dpsgd":
        moments = IterateMoments(burn_in=total // 2, thinning=2, max_iterates=30)
        callbacks.append(moments)
    tf.random.set_seed(80_000 + seed)
    model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=callbacks)
    samples = recipe.mc_samples if method in train_recipes.STOCHASTIC else 1

    def predict(inputs, snapshots=None):
        if snapshots:
            return np.asarray(mc_predict(model, inputs, weight_snapshots=snapshots, from_logits=True).mean,
                              dtype=np.float64)
        return np.asarray(mc_predict(model, inputs, num_samples=samples, from_logits=True).mean,
                          dtype=np.float64)

    arms = [("recipe", lambda v: predict(v, sampler.samples if sampler is not None else None))]
    if moments is not None:
        ensemble = moments.iterates
        arms.append(("iterate ensemble", lambda v: predict(v, ensemble)))
    rows = []
    for arm, fn in arms:
        save = os.path.join(probs_dir, f"{method}-{arm.replace(' ', '_')}-eps{epsilon:g}-seed{seed}.npz")
        if held_out:  # the temperature on the held-out part at the whole epsilon (parallel composition)
            row, fit = _recipe_scores(fn, x_cal, y_cal, x_test, y_test, epsilon, draws, seed, None, 1.0)
            if arm == "recipe":
                optimizer.record_release(fit, "parallel", x=x_cal, y=y_cal,  # charged to the records it read
                                         asserted_disjoint="split_by_record held-out part")
        else:
            row, fit = _recipe_scores(fn, x, y, x_test, y_test, epsilon, draws, seed,
                                      save if probs_dir else None)
            if arm == "recipe":  # one draw recorded: the statement covers training and the temperature
                optimizer.record_release(fit, "sequential", x=x, y=y)  # fit on the training records
        statement = optimizer.privacy_statement()
        row.update({"method": method, "epsilon": epsilon, "arm": arm, "seed": seed, "held_out": held_out,
                    "train_records": n,
                    "learning_rate": float(recipe.learning_rate),
                    "noise_multiplier": float(optimizer.noise_multiplier),
                    "training_epsilon": float(statement["training_epsilon"]),
                    "total_epsilon": float(statement["epsilon"]),
                    "seconds": time.perf_counter() - start})
        rows.append(row)
    return rows


def run_recipe_reference(seed, draws=0) -> dict:
    """The 64-unit network without privacy (Adam), pretrained on MNIST-5k, then on all training records."""
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import fit_temperature, mc_predict

    start = time.perf_counter()
    tf.keras.backend.clear_session()
    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    x, x_test = (x - 0.5).astype("float32"), (x_test - 0.5).astype("float32")
    model = train_recipes.build_model("dpsgd", (64,), 10, len(x), 64, seed)
    train_recipes.pretrain_on_public(model, "mnist5k", seed)
    train_recipes.pretrain_arrays(model, x, y, seed, train_recipes.PublicPretraining())

    def predict(inputs):
        return np.asarray(mc_predict(model, inputs, num_samples=1, from_logits=True).mean, dtype=np.float64)

    row, _ = _recipe_scores(predict, x, y, x_test, y_test, None, 0, seed)
    from tfdpbnn.uncertainty import expected_calibration_error

    temperature = fit_temperature(predict(x), y)  # on the training records, without noise
    calibrated = temperature.apply(predict(x_test))
    row.update({"ece_calibrated": float(expected_calibration_error(calibrated, y_test)),
                "method": "sgd", "epsilon": float("inf"), "arm": "recipe", "seed": seed,
                "temperature": float(temperature.temperature), "total_epsilon": float("inf"),
                "seconds": time.perf_counter() - start})
    return row


RECIPE_COLUMNS = ("accuracy", "ece", "ece_calibrated", "ece_plain_temperature", "nll", "brier", "auroc_noise",
                  "auroc_inverted", "auroc_rot180")


def recipe_table(rows) -> str:
    """Markdown: mean (std over seeds) per method, epsilon and arm; calibrated ECE is the mean over draws."""
    groups = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"], r["arm"]), []).append(r)
    lines = ["| method | epsilon | predictive | seeds | accuracy | ECE | ECE, null-zone temperature | "
             "ECE, plain private temperature | NLL | Brier | AUROC noise | AUROC inverted | AUROC rot180 | "
             "T kept at 1 | epsilon spent |",
             "|" + " --- |" * 15]
    order = {m: i for i, m in enumerate((*RECIPE_METHODS, "sgd"))}
    for method, eps, arm in sorted(groups, key=lambda k: (-k[1] if k[1] != float("inf") else -1e9,
                                                           order[k[0]], k[2] != "recipe")):
        rs = groups[(method, eps, arm)]
        cells = []
        for c in RECIPE_COLUMNS:
            if c not in rs[0]:
                cells.append("-")
                continue
            v = np.array([r[c] for r in rs])
            cells.append(f"{v.mean():.3f} ({v.std():.3f})" if len(v) > 1 else f"{v.mean():.3f}")
        kept = (f"{sum(r['temperature_kept'] for r in rs)}/{sum(r['draws'] for r in rs)}"
                if "temperature_kept" in rs[0] else "-")
        spent = max(r["total_epsilon"] for r in rs)
        name = {"recipe": "the recipe's", "iterate ensemble": "iterate ensemble (free)"}.get(arm, arm)
        lines.append(f"| {method} | {'none' if eps == float('inf') else f'{eps:g}'} | {name} | {len(rs)} | "
                     + " | ".join(cells) + f" | {kept} | "
                     + ("-" if spent == float("inf") else f"{spent:.3f}") + " |")
    return "\n".join(lines)


def zone_analysis(probs_dir, zones, draws=100) -> str:
    """Markdown: mean test ECE after the private temperature for each null zone, on the saved probabilities.

    Reads the npz files ``run_recipe`` saved (training and test probabilities of every run); the same noise
    seeds as the table. A zone of 0 stands for no zone (the plain private temperature).
    """
    import glob

    from tfdpbnn.uncertainty import expected_calibration_error

    lines = ["| method | epsilon | predictive | runs | raw ECE | "
             + " | ".join("plain" if z == 0 else f"zone {z:g}" for z in zones)
             + " | runs worse than raw (per zone) |", "|" + " --- |" * (6 + len(zones))]
    groups = {}
    for path in sorted(glob.glob(os.path.join(probs_dir, "*.npz"))):
        method, arm, eps, _ = os.path.basename(path)[:-4].split("-")
        groups.setdefault((method, float(eps[3:]), arm), []).append(path)
    for (method, eps, arm), paths in sorted(groups.items(), key=lambda kv: (-kv[0][1], kv[0][0], kv[0][2])):
        raw, after = [], {z: [] for z in zones}
        for path in paths:
            d = np.load(path)
            seed = int(path.rsplit("seed", 1)[1][:-4])
            raw.append(expected_calibration_error(d["test"], d["y_test"]))
            for z in zones:
                after[z].append(_temperature_draws(d["train"], d["y"], d["test"], d["y_test"], eps, draws,
                                                   seed, z or None)[0])
        raw = np.array(raw)
        cells = [f"{np.mean(after[z]):.4f}" for z in zones]
        worse = [str(int(np.sum(np.array(after[z]) > raw + 1e-12))) for z in zones]
        lines.append(f"| {method} | {eps:g} | {arm.replace('_', ' ')} | {len(paths)} | {raw.mean():.4f} | "
                     + " | ".join(cells) + f" | {' / '.join(worse)} |")
    return "\n".join(lines)


def _results_so_far(out: str) -> tuple:
    """``out``/results.json's path and its rows so far (none yet: empty); ``out`` is created."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        return path, {"rows": []}
    with open(path) as f:
        return path, json.load(f)


def main_recipe(args) -> int:
    """``--recipe current``: the current recipe's rows, appended to ``--out``/results.json as they finish."""
    path, results = _results_so_far(args.out)
    done = {(r["method"], r["epsilon"], r["seed"]) for r in results["rows"]}
    jobs = [job for s in args.seeds  # seed by seed, so a partial run has every method
            for job in [("sgd", float("inf"), s)] * (not args.no_reference)
            + [(m, e, s) for m in args.methods for e in args.epsilons]]
    pretrained, start = {}, time.perf_counter()
    for method, eps, seed in ([] if args.render_only else jobs):
        if (method, eps, seed) in done:
            continue
        new = ([run_recipe_reference(seed)] if method == "sgd"
               else run_recipe(method, eps, seed, args.draws, pretrained, held_out=args.held_out))
        results["rows"] += new
        for row in new:
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}),
                  flush=True)
        results["meta"] = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, TensorFlow CPU",
                           "command": "python experiments/uncertainty_table.py "
                                      + " ".join(sys.argv[1:]),
                           "seconds_this_run": time.perf_counter() - start}
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(recipe_table(results["rows"]) + "\n")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(recipe_table(results["rows"]) + "\n")
    return 0


COLUMNS = ("accuracy", "ece", "ece_calibrated", "nll", "brier", "auroc_noise", "auroc_inverted",
           "auroc_rot180", "coverage", "set_size")


def table(rows) -> str:
    """Markdown: mean (standard deviation over seeds) of every column, one line per method, epsilon, arm."""
    groups = {}
    for r in rows:
        groups.setdefault((r["method"], r["epsilon"], r["arm"]), []).append(r)
    head = ("| method | epsilon | public data | seeds | accuracy | ECE | ECE calibrated | NLL | Brier | "
            "AUROC noise | AUROC inverted | AUROC rot180 | coverage (90%) | set size | epsilon spent |")
    lines = [head, "|" + " --- |" * 15]
    order = {m: i for i, m in enumerate((*METHODS, "sgd"))}
    keys = sorted(groups, key=lambda k: (k[1], order[k[0]], k[2]))
    for method, eps, arm in keys:
        rs = groups[(method, eps, arm)]
        cells = []
        for c in COLUMNS:
            v = np.array([r[c] for r in rs])
            cells.append(f"{v.mean():.3f} ({v.std():.3f})" if len(v) > 1 else f"{v.mean():.3f}")
        spent = max(r["total_epsilon"] for r in rs)
        lines.append(f"| {method} | {'none' if eps == float('inf') else f'{eps:g}'} | {arm} | {len(rs)} | "
                     + " | ".join(cells) + f" | {'-' if spent == float('inf') else f'{spent:.3f}'} |")
    return "\n".join(lines)


def comparison(rows) -> str:
    """Markdown: each Bayesian method against DP-SGD at the same epsilon, no public data (means over seeds).

    NLL: lower is better; AUROC: higher. "matches" = at most 0.01 worse (NLL) / 0.005 lower (AUROC).
    """
    def mean(method, eps, key):
        v = [r[key] for r in rows if r["method"] == method and r["epsilon"] == eps and r["arm"] == "none"]
        return (float(np.mean(v)), len(v)) if v else (None, 0)

    lines = ["| method | epsilon | seeds | NLL (DP-SGD) | AUROC noise (DP-SGD) | AUROC inverted (DP-SGD) | "
             "AUROC rot180 (DP-SGD) | matches DP-SGD on |", "|" + " --- |" * 8]
    for eps in (1.0, 4.0):
        for method in METHODS[1:]:
            nll, seeds = mean(method, eps, "nll")
            ref, _ = mean("dpsgd", eps, "nll")
            if nll is None or ref is None:
                continue
            cells, wins = [f"{nll:.3f} ({ref:.3f})"], ["NLL"] if nll <= ref + 0.01 else []
            for key, name in (("auroc_noise", "noise"), ("auroc_inverted", "inverted"),
                              ("auroc_rot180", "rot180")):
                v, r = mean(method, eps, key)[0], mean("dpsgd", eps, key)[0]
                cells.append(f"{v:.3f} ({r:.3f})")
                wins += [name] if v >= r - 0.005 else []
            lines.append(f"| {method} | {eps:g} | {seeds} | " + " | ".join(cells)
                         + f" | {', '.join(wins) or 'none'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the rows not yet in ``--out``/results.json, appending each as it finishes; write the table."""
    from experiments.runner import paired_arms_without_ledger

    paired_arms_without_ledger()  # its arms share one sampling key per seed
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--no-reference", action="store_true", help="skip the non-private sgd rows")
    p.add_argument("--composition", default="parallel", choices=("parallel", "sequential"))
    p.add_argument("--null-zone", type=float, default=None,
                   help="keep the temperature 1 unless a first noisy test of miscalibration exceeds this "
                        "many noise standard deviations (fit_temperature_private(null_zone=...))")
    p.add_argument("--out", default="docs/results/uncertainty_table")
    p.add_argument("--doc", default="docs/results.md",
                   help="page whose table between <!-- uncertainty-table --> markers is replaced")
    p.add_argument("--render-only", action="store_true", help="only write the table from results.json")
    p.add_argument("--recipe", default="split", choices=("split", "current"),
                   help="split: the table above (75%% trains, 25%% private calibration); current: "
                        "every record trains, public pretraining, EMA, the never-worse temperature "
                        "(run_recipe)")
    p.add_argument("--draws", type=int, default=100, help="--recipe current: temperature noise draws per run")
    p.add_argument("--zones", type=float, nargs="+", default=None,
                   help="only compare null zones (0: none) on the probabilities saved under --probs-dir")
    p.add_argument("--probs-dir", default="runs/uncertainty_recipe_probs")
    p.add_argument("--held-out", type=float, default=0.0,
                   help="--recipe current: hold this fraction out (split_by_record) and fit the temperature "
                        "there at the whole epsilon (parallel composition), not on the training records")
    args = p.parse_args(argv)
    if args.zones:
        print(zone_analysis(args.probs_dir, args.zones, args.draws))
        return 0
    if args.recipe == "current":
        if args.methods == list(METHODS):
            args.methods = list(RECIPE_METHODS)
        if args.epsilons == list(EPSILONS):
            args.epsilons = list(RECIPE_EPSILONS)
        if args.out == "docs/results/uncertainty_table":
            args.out = "docs/results/uncertainty_table_recipe"
        return main_recipe(args)
    path, results = _results_so_far(args.out)
    done = {(r["method"], r["epsilon"], r["arm"], r["seed"]) for r in results["rows"]}
    jobs = [("sgd", float("inf"), arm, s) for s in args.seeds for arm in args.arms if not args.no_reference]
    jobs += [(m, e, arm, s) for s in args.seeds for e in args.epsilons for arm in args.arms
             for m in args.methods]
    start = time.perf_counter()
    for method, eps, arm, seed in ([] if args.render_only else jobs):
        if (method, eps, arm, seed) in done:
            continue
        row = (run_reference(arm, seed) if method == "sgd"
               else run_private(method, eps, arm, seed, args.composition, args.null_zone))
        results["rows"].append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}),
              flush=True)
        results["meta"] = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, TensorFlow CPU",
                           "command": "python experiments/uncertainty_table.py "
                                      + " ".join(sys.argv[1:] if argv is None else argv),
                           "seconds_this_run": time.perf_counter() - start}
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        _write_tables(results, args)
    _write_tables(results, args)
    return 0


def _write_tables(results, args):
    """``table.md`` under ``--out``, and the marked table of ``--doc`` if the page has the markers."""
    text = (table(results["rows"]) + "\n\nBayesian methods against DP-SGD (no public data; mean over "
            "seeds):\n\n" + comparison(results["rows"]))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    if args.doc and os.path.exists(args.doc):
        with open(args.doc) as f:
            page = f.read()
        start, end = "<!-- uncertainty-table -->", "<!-- /uncertainty-table -->"
        if start in page and end in page:
            head, rest = page.split(start, 1)
            page = head + start + "\n" + text + "\n" + end + rest.split(end, 1)[1]
            with open(args.doc, "w") as f:
                f.write(page)


if __name__ == "__main__":
    raise SystemExit(main())
