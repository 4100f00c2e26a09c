"""DPVD on the bundled DIGITS data: budget, Poisson batches, fit, privacy statement, MC prediction, export.

The README's flow as a script. A two-layer variational-dropout network (Ermis & Cemgil 2017) is trained with
``tfdpbnn.DPVDOptimizer`` under a budget of (epsilon, delta) = (1, 1e-5): the optimizer calibrates its noise
multiplier for the planned steps, the batches are Poisson-sampled (what the RDP accountant assumes, with a
secret sampling seed) and ``fit`` stops before any step that would exceed the budget. The script then prints
the privacy statement's essentials (epsilon of the steps that ran, by every sound accountant), the Monte
Carlo test accuracy, entropy, mutual information and ECE, and exports a SavedModel with its
``assets/privacy.json``. It also writes a few held-out inputs with the in-process predictions beside the
export, so that ``serve_savedmodel.py`` can call the model as a serving client would::

    python examples/dpvd_digits.py                       # about a minute on a 2-core CPU
    python examples/serve_savedmodel.py dpvd_digits --inputs dpvd_digits-requests.npz

``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) runs the same code with 2 epochs and 5 MC samples.
The test accuracy and calibration are computed on the 360 held-out test images, which are not part of the
private training data; they are not covered by epsilon (the DIGITS test split is public here).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import tensorflow as tf

import tfdpbnn

EPSILON, DELTA = 1.0, 1e-5


def main():
    """Train, report the privacy statement, predict with uncertainty and export (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings (2 epochs, 5 MC samples)")
    parser.add_argument("--export-dir", default="dpvd_digits", help="where to write the SavedModel")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"
    epochs = 2 if fast else 30
    mc_samples = 5 if fast else 50

    (x_train, y_train), (x_test, y_test) = tfdpbnn.data.load_digits()
    n, batch_size = len(x_train), 128

    model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tfdpbnn.layers.DenseVariational(256, activation="tanh", num_examples=n),
        tfdpbnn.layers.DenseVariational(10, num_examples=n),        # linear output: logits
    ])
    optimizer = tfdpbnn.DPVDOptimizer(
        l2_norm_clip=1.0, target_epsilon=EPSILON, delta=DELTA,     # the budget; sigma is calibrated from it
        num_examples=n, batch_size=batch_size, epochs=epochs,
        sampling="poisson", accountant="rdp", learning_rate=0.5)
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    train = tfdpbnn.data.poisson_batches(x_train, y_train, sample_rate=batch_size / n)  # secret seed
    model.fit(train, epochs=epochs, verbose=0)

    statement = optimizer.privacy_statement()
    print(f"privacy: epsilon {statement['epsilon']:.4f} at delta {statement['delta']:g} "
          f"({statement['accountant']} accountant, budget {EPSILON}), {statement['steps']} steps of "
          f"{statement['sampling']} sampling at q = {statement['sample_rate']:.4f}, "
          f"noise multiplier {statement['noise_multiplier']:.3f}, clip {statement['l2_norm_clip']}")
    print("epsilon by every sound accountant:",
          {k: (None if v is None else round(v, 4)) for k, v in statement["epsilon_by_accountant"].items()})
    print("asserted by the user (not checked):", statement["asserted_by_user"] or "nothing")

    result = tfdpbnn.uncertainty.mc_predict(model, x_test, num_samples=mc_samples, from_logits=True)
    accuracy = float(np.mean(result.mean.argmax(axis=1) == y_test))
    ece = tfdpbnn.uncertainty.expected_calibration_error(result.mean, y_test)
    print(f"test (held out, not covered by epsilon): accuracy {accuracy:.3f}, ECE {ece:.3f}, "
          f"mean predictive entropy {result.predictive_entropy.mean():.3f}, "
          f"mean mutual information {result.mutual_information.mean():.4f} ({mc_samples} MC samples)")

    path = tfdpbnn.export_saved_model(model, args.export_dir, num_samples=mc_samples)
    requests = os.path.normpath(args.export_dir) + "-requests.npz"
    np.savez(requests, x=x_test[:32], deterministic=model(x_test[:32], training=False).numpy(),
             mc_mean=result.mean[:32], labels=y_test[:32])
    print(f"exported to {path} (privacy record in {os.path.join(path, 'assets', 'privacy.json')}); "
          f"sample requests in {requests}")
    print("summary:", json.dumps({
        "epsilon": statement["epsilon"], "delta": statement["delta"], "budget": EPSILON,
        "steps": statement["steps"], "noise_multiplier": statement["noise_multiplier"],
        "sample_rate": statement["sample_rate"], "test_accuracy": accuracy, "ece": ece, "export_dir": path,
        "requests": requests}))


if __name__ == "__main__":
    main()
