"""DPVD's KL weight chosen on public data (MNIST-5k in DIGITS' format), then applied on DIGITS.

    python experiments/dpvd_kl_public.py --out docs/results/dpvd-kl-public     # --epsilons 1 4 --seeds 0-4

For each epsilon, the DPVD recipe of ``tfdpbnn train`` (no hidden layer, Poisson q = 0.2, 20 epochs,
learning rate 1, C = 1, sigma by PLD for (epsilon, 1e-5)) is simulated on public data: 1,437 of the 5,000
public images (DIGITS' training-set size, so the same sigma and steps) train it with each candidate
``kl_weight``, and the other 3,563 score it by negative log-likelihood (``tfdpbnn.public.select_on_public``;
no private record is read, so the choice costs no privacy). The chosen weight and the ELBO (weight 1) are
then trained on DIGITS with ``--seeds`` and scored on its 360 test images: accuracy, ECE, mean confidence,
NLL. Writes ``results.json`` and ``table.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import tensorflow as tf

import tfdpbnn
import tfdpbnn.public

DELTA = 1e-5
N_PRIVATE = 1437           # DIGITS' training set: the public simulation uses the same n, q, sigma, steps
CANDIDATES = (1.0, 0.3, 0.1, 0.03, 0.01, 0.0)
EPOCHS, Q, LR = 20, 0.2, 1.0


def build(kl_weight, epsilon, n):
    """The DPVD recipe's model and optimizer with ``kl_weight``, compiled."""
    model = tf.keras.Sequential([tf.keras.Input((64,)),
                                 tfdpbnn.layers.DenseVariational(10, num_examples=n, kl_weight=kl_weight)])
    batch = int(round(Q * n))
    optimizer = tfdpbnn.DPVDOptimizer(l2_norm_clip=1.0, target_epsilon=epsilon, delta=DELTA, num_examples=n,
                                      batch_size=batch, epochs=EPOCHS, sampling="poisson", accountant="pld",
                                      learning_rate=LR)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def poisson(x, y):
    """The recipe's Poisson batches over ``(x, y)``."""
    n, batch = len(x), int(round(Q * len(x)))
    return tfdpbnn.data.poisson_batches(x, y, sample_rate=batch / n, steps_per_epoch=math.ceil(n / batch))


def metrics(model, x, y):
    """Accuracy, ECE, mean confidence and NLL of the MC predictive mean (30 samples)."""
    probs = np.asarray(tfdpbnn.mc_predict(model, x, num_samples=30, from_logits=True).mean)
    return {"accuracy": float(np.mean(probs.argmax(1) == y)),
            "ece": tfdpbnn.expected_calibration_error(probs, y),
            "confidence": float(probs.max(1).mean()),
            "nll": float(-np.mean(np.log(probs[np.arange(len(y)), y] + 1e-12)))}


def choose_on_public(epsilon, seed):
    """``select_on_public`` over ``CANDIDATES`` (score: minus the public validation NLL)."""
    x, y = tfdpbnn.data.load_mnist5k_as_digits()
    order = np.random.default_rng(seed).permutation(len(x))
    train, val = order[:N_PRIVATE], order[N_PRIVATE:]
    tf.keras.utils.set_random_seed(seed)

    def build_candidate(hparams):
        return build(hparams["kl_weight"], epsilon, N_PRIVATE)

    return tfdpbnn.public.select_on_public(
        build_candidate, [{"kl_weight": w} for w in CANDIDATES], poisson(x[train], y[train]),
        tf.data.Dataset.from_tensor_slices((x[val], y[val])).batch(512), epochs=EPOCHS,
        score=lambda model, _: -metrics(model, x[val], y[val])["nll"])


def on_digits(kl_weight, epsilon, seed):
    """The recipe with ``kl_weight`` trained on DIGITS (seed ``seed``), scored on its test images."""
    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    tf.keras.utils.set_random_seed(seed)
    model = build(kl_weight, epsilon, len(x))
    model.fit(poisson(x, y), epochs=EPOCHS, verbose=0)
    return {"epsilon": epsilon, "kl_weight": kl_weight, "seed": seed,
            "epsilon_spent": model.optimizer.epsilon(DELTA), **metrics(model, x_test, y_test)}


def main(argv=None):
    """Command-line entry point (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default="runs/dpvd-kl-public")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    chosen, rows = {}, []
    for eps in args.epsilons:
        selection = choose_on_public(eps, seed=0)
        chosen[eps] = {"kl_weight": selection.hparams["kl_weight"],
                       "public_nll_by_candidate": dict(zip(CANDIDATES, [-s for s in selection.scores],
                                                           strict=True))}
        print(f"epsilon {eps:g}: chosen on public data {chosen[eps]}", flush=True)
        for weight in sorted({1.0, selection.hparams["kl_weight"]}, reverse=True):
            for seed in args.seeds:
                rows.append(on_digits(weight, eps, seed))
                print(json.dumps(rows[-1]), flush=True)
    lines = ["| epsilon | kl_weight | chosen on public data | seeds | accuracy | ECE | mean confidence | "
             "NLL |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for eps in args.epsilons:
        for weight in sorted({r["kl_weight"] for r in rows if r["epsilon"] == eps}, reverse=True):
            sel = [r for r in rows if r["epsilon"] == eps and r["kl_weight"] == weight]
            mean = {k: np.mean([r[k] for r in sel]) for k in ("accuracy", "ece", "confidence", "nll")}
            std = {k: np.std([r[k] for r in sel], ddof=1) if len(sel) > 1 else 0.0 for k in mean}
            picked = "yes" if weight == chosen[eps]["kl_weight"] else "no"
            lines.append(f"| {eps:g} | {weight:g} | {picked} | "
                         f"{len(sel)} | " + " | ".join(f"{mean[k]:.3f} +- {std[k]:.3f}" for k in mean) + " |")
    text = "\n".join(lines)
    print(text)
    seconds = time.time() - start
    print(f"wall time {seconds:.0f} s")
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"chosen": {str(k): v for k, v in chosen.items()}, "rows": rows, "wall_seconds": seconds},
                  fh, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
