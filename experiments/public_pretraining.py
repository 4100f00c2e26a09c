"""Public MNIST-5k before private DP training on DIGITS: does it lift accuracy and calibration?

For each seed, method (DP-SGD, DPVD) and epsilon (0.3, 1; delta 1e-5), the recipe of ``tfdpbnn train``
(64 tanh units, Poisson q = 0.2, 20 epochs, clip 1, noise calibrated by RDP) trained on DIGITS' 1437
training images in three arms:

- ``none``: the recipe as is (learning rate 1), no public data;
- ``public-lr``: the learning rate chosen on public data only (``tfdpbnn.public.select_on_public``): the
  private run simulated at the same epsilon on 1437 MNIST-5k images, scored on 563 others;
- ``public-pretrain+lr``: non-private pretraining on all 5,000 public images (``train_recipes``'
  pretraining, what ``tfdpbnn train --public mnist5k`` runs), then DP fine-tuning of the whole network at
  the learning rate chosen on public data the same way, from weights pretrained on the other 3000 images.

Candidates: learning rates 0.03, 0.1, 0.3, 1. ``--diagnostic-lrs`` adds arms ``public-pretrain lr=X``
(pretraining, then fine-tuning at the fixed rate X): a diagnostic of what limits the selection, NOT a valid
result when X is picked after looking at DIGITS' test scores. Scored on DIGITS' 360 test images: accuracy,
ECE (15 bins) and NLL of the MC-averaged probabilities (30 samples for DPVD). Public data cost no privacy:
every arm's epsilon is the private run's. Nothing else is tuned on DIGITS.

Run: ``nice python experiments/public_pretraining.py --seeds 0 1 --out runs/public_pretraining``
(needs ``pip install 'tfdpbnn[public]'``). Writes ``results.json`` and a Markdown table ``table.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time

import numpy as np

METHODS = ("dpsgd", "dpvd")
EPSILONS = (0.3, 1.0)
DELTA = 1e-5
#: Arms: the CLI recipe as is; its learning rate chosen on public data; public pretraining + that choice.
ARMS = ("none", "public-lr", "public-pretrain+lr")
LEARNING_RATES = (0.03, 0.1, 0.3, 1.0)
NUM_PRIVATE = 1437  # DIGITS' training split


def _public(seed: int):
    """MNIST-5k (centred) split: pretraining (3000), simulated private (1437) and validation (563) parts."""
    from tfdpbnn.data import load_mnist5k_as_digits

    x, y = load_mnist5k_as_digits()
    x = x - 0.5
    order = np.random.default_rng(seed).permutation(len(x))
    parts = np.split(order, [NUM_PRIVATE, 2000])
    return {"private": (x[parts[0]], y[parts[0]]), "validation": (x[parts[1]], y[parts[1]]),
            "pretrain": (x[parts[2]], y[parts[2]]), "all": (x, y)}


def _private_run(method, epsilon, learning_rate, x, y, seed, weights=None):
    """The recipe's model (from ``weights`` if given) compiled with the DP optimizer, and its batches."""
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes

    recipe = dataclasses.replace(train_recipes.RECIPES[method], learning_rate=learning_rate)
    n = len(x)
    batch_size = int(round(recipe.sample_rate * n))
    model = train_recipes.build_model(method, x.shape[1:], 10, n, recipe.hidden, seed)
    if weights is not None:
        model.set_weights(weights)
    optimizer = train_recipes.build_optimizer(method, recipe, epsilon, DELTA, n, batch_size)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    steps = int(math.ceil(n / batch_size))
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n, steps_per_epoch=steps,
                                           secret_seed=10_000 + seed)
    tf.random.set_seed(20_000 + seed)
    return model, optimizer, batches, recipe.epochs


def pretrained_weights(method: str, data, seed: int):
    """Weights of the recipe's model after public pretraining on ``data`` (train_recipes' pretraining)."""
    from tfdpbnn.commands import train_recipes

    recipe = train_recipes.RECIPES[method]
    model = train_recipes.build_model(method, (64,), 10, NUM_PRIVATE, recipe.hidden, seed)
    train_recipes.pretrain_arrays(model, *data, seed, train_recipes.PublicPretraining())
    return model.get_weights()


def select_learning_rate(method: str, epsilon: float, pretrained: bool, seed: int = 0) -> dict:
    """The DP learning rate chosen on public data only (``tfdpbnn.public.select_on_public``): no privacy cost.

    The private run is simulated on 1437 public images at the same epsilon (same noise, batches, epochs),
    from the weights pretrained on the other 3000 public images if ``pretrained``; scored on 563 more.
    """
    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.public import select_on_public

    parts = _public(seed)
    weights = pretrained_weights(method, parts["pretrain"], seed) if pretrained else None
    x, y = parts["private"]
    recipe = train_recipes.RECIPES[method]
    batch_size = int(round(recipe.sample_rate * len(x)))
    # the same Poisson batches for every candidate (they do not depend on the learning rate)
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / len(x),
                                           steps_per_epoch=int(math.ceil(len(x) / batch_size)),
                                           secret_seed=30_000 + seed)

    def build(hparams):
        return _private_run(method, epsilon, hparams["learning_rate"], x, y, seed, weights)[0]

    chosen = select_on_public(build, [{"learning_rate": lr} for lr in LEARNING_RATES], batches,
                              parts["validation"], epochs=recipe.epochs)
    return {"learning_rate": chosen.hparams["learning_rate"],
            "scores": dict(zip(map(str, LEARNING_RATES), chosen.scores, strict=True)), "weights": weights}


