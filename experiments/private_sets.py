"""Private 90% prediction sets where the size allows them: MNIST-5k (DIGITS' format) as the private data.

Per seed: 1,000 images (a public permutation of the seed) are the test set; of the other 4,000,
``split_by_record`` (key = seed) holds out about 27% (about 1,080, at least 1,000) for the threshold, and
the rest (about 2,920) train a DP model from scratch: the DPVD recipe of ``tfdpbnn train`` (64 tanh units,
KL weight 0.03, learning rate 1, Poisson q = 0.2, 20 epochs, clip 1, PLD, delta 1e-5) with the moving
average of its iterates (decay 0.9). The two parts are disjoint by record, so training (epsilon E on its
part) and the threshold (epsilon E on its part) are inside E together (parallel composition, McSherry 2009).

Thresholds compared on the same model, each over ``--draws`` noise draws (coverage and mean set size on the
test set):

- ``plan (linear, 4 steps, gamma 0.3)``: ``CalibrationPlan()``, a private temperature and a private
  threshold sharing E (what "best-recipe" measured before);
- ``linear, 6 steps, gamma 0.05``: ``private_conformal_threshold`` alone at E (no temperature), the steps
  and gamma that ``private_conformal_level`` gives the lowest level for at n = 1,000 (computed from the
  arguments alone, docs/uncertainty.md);
- ``log, 6 steps, gamma 0.05``: the same on the log-probability grid (``grid="log"``);
- ``log, 5 steps (rule)`` / ``log, 4 steps``: fewer queries on the log grid, gamma the one of ``GAMMAS``
  with the lowest ``private_conformal_level`` at the held-out size (public); the rule (fixed before the
  run): the fewest steps whose log-grid cell stays within 0.2 decades of probability;
- calibration: the plan's private temperature (4 steps at its share of E) with and without
  ``null_zone=2`` (``fit_temperature_private``), test ECE over the draws against the raw ECE;
- ``public threshold``: ``conformal_threshold`` without noise on the same held-out part (no guarantee of
  privacy; the reference).

Run: ``python experiments/private_sets.py --seeds 0 1 2 3 4 --out docs/results/private_sets`` (each seed's
held-out and test probabilities are saved under ``--probs-dir``).
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DELTA = 1e-5
ALPHA = 0.1
HELD_OUT_FRACTION = 0.27
THRESHOLDS = {  # name: (grid, steps, gamma); gamma None: the one of GAMMAS with the lowest level at n
    "linear, 6 steps, gamma 0.05": ("linear", 6, 0.05),
    "log, 6 steps, gamma 0.05": ("log", 6, 0.05),
    "log, 5 steps (rule)": ("log", 5, None),
    "log, 4 steps": ("log", 4, None),
}
#: public candidates for gamma; ``_level_gamma`` picks the one with the lowest ``private_conformal_level``
GAMMAS = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2)


def _level_gamma(n, epsilon, steps):
    """The gamma of ``GAMMAS`` whose ``private_conformal_level`` at (n, epsilon, steps) is lowest (public)."""
    from tfdpbnn.uncertainty import private_conformal_level

    return min(GAMMAS, key=lambda g: private_conformal_level(n, ALPHA, epsilon, DELTA, steps, g, "pld"))


def _train(x, y, epsilon, seed, method="dpvd", epochs=20, ensemble=False):
    """The DP model on (x, y), EMA weights loaded; returns (model, optimizer, MC samples, snapshots).

    ``ensemble``: also keep the last 30 second-half iterates (every 2nd; ``IterateMoments``), the free
    posterior of "uncertainty-table" (docs/results.md); ``snapshots`` is None otherwise.
    """
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import IterateAverage, IterateMoments

    recipe = dataclasses.replace(train_recipes.RECIPES[method], accountant="pld", epochs=epochs)
    n = len(x)
    batch_size = int(round(recipe.sample_rate * n))
    model = train_recipes.build_model(method, (64,), 10, n, recipe.hidden, seed, kl_weight=recipe.kl_weight)
    optimizer = train_recipes.build_optimizer(method, recipe, epsilon, DELTA, n, batch_size)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n,
                                           steps_per_epoch=int(math.ceil(n / batch_size)),
                                           secret_seed=10_000 + seed)
    tf.random.set_seed(20_000 + seed)
    callbacks = [IterateAverage(0.9)]
    if ensemble:
        total = int(math.ceil(n / batch_size)) * recipe.epochs
        callbacks.append(IterateMoments(burn_in=total // 2, thinning=2, max_iterates=30))
    model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=callbacks)
    samples = recipe.mc_samples if method in train_recipes.STOCHASTIC else 1
    return model, optimizer, samples, callbacks[1].iterates if ensemble else None


def run_seed(seed, epsilon, draws, method="dpvd", epochs=20, probs_dir=None, ensemble=False) -> dict:
    """One seed: train privately, then every threshold over ``draws`` noise draws; coverage and size."""
    import tfdpbnn
    from tfdpbnn.uncertainty import (
        CalibrationPlan,
        conformal_threshold,
        coverage_and_size,
        mc_predict,
        private_conformal_level,
        private_conformal_threshold,
    )

    start = time.perf_counter()
    x_all, y_all = tfdpbnn.data.load_mnist5k_as_digits()
    x_all = (x_all - 0.5).astype("float32")
    order = np.random.default_rng(seed).permutation(len(x_all))
    test, rest = order[:1000], order[1000:]
    held = tfdpbnn.uncertainty.split_by_record([x_all[rest], y_all[rest]], HELD_OUT_FRACTION, key=seed)
    x, y = x_all[rest][~held], y_all[rest][~held]
    x_cal, y_cal = x_all[rest][held], y_all[rest][held]
    y_test = y_all[test]
    model, optimizer, samples, snapshots = _train(x, y, epsilon, seed, method, epochs, ensemble)

    def predict(inputs):
        if snapshots:
            out = mc_predict(model, inputs, weight_snapshots=snapshots, from_logits=True)
        else:
            out = mc_predict(model, inputs, num_samples=samples, from_logits=True)
        return np.asarray(out.mean, dtype=np.float64)

    cal, probs = predict(x_cal), predict(x_all[test])
    label = method + (" ensemble" if ensemble else "")
    if probs_dir:  # the model's outputs, so thresholds can be compared again without training
        os.makedirs(probs_dir, exist_ok=True)
        np.savez(os.path.join(probs_dir, f"{label.replace(' ', '_')}-eps{epsilon:g}-seed{seed}.npz"), cal=cal,
                 y_cal=y_cal, test=probs, y_test=y_test)
    row = {"seed": seed, "epsilon": epsilon, "method": label, "epochs": epochs, "train": len(x),
           "held_out": len(x_cal), "accuracy": float(np.mean(probs.argmax(1) == y_test)),
           "ece": float(tfdpbnn.uncertainty.expected_calibration_error(probs, y_test)),
           "training_epsilon": float(optimizer.privacy_statement()["epsilon"]), "thresholds": {}}
    public = conformal_threshold(cal, y_cal, ALPHA)
    coverage, size = coverage_and_size(public.predict_sets(probs), y_test)
    row["thresholds"]["public threshold"] = {"coverage": coverage, "set_size": size, "epsilon": 0.0}

    def measure(fit_draw):
        cov, siz, eps = [], [], 0.0
        for draw in range(draws):
            sets, spent = fit_draw(draw)
            c, m = coverage_and_size(sets, y_test)
            cov.append(c)
            siz.append(m)
            eps = max(eps, spent)
        cov, siz = np.array(cov), np.array(siz)
        return {"coverage": float(cov.mean()), "coverage_std": float(cov.std()),
                "coverage_min": float(cov.min()), "coverage_max": float(cov.max()),
                "set_size": float(siz.mean()), "set_size_std": float(siz.std()),
                "all_labels_draws": int(np.sum(siz >= 10.0 - 1e-9)), "epsilon": eps}

    plan = CalibrationPlan()

    def plan_draw(draw):
        temperature, threshold = plan.fit(cal, y_cal, epsilon, DELTA, "pld", seeds=(draw, 10_000 + draw),
                                          allow_uninformative=True)
        return (threshold.predict_sets(temperature.apply(probs)),
                plan.release_epsilons(epsilon, DELTA, "pld")[1])

    row["thresholds"]["plan (linear, 4 steps, gamma 0.3)"] = measure(plan_draw)
    # calibration: the plan's private temperature (its share of E on the held-out part) with and without
    # the null zone, test ECE over the draws, against the raw ECE
    for name, zone in (("ece_temperature", None), ("ece_temperature_null_zone", 2.0)):
        zoned = CalibrationPlan(temperature_null_zone=zone)
        eps_t = zoned.release_epsilons(epsilon, DELTA, "pld")[0]
        eces, kept = [], 0
        for draw in range(draws):
            fit = tfdpbnn.uncertainty.fit_temperature_private(cal, y_cal, eps_t, DELTA, steps=4,
                                                              accountant="pld", seed=draw, null_zone=zone)
            eces.append(tfdpbnn.uncertainty.expected_calibration_error(fit.apply(probs), y_test))
            kept += fit.temperature == 1.0
        row[name], row[name + "_std"], row[name + "_kept"] = float(np.mean(eces)), float(np.std(eces)), kept
    for name, (grid, steps, gamma) in THRESHOLDS.items():
        gamma = _level_gamma(len(y_cal), epsilon, steps) if gamma is None else gamma

        def draw_fit(draw, grid=grid, steps=steps, gamma=gamma):
            fit = private_conformal_threshold(cal, y_cal, ALPHA, epsilon, DELTA, steps=steps, gamma=gamma,
                                              accountant="pld", seed=20_000 + draw, grid=grid)
            return fit.predict_sets(probs), fit.privacy.epsilon

        row["thresholds"][name] = measure(draw_fit)
        row["thresholds"][name]["level"] = private_conformal_level(len(y_cal), ALPHA, epsilon, DELTA, steps,
                                                                   gamma, "pld")
        row["thresholds"][name]["gamma"] = gamma
    row["seconds"] = time.perf_counter() - start
    return row


def table(rows) -> str:
    """Markdown: per seed and threshold, coverage and set size (mean ± std over the noise draws)."""
    lines = ["| model | seed | model accuracy | held-out | threshold | level at median noise | coverage | "
             "min-max over draws | set size | draws with all labels | epsilon of the threshold |",
             "|" + " --- |" * 11]
    for r in rows:
        for name, t in r["thresholds"].items():
            if "coverage_std" in t:
                cov = f"{t['coverage']:.3f} ± {t['coverage_std']:.3f}"
                span = f"{t['coverage_min']:.3f}-{t['coverage_max']:.3f}"
                size = f"{t['set_size']:.2f} ± {t['set_size_std']:.2f}"
                full = str(t["all_labels_draws"])
            else:
                cov, span, size, full = f"{t['coverage']:.3f}", "-", f"{t['set_size']:.2f}", "-"
            level = f"{t['level']:.3f}" if "level" in t else "-"
            lines.append(f"| {r['method']} | {r['seed']} | {r['accuracy']:.3f} | {r['held_out']} | {name} | "
                         f"{level} | {cov} | {span} | {size} | {full} | {t['epsilon']:.3f} |")
    lines += ["", "| model | seed | raw ECE | ECE after the private temperature | with null zone 2 (draws "
              "kept at T = 1) |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['method']} | {r['seed']} | {r['ece']:.3f} | {r['ece_temperature']:.3f} ± "
              f"{r['ece_temperature_std']:.3f} | "
              f"{r['ece_temperature_null_zone']:.3f} ± {r['ece_temperature_null_zone_std']:.3f} "
              f"({r['ece_temperature_null_zone_kept']}) |" for r in rows]
    names = list(rows[0]["thresholds"]) if rows else []
    lines += ["", "Mean (std) over seeds:", "", "| model | seeds | threshold | coverage | set size |",
              "| --- | --- | --- | --- | --- |"]
    for method in dict.fromkeys(r["method"] for r in rows):
        group = [r for r in rows if r["method"] == method]
        for name in names:
            cov = np.array([r["thresholds"][name]["coverage"] for r in group])
            size = np.array([r["thresholds"][name]["set_size"] for r in group])
            lines.append(f"| {method} | {len(group)} | {name} | {cov.mean():.3f} ({cov.std():.3f}) | "
                         f"{size.mean():.2f} ({size.std():.2f}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Run every seed, write ``results.json`` and ``table.md`` under ``--out``."""
    from experiments.runner import paired_arms_without_ledger

    paired_arms_without_ledger()  # its arms share one sampling key per seed
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--draws", type=int, default=100)
    p.add_argument("--method", default="dpvd", choices=("dpvd", "dpsgd"))
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--ensemble", action="store_true",
                   help="predict with the ensemble of the last 30 second-half iterates (free posterior)")
    p.add_argument("--out", default="docs/results/private_sets")
    p.add_argument("--probs-dir", default="runs/private_sets_probs",
                   help="where each seed's held-out and test probabilities are saved (npz)")
    p.add_argument("--render-only", action="store_true", help="only write table.md from results.json")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    results = {"meta": [], "rows": []}
    if os.path.exists(path):  # rows already there are kept (and not run again)
        with open(path) as f:
            results = json.load(f)
    done = {(r["method"], r["seed"], r["epsilon"], r["epochs"]) for r in results["rows"]}
    start = time.perf_counter()
    command = " ".join(sys.argv[1:] if argv is None else argv)
    meta = {"command": "python experiments/private_sets.py " + command,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, TensorFlow CPU"}
    for seed in [] if args.render_only else args.seeds:
        if (args.method + (" ensemble" if args.ensemble else ""), seed, args.epsilon, args.epochs) in done:
            continue
        results["rows"].append(run_seed(seed, args.epsilon, args.draws, args.method, args.epochs,
                                        args.probs_dir, args.ensemble))
        print(json.dumps(results["rows"][-1]), flush=True)
        results["meta"] = [m for m in results["meta"] if m["command"] != meta["command"]]
        results["meta"].append(dict(meta, seconds=time.perf_counter() - start))
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table(results["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
