"""Why DPVD is under-confident under DP: the KL term against the clipped data term, on DIGITS.

    python experiments/dpvd_kl_weight.py --out runs/dpvd-kl-weight     # --seeds 0 1 --epsilons 1 4

DPVD's objective is the ELBO: the data term (clipped per example, noised) plus KL(q || log-uniform prior) / n,
added unclipped (Ermis & Cemgil 2017a; Molchanov et al. 2017, eq. 14). For small alpha the KL is about
-0.5 log alpha = log|theta| - 0.5 log sigma^2 per weight, so its gradient pulls every mean theta towards 0
with force 1 / (n theta). Clipping shrinks the data term's gradient (by C / ||g_i|| for every example
above the clip), not the KL's, so under DP the KL wins more than in the non-private ELBO: the means, and
with them the logits, shrink and the predictive probabilities are under-confident. This script trains the
``tfdpbnn train`` DPVD recipe (Poisson q = 0.2, 20 epochs, learning rate 1, C = 1, sigma by PLD for
(epsilon, 1e-5)) with the layers' ``kl_weight`` in {1, 0.1, 0} (1: the ELBO; 0: no prior, DP-SGD on the
same network with its local-reparameterization noise) and reports test accuracy, ECE, mean confidence, NLL
and the median log alpha. It selects nothing: every configuration is reported, scored on the 360 test
images (public). Writes ``results.json`` and ``table.md`` under ``--out``.
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

DELTA = 1e-5


def run(epsilon, kl_weight, seed, hidden):
    """One training run of the DPVD recipe with ``kl_weight``; the test metrics."""
    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
    n = len(x)
    batch = int(round(0.2 * n))
    tf.keras.utils.set_random_seed(seed)
    stack = [tf.keras.Input((64,))]
    if hidden:
        stack.append(tfdpbnn.layers.DenseVariational(hidden, num_examples=n, activation="tanh",
                                                     kl_weight=kl_weight))
    stack.append(tfdpbnn.layers.DenseVariational(10, num_examples=n, kl_weight=kl_weight))
    model = tf.keras.Sequential(stack)
    epochs = 20
    optimizer = tfdpbnn.DPVDOptimizer(l2_norm_clip=1.0, target_epsilon=epsilon, delta=DELTA, num_examples=n,
                                      batch_size=batch, epochs=epochs, sampling="poisson", accountant="pld",
                                      learning_rate=1.0)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    train = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch / n, steps_per_epoch=math.ceil(n / batch))
    model.fit(train, epochs=epochs, verbose=0)
    probs = np.asarray(tfdpbnn.mc_predict(model, x_test, num_samples=30, from_logits=True).mean)
    log_alpha = np.concatenate([layer.log_alpha.numpy().ravel() for layer in model.layers
                                if isinstance(layer, tfdpbnn.layers.DenseVariational)])
    return {
        "epsilon": epsilon, "kl_weight": kl_weight, "seed": seed, "hidden": hidden,
        "epsilon_spent": optimizer.epsilon(DELTA),
        "accuracy": float(np.mean(probs.argmax(1) == y_test)),
        "ece": tfdpbnn.expected_calibration_error(probs, y_test),
        "confidence": float(probs.max(1).mean()),
        "nll": float(-np.mean(np.log(probs[np.arange(len(y_test)), y_test] + 1e-12))),
        "median_log_alpha": float(np.median(log_alpha)),
    }


def table(rows):
    """Markdown table: means over seeds per (hidden, epsilon, kl_weight)."""
    keys = sorted({(r["hidden"], r["epsilon"], r["kl_weight"]) for r in rows},
                  key=lambda k: (k[0], k[1], -k[2]))
    lines = ["| hidden units | epsilon | kl_weight | seeds | accuracy | ECE | mean confidence | NLL | "
             "median log alpha |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for hidden, eps, weight in keys:
        sel = [r for r in rows if (r["hidden"], r["epsilon"], r["kl_weight"]) == (hidden, eps, weight)]

        def mean(name, sel=sel):
            return float(np.mean([r[name] for r in sel]))

        lines.append(f"| {hidden} | {eps:g} | {weight:g} | {len(sel)} | {mean('accuracy'):.3f} | "
                     f"{mean('ece'):.3f} | {mean('confidence'):.3f} | {mean('nll'):.3f} | "
                     f"{mean('median_log_alpha'):.2f} |")
    return "\n".join(lines)


def main(argv=None):
    """Command-line entry point (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--kl-weights", type=float, nargs="+", default=[1.0, 0.1, 0.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--hidden", type=int, nargs="+", default=[0, 64])
    parser.add_argument("--out", default="runs/dpvd-kl-weight")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    rows = []
    for hidden in args.hidden:
        for eps in args.epsilons:
            for weight in args.kl_weights:
                for seed in args.seeds:
                    rows.append(run(eps, weight, seed, hidden))
                    print(json.dumps(rows[-1]), flush=True)
    text = table(rows)
    print(text)
    print(f"wall time {time.time() - start:.0f} s")
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump({"rows": rows, "wall_seconds": time.time() - start}, fh, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