def run_one(method: str, epsilon: float, arm: str, seed: int, learning_rate: float, weights=None) -> dict:
    """Train on DIGITS with the DP recipe and ``learning_rate`` (from ``weights`` if given); evaluate."""
    import tfdpbnn
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import expected_calibration_error, mc_predict

    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    x, x_test = x - 0.5, x_test - 0.5
    model, optimizer, batches, epochs = _private_run(method, epsilon, learning_rate, x, y, seed, weights)
    model.fit(batches, epochs=epochs, verbose=0)
    samples = train_recipes.RECIPES[method].mc_samples if method in train_recipes.STOCHASTIC else 1
    prediction = mc_predict(model, x_test, num_samples=samples, from_logits=True)
    probs = np.asarray(prediction.mean, dtype=np.float64)
    nll = float(-np.mean(np.log(np.clip(probs[np.arange(len(y_test)), y_test], 1e-12, None))))
    statement = optimizer.privacy_statement()
    return {"method": method, "target_epsilon": epsilon, "arm": arm, "seed": seed,
            "learning_rate": learning_rate, "accuracy": float(np.mean(np.argmax(probs, axis=1) == y_test)),
            "ece": float(expected_calibration_error(probs, y_test)), "nll": nll,
            "epsilon": float(statement["epsilon"])}


def pretrained_only(seeds) -> dict:
    """DIGITS test accuracy of the pretrained networks before any private training (inference mode)."""
    import tfdpbnn
    from tfdpbnn.commands import train_recipes

    out = {}
    for method in METHODS:
        for seed in seeds:
            model = train_recipes.build_model(method, (64,), 10, NUM_PRIVATE, 64, seed)
            model.set_weights(pretrained_weights(method, _public(seed)["all"], seed))
            _, (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
            logits = model.predict(x_test - 0.5, verbose=0)
            out[f"{method} seed={seed}"] = float(np.mean(np.argmax(logits, axis=1) == y_test))
    return out


def table(rows) -> str:
    """Markdown table: mean (min-max over seeds) per method, epsilon and arm (in order of appearance)."""
    lines = ["| method | epsilon | public data | learning rate | seeds | accuracy | ECE | NLL "
             "| epsilon spent |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method in METHODS:
        for epsilon in EPSILONS:
            for arm in dict.fromkeys(r["arm"] for r in rows):
                group = [r for r in rows if r["method"] == method and r["target_epsilon"] == epsilon
                         and r["arm"] == arm]
                if not group:
                    continue

                def cell(key, group=group):
                    values = np.array([r[key] for r in group])
                    return f"{values.mean():.3f} ({values.min():.3f}-{values.max():.3f})"

                spent = max(r["epsilon"] for r in group)
                lines.append(f"| {method} | {epsilon:g} | {arm} | {group[0]['learning_rate']:g} | "
                             f"{len(group)} | {cell('accuracy')} | {cell('ece')} | {cell('nll')} | "
                             f"{spent:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Select on public data, then run every arm for the given seeds; write results.json and table.md."""
    from experiments.runner import paired_arms_without_ledger

    paired_arms_without_ledger()  # its arms share one sampling key per seed
    from tfdpbnn.commands import train_recipes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", default=os.path.join("runs", "public_pretraining"))
    parser.add_argument("--diagnostic-lrs", type=float, nargs="*", default=[],
                        help="also fine-tune the pretrained network at these fixed rates (diagnostic)")
    parser.add_argument("--pretrained-only", action="store_true",
                        help="only print the pretrained networks' DIGITS accuracy (no private training)")
    parser.add_argument("--skip-selection", action="store_true",
                        help="run only the diagnostic arms (no selection, no selected arms)")
    args = parser.parse_args(argv)
    if args.pretrained_only:
        print(json.dumps(pretrained_only(args.seeds)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows, selections, start = [], {}, time.time()

    def save():
        with open(os.path.join(args.out, "results.json"), "w") as handle:
            json.dump({"rows": rows, "selections": selections, "wall_seconds": time.time() - start,
                       "machine": platform.platform(), "cpus": os.cpu_count()}, handle, indent=1)

    arms = [f"public-pretrain lr={lr:g}" for lr in args.diagnostic_lrs]
    arms = arms if args.skip_selection else list(ARMS) + arms
    for method in METHODS if not args.skip_selection else ():  # from public data only (public split seed 0)
        for epsilon in EPSILONS:
            for pretrained in (False, True):
                chosen = select_learning_rate(method, epsilon, pretrained)
                chosen.pop("weights")
                selections[f"{method} eps={epsilon:g} pretrained={pretrained}"] = chosen
                print("selected on public data:", method, epsilon, pretrained, chosen, flush=True)
                save()
    for seed in args.seeds:
        for method in METHODS:
            public_weights = pretrained_weights(method, _public(seed)["all"], seed)
            for epsilon in EPSILONS:
                for arm in arms:
                    if arm.startswith("public-pretrain lr="):
                        lr, weights = float(arm.split("=")[1]), public_weights
                    elif arm == "none":
                        lr, weights = train_recipes.RECIPES[method].learning_rate, None
                    else:
                        pretrained = arm == "public-pretrain+lr"
                        key = f"{method} eps={epsilon:g} pretrained={pretrained}"
                        lr = selections[key]["learning_rate"]
                        weights = public_weights if pretrained else None
                    row = run_one(method, epsilon, arm, seed, lr, weights)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    save()
    text = table(rows)
    with open(os.path.join(args.out, "table.md"), "w") as handle:
        handle.write(text)
    print(text)
    print(f"wall time {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
