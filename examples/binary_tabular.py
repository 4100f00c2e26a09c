"""A binary classifier on tabular data (breast cancer), trained with DP, checked for calibration, exported.

scikit-learn's Wisconsin breast-cancer data (569 tumours, 30 features, ships with scikit-learn) is split into
a private training split (80%) and a held-out split. A Bayesian logistic regression (one variational dropout
layer with one logit output; ``BinaryCrossentropy(from_logits=True)``) is trained with
``tfdpbnn.DPVDOptimizer`` at a budget of (epsilon, delta) = (2, 1e-5) on Poisson batches. Then, on the
held-out split: Monte Carlo probabilities p(benign | x) = mean over samples of sigmoid(logit) (label 1 =
benign), accuracy, Brier score, and the expected calibration error of the two-class distribution
[1 - p, p]. Finally the model is exported with ``tfdpbnn.export_saved_model`` and its privacy record::

    python examples/binary_tabular.py
    python examples/serve_savedmodel.py breast_cancer --inputs breast_cancer-requests.npz

``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) runs the same code with 2 epochs and 5 MC samples.

What epsilon covers, and what it does not:

* Preprocessing is ``log1p`` of every feature, a fixed function chosen from the public description of the
  measurements (non-negative sizes and ratios with heavy tails). Nothing is fitted to the data: standardizing
  with the training split's means and standard deviations would release those statistics, which epsilon
  does not cover.
* The model, clip norm, epochs and learning rate were chosen by the authors of this example, who had seen this
  public data set and compared five settings on its held-out split. With truly private data, fix them from
  public knowledge or pay for the choice with a private search (``private_search.py``).
* Accuracy and calibration are measured on the held-out split, which is treated as data you may look at;
  they are not covered by epsilon.

The binary output: the served ``mc_predict`` signature summarizes class-probability vectors. The exported
serving model therefore outputs the two logits [0, l], whose softmax is exactly [1 - sigmoid(l),
sigmoid(l)]; the trained model and its weights are the same.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer

import tfdpbnn

EPSILON, DELTA = 2.0, 1e-5


def bernoulli_mc(model, x, num_samples):
    """p(y = 1 | x): the mean over ``num_samples`` sampled networks of sigmoid(logit), shape [n]."""
    with tfdpbnn.layers.mc_sampling():      # the variational layers draw new weights on every call
        samples = [tf.sigmoid(model(x, training=False))[:, 0] for _ in range(num_samples)]
    return tf.reduce_mean(tf.stack(samples), axis=0).numpy().astype(np.float64)


def two_logit_model(model):
    """A serving model whose outputs [0, l] have softmax [1 - sigmoid(l), sigmoid(l)] (same weights)."""
    logit = model.outputs[0]
    # logit * 0.0: a zero column built from Keras operations (Keras 3 refuses TensorFlow functions such as
    # tf.zeros_like on its symbolic tensors); the logit is finite, so this is exactly 0
    return tf.keras.Model(model.inputs, tf.keras.layers.Concatenate()([logit * 0.0, logit]))


def main():
    """Train the binary model, check its calibration and export it (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings (2 epochs, 5 MC samples)")
    parser.add_argument("--export-dir", default="breast_cancer", help="where to write the SavedModel")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"
    epochs = 2 if fast else 20
    mc_samples = 5 if fast else 100

    data = load_breast_cancer()
    x = np.log1p(data.data).astype("float32")          # fixed public transform, nothing fitted (docstring)
    y = data.target.astype("float32")[:, None]         # 1 = benign, 0 = malignant (scikit-learn's coding)
    order = np.random.default_rng(0).permutation(len(x))  # the split is fixed before training
    test, train = order[:114], order[114:]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    n, batch_size = len(x_train), 64

    model = tf.keras.Sequential([
        tf.keras.Input((30,)),
        tfdpbnn.layers.DenseVariational(1, num_examples=n),           # one logit
    ])
    optimizer = tfdpbnn.DPVDOptimizer(
        l2_norm_clip=1.0, target_epsilon=EPSILON, delta=DELTA, num_examples=n, batch_size=batch_size,
        epochs=epochs, sampling="poisson", accountant="rdp", learning_rate=1.0)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(tfdpbnn.data.poisson_batches(x_train, y_train, sample_rate=batch_size / n), epochs=epochs,
              verbose=0)

    statement = optimizer.privacy_statement()
    print(f"privacy: epsilon {statement['epsilon']:.4f} at delta {statement['delta']:g} "
          f"({statement['accountant']}, budget {EPSILON}), {statement['steps']} Poisson steps at "
          f"q = {statement['sample_rate']:.4f}, noise multiplier {statement['noise_multiplier']:.3f}, "
          f"n = {statement['num_examples']}, {statement['neighboring']} neighbours")

    p = bernoulli_mc(model, x_test, mc_samples)
    labels = y_test[:, 0].astype(np.int64)
    accuracy = float(np.mean((p > 0.5) == labels))
    brier = float(np.mean((p - labels) ** 2))
    ece = tfdpbnn.uncertainty.expected_calibration_error(np.stack([1 - p, p], axis=1), labels)
    print(f"held out ({len(labels)} tumours, not covered by epsilon): accuracy {accuracy:.3f}, "
          f"Brier {brier:.3f}, ECE {ece:.3f} ({mc_samples} MC samples)")

    serving = two_logit_model(model)
    path = tfdpbnn.export_saved_model(serving, args.export_dir, num_samples=mc_samples, from_logits=True,
                                      privacy=statement)
    requests = os.path.normpath(args.export_dir) + "-requests.npz"
    two = serving(x_test[:32], training=False).numpy()
    np.savez(requests, x=x_test[:32], deterministic=two, mc_mean=np.stack([1 - p[:32], p[:32]], axis=1),
             labels=labels[:32])
    print(f"exported to {path} (privacy record in {os.path.join(path, 'assets', 'privacy.json')}); "
          f"sample requests in {requests}")
    print("summary:", json.dumps({
        "epsilon": statement["epsilon"], "delta": statement["delta"], "budget": EPSILON,
        "steps": statement["steps"], "noise_multiplier": statement["noise_multiplier"],
        "sample_rate": statement["sample_rate"], "accuracy": accuracy, "brier": brier, "ece": ece,
        "p_min": float(p.min()), "p_max": float(p.max()), "export_dir": path, "requests": requests}))


if __name__ == "__main__":
    main()
