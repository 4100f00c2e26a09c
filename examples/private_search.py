"""A private hyperparameter search whose epsilon covers the search, not just the final training run.

Choosing hyperparameters by trying them on private data is itself a use of that data: reporting only the
chosen run's epsilon understates what was spent. ``tfdpbnn.tuning.private_search`` implements random
stopping (Papernot & Steinke 2022): it draws a secret number of trials K from a truncated negative binomial
distribution (here logarithmic, E[K] = 2), trains a randomly picked candidate in each trial through
``compile``/``fit`` with a tfdpbnn DP optimizer, scores it on a private validation split with a noisy count
of correct predictions, and releases only the best trial's model, with one privacy statement for all of it.
``tfdpbnn.tuning.calibrate_search`` first sets every candidate's noise multiplier so that the whole search
meets the budget (epsilon, delta) = (1, 1e-5).

Here the candidates are DPVD networks (Ermis & Cemgil 2017) on the bundled DIGITS data, scored by their
Monte Carlo predictive mean. The candidate list must be fixed from public knowledge before the search;
this one was written by the example's authors, who had seen DIGITS. Each trial trains on the training split
only (the selected model is that trial's model, no retraining), so the statement covers every use of both
private splits. ``result.diagnostics`` (K and every trial's noisy score) is not covered: do not publish it::

    python examples/private_search.py            # under a minute per trial on a 2-core CPU (K is random)

``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) runs the same search with 1-epoch candidates and 3 MC samples.
``--seed`` makes the search's randomness reproducible, for experiments only: a published guarantee needs
it secret (the statement then says so).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import tensorflow as tf

import tfdpbnn
from tfdpbnn import tuning

EPSILON, DELTA = 1.0, 1e-5


def main():
    """Calibrate the candidates to the budget, run the search, print its one privacy statement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings (1-epoch candidates)")
    parser.add_argument("--seed", type=int, default=None,
                        help="fix the search's randomness (experiments only; default: secret)")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"
    mc_samples = 3 if fast else 20

    (x, y), (x_test, y_test) = tfdpbnn.data.load_digits()
    x_tr, y_tr, x_val, y_val = x[:1150], y[:1150], x[1150:], y[1150:]   # both splits are private
    n = len(x_tr)

    def build(hp):
        """A model compiled with a DP optimizer whose noise, batch size and sampling match the candidate."""
        hidden = [tfdpbnn.layers.DenseVariational(hp["units"], activation="tanh", num_examples=n)
                  for _ in range(hp["hidden_layers"])]
        model = tf.keras.Sequential([tf.keras.Input((64,)), *hidden,
                                     tfdpbnn.layers.DenseVariational(10, num_examples=n)])
        model.compile(optimizer=tfdpbnn.DPVDOptimizer(
                          l2_norm_clip=1.0, noise_multiplier=hp["noise_multiplier"], num_examples=n,
                          batch_size=hp["batch_size"], sampling="poisson", learning_rate=hp["lr"]),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def predict(model, inputs):
        return tfdpbnn.uncertainty.mc_predict(model, inputs, num_samples=mc_samples, from_logits=True).mean

    epochs = 1 if fast else 15
    candidates = [dict(hidden_layers=0, units=0, lr=1.0, batch_size=230, epochs=epochs),
                  dict(hidden_layers=1, units=64, lr=0.5, batch_size=230, epochs=epochs),
                  dict(hidden_layers=1, units=64, lr=1.0, batch_size=230, epochs=epochs)]
    distribution = tuning.TruncatedNegativeBinomial.from_mean(2.0, eta=0.0)
    candidates = tuning.calibrate_search(EPSILON, DELTA, candidates, n, distribution)
    print(f"every candidate trains at noise multiplier {candidates[0]['noise_multiplier']:.3f} "
          f"(the whole search, not one run, meets epsilon {EPSILON})")

    result = tuning.private_search(build, candidates, x_tr, y_tr, x_val, y_val, delta=DELTA,
                                   distribution=distribution, predict=predict, seed=args.seed)
    privacy = result.privacy
    print(f"privacy of the search: epsilon {privacy['epsilon']:.4f} at delta {privacy['delta']:g} "
          f"({privacy['selection']}); one trial alone {privacy['trial_epsilon']:.4f}; randomness: "
          f"{privacy['randomness']}")
    print("covered:", privacy["covers"])
    summary = {"epsilon": privacy["epsilon"], "trial_epsilon": privacy["trial_epsilon"], "delta": DELTA,
               "budget": EPSILON, "selected": result.hparams, "noisy_validation_accuracy": result.score}
    if result.model is not None:   # a truncated negative binomial always runs K >= 1 trials
        accuracy = float(np.mean(predict(result.model, x_test).argmax(axis=1) == y_test))
        summary["test_accuracy"] = accuracy
        print(f"selected {result.hparams}: noisy validation accuracy {result.score:.3f}, test accuracy "
              f"{accuracy:.3f} (public test images, not covered by epsilon)")
    print("summary:", json.dumps(summary))


if __name__ == "__main__":
    main()
