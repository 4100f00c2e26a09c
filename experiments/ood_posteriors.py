"""Out-of-distribution detection by posteriors that cost no privacy, against DP-SGD's point estimate.

Per seed and method (``dpvd``, ``dpsgd``), one DP run on all of DIGITS' 1,437 training records: the recipe of
``tfdpbnn train`` from its random initialization (64 tanh units, learning rate 1, Poisson q = 0.2, 20 epochs =
120 steps, clip 1, PLD, delta 1e-5, epsilon 1; DPVD's KL weight 0.03), with callbacks that read the released
iterates (post-processing: the statement's epsilon is checked unchanged). Predictive distributions:

- ``ema``: the moving average of the iterates (decay 0.9); DPVD averaged over 30 draws of its own
  variational posterior at those weights (its MC posterior);
- ``last iterate``: the last iterate (DPVD: its own MC posterior there);
- ``gaussian, 2nd half`` / ``gaussian x4, 2nd half``: 30 draws from the diagonal Gaussian fitted to every
  2nd iterate of the second half (``IterateMoments``, SWAG-diagonal, Maddox et al. 2019), variance scaled
  by 1 / 4;
- ``ensemble, 2nd half``: the last 30 of those iterates; ``ensemble, after 20%``: 32 iterates, every 3rd
  from step 25 on;
- ``ensemble, last 25%``: the last 30 iterates (steps 91-120, every one). Declared before its first run as
  the free posterior to compare with DP-SGD's point estimate on NLL and AUROC: the second half's ensemble
  (seed 0) lost on NLL through its early members, which the noisy training had not yet fitted.

For ``ema``, also the test ECE a private temperature would give (``fit_temperature_private`` on the
training records at 0.2 epsilon, 4 steps, mean over 100 noise draws; its cost to training is ignored, in its
favour), without and with ``null_zone=2``.

Scores of each against uniform noise images and inverted digits (1 - x): the AUROC of predictive entropy
(the score fixed beforehand: the targets are stated on it), and for comparison the mutual information
(zero for a point estimate: AUROC 0.5, shown as 0 by the runs before ties got their average rank) and
1 - max p. Accuracy, ECE, NLL on DIGITS' 360 test images. Sampling keys 10_000 + seed, the
initialization seeded by ``seed``, TensorFlow seed 20_000 + seed afterwards (the ``best_recipe`` ablation's;
it fixes DPVD's weight draws, not the DP noise, which the optimizers key from ``os.urandom`` at every
``fit``: two runs of one seed differ by their noise draw).

Run (the record store off: each statement is still its own run's)::

    TFDPBNN_PRIVACY_STORE=off python experiments/ood_posteriors.py --methods dpsgd --seeds 0 1 2 3 4 \
        --out docs/results/ood_posteriors/dpsgd
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
SCORES = ("entropy", "mutual_information", "max_prob")


def _auroc(in_scores, out_scores):
    """P(out score > in score) + P(tie) / 2: the Mann-Whitney statistic (ties get their average rank)."""
    from scipy import stats

    a, b = np.asarray(out_scores, float), np.asarray(in_scores, float)
    ranks = stats.rankdata(np.concatenate([a, b]))
    return float((ranks[:len(a)].sum() - len(a) * (len(a) + 1) / 2) / (len(a) * len(b)))


def _ood_sets(x_test, seed):
    rng = np.random.default_rng(seed)
    return {"noise": (rng.uniform(0, 1, size=x_test.shape) - 0.5).astype("float32"),
            "inverted": (-x_test).astype("float32")}


def _score_all(prediction):
    """The three OOD scores of an ``MCPrediction`` (higher = more likely out of distribution)."""
    return {"entropy": prediction.predictive_entropy, "mutual_information": prediction.mutual_information,
            "max_prob": 1.0 - prediction.mean.max(axis=1)}


def run_one(method, seed, epsilon=1.0) -> list:
    """One DP run; every posterior's accuracy, ECE, NLL and AUROCs (three scores, two OOD sets)."""
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import IterateAverage, IterateMoments, mc_predict

    start = time.perf_counter()
    tf.keras.backend.clear_session()
    recipe = dataclasses.replace(train_recipes.RECIPES[method], accountant="pld", learning_rate=1.0)
    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    x, x_test = (x - 0.5).astype("float32"), (x_test - 0.5).astype("float32")
    n = len(x)
    batch_size = int(round(recipe.sample_rate * n))
    steps = int(math.ceil(n / batch_size))
    model = train_recipes.build_model(method, (64,), 10, n, recipe.hidden, seed, kl_weight=recipe.kl_weight)
    optimizer = train_recipes.build_optimizer(method, recipe, epsilon, DELTA, n, batch_size)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n, steps_per_epoch=steps,
                                           secret_seed=10_000 + seed)
    total = steps * recipe.epochs
    average = IterateAverage(0.9, swap_at_end=False)
    half = IterateMoments(burn_in=total // 2, thinning=2, max_iterates=30)
    half4 = IterateMoments(burn_in=total // 2, thinning=2, max_iterates=1, scale=4.0)
    late = IterateMoments(burn_in=total // 5, thinning=3, max_iterates=32)
    last = IterateMoments(burn_in=total - 30, thinning=1, max_iterates=30)
    tf.random.set_seed(20_000 + seed)
    model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=[average, half, half4, late, last])
    spent = float(optimizer.privacy_statement()["epsilon"])
    samples = recipe.mc_samples if method in train_recipes.STOCHASTIC else 1
    ood = _ood_sets(x_test, seed)

    def own(inputs):
        return mc_predict(model, inputs, num_samples=samples, from_logits=True)

    def snapshots(weights):
        return lambda inputs: mc_predict(model, inputs, weight_snapshots=weights, from_logits=True)

    predictors = {"last iterate": own,
                  "gaussian, 2nd half": snapshots(half.sample(30, seed=seed)),
                  "gaussian x4, 2nd half": snapshots(half4.sample(30, seed=seed)),
                  "ensemble, 2nd half": snapshots(half.iterates),
                  "ensemble, after 20%": snapshots(late.iterates),
                  "ensemble, last 25%": snapshots(last.iterates)}
    rows = []
    for name in ("last iterate", "gaussian, 2nd half", "gaussian x4, 2nd half", "ensemble, 2nd half",
                 "ensemble, after 20%", "ensemble, last 25%", "ema"):
        if name == "ema":
            average.swap_in()
            predict = own
        else:
            predict = predictors[name]
        test = predict(x_test)
        p = np.asarray(test.mean, dtype=np.float64)
        row = {"method": method, "seed": seed, "posterior": name, "epsilon": spent,
               "accuracy": float(np.mean(p.argmax(1) == y_test)),
               "ece": float(tfdpbnn.uncertainty.expected_calibration_error(p, y_test)),
               "nll": float(-np.mean(np.log(np.clip(p[np.arange(len(y_test)), y_test], 1e-12, 1.0))))}
        if name == "ema":  # what a private temperature would do (module docstring), with and without the zone
            train_p = np.asarray(own(x).mean, dtype=np.float64)
            for key, zone in (("ece_temperature", None), ("ece_temperature_null_zone", 2.0)):
                eces = [tfdpbnn.uncertainty.expected_calibration_error(
                    tfdpbnn.uncertainty.fit_temperature_private(
                        train_p, y, 0.2 * epsilon, DELTA, steps=4, accountant="pld", seed=draw,
                        null_zone=zone).apply(p), y_test) for draw in range(100)]
                row[key], row[key + "_std"] = float(np.mean(eces)), float(np.std(eces))
        inside = _score_all(test)
        for set_name, xo in ood.items():
            outside = _score_all(predict(xo))
            for score in SCORES:
                row[f"auroc_{set_name}_{score}"] = _auroc(inside[score], outside[score])
        rows.append(row)
    if float(optimizer.privacy_statement()["epsilon"]) != spent:
        raise AssertionError("the statement's epsilon changed after post-processing")
    for row in rows:
        row["seconds"] = time.perf_counter() - start
    return rows


def table(rows) -> str:
    """Markdown: mean ± std over seeds per method and posterior."""
    cols = [("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL")]
    labels = (("entropy", "entropy"), ("mutual_information", "MI"), ("max_prob", "1 - max p"))
    cols += [(f"auroc_{s}_{k}", f"AUROC {s} ({label})") for s in ("noise", "inverted") for k, label in labels]
    lines = ["| method | posterior | seeds | " + " | ".join(c[1] for c in cols) + " |",
             "|" + " --- |" * (len(cols) + 3)]
    keys = list(dict.fromkeys((r["method"], r["posterior"]) for r in rows))
    for method, posterior in keys:
        group = [r for r in rows if r["method"] == method and r["posterior"] == posterior]
        cells = []
        for key, _ in cols:
            v = np.array([r[key] for r in group])
            cells.append(f"{v.mean():.3f} ± {v.std():.3f}")
        lines.append(f"| {method} | {posterior} | {len(group)} | " + " | ".join(cells) + " |")
    ema = [r for r in rows if r["posterior"] == "ema"]
    lines += ["", "| method | seed | raw ECE | ECE after a private temperature | with null zone 2 |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['method']} | {r['seed']} | {r['ece']:.3f} | {r['ece_temperature']:.3f} ± "
              f"{r['ece_temperature_std']:.3f} | {r['ece_temperature_null_zone']:.3f} ± "
              f"{r['ece_temperature_null_zone_std']:.3f} |" for r in ema]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Run every seed and method; write ``results.json`` and ``table.md`` under ``--out``."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--methods", nargs="+", default=["dpvd", "dpsgd"], choices=("dpvd", "dpsgd"))
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--out", default=os.path.join("runs", "ood_posteriors"))
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start, rows = time.perf_counter(), []
    for seed in args.seeds:
        for method in args.methods:
            rows += run_one(method, seed, args.epsilon)
            print(json.dumps(rows[-1]), flush=True)
            meta = {"command": "python experiments/ood_posteriors.py " + " ".join(
                        sys.argv[1:] if argv is None else argv),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, TensorFlow CPU",
                    "seconds": time.perf_counter() - start}
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
            with open(os.path.join(args.out, "table.md"), "w") as f:
                f.write(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
