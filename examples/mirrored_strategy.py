"""DP training under ``tf.distribute.MirroredStrategy``: same code, same epsilon as on one device.

Under a strategy every replica clips its own examples' gradients and divides by the *global* expected batch
size; only the replica with global id 0 adds the Gaussian noise, and the all-reduce sums the replicas'
gradients, so each global step is exactly one DP-SGD step (Abadi et al. 2016) with one noise draw, and the
optimizer's epsilon is the single-device epsilon for the same noise multiplier, sample rate and steps
(``docs/distributed.md``). The model and the optimizer are built inside ``strategy.scope()``; Keras splits
each Poisson batch drawn by ``tfdpbnn.data.poisson_batches`` across the replicas (one process draws it, so
the replicas' parts are disjoint).

Without GPUs the script splits the CPU into 2 logical devices, which must happen before TensorFlow starts
(so first of all); with GPUs it uses every local GPU. On logical CPU devices this checks correctness, not
speed::

    python examples/mirrored_strategy.py         # DIGITS, DPVD at epsilon 1, about a minute on 2 cores

``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) runs the same code for 1 epoch at a larger sample rate.
"""

from __future__ import annotations

import argparse
import json
import os

import tensorflow as tf

if not tf.config.list_physical_devices("GPU"):   # before anything else touches TensorFlow's devices
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)

import numpy as np  # noqa: E402

import tfdpbnn  # noqa: E402

EPSILON, DELTA = 1.0, 1e-5


def main():
    """Train under MirroredStrategy and compare with the single-device epsilon."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings (1 epoch)")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"
    epochs = 1 if fast else 20
    batch_size = 256 if fast else 128             # the GLOBAL expected batch size

    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus] if gpus else [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    print(f"{strategy.num_replicas_in_sync} replicas: {devices}")

    (x_train, y_train), (x_test, y_test) = tfdpbnn.data.load_digits()
    n = len(x_train)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((64,)),
            tfdpbnn.layers.DenseVariational(64, activation="tanh", num_examples=n),
            tfdpbnn.layers.DenseVariational(10, num_examples=n),
        ])
        optimizer = tfdpbnn.DPVDOptimizer(
            l2_norm_clip=1.0, target_epsilon=EPSILON, delta=DELTA, num_examples=n, batch_size=batch_size,
            epochs=epochs, sampling="poisson", accountant="rdp", learning_rate=0.5)
        model.compile(optimizer=optimizer,
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    model.fit(tfdpbnn.data.poisson_batches(x_train, y_train, sample_rate=batch_size / n), epochs=epochs,
              verbose=0)

    statement = optimizer.privacy_statement()
    single_device = tfdpbnn.compute_epsilon(optimizer.noise_multiplier, optimizer.sample_rate,
                                            statement["steps"], DELTA, accountant="rdp")
    accuracy = float(np.mean(np.argmax(model(x_test, training=False), axis=1) == y_test))
    print(f"privacy: epsilon {statement['epsilon']:.4f} at delta {DELTA:g} (budget {EPSILON}) after "
          f"{statement['steps']} global steps at q = {statement['sample_rate']:.4f}, noise multiplier "
          f"{statement['noise_multiplier']:.3f}; a single device with the same sigma, q and steps: "
          f"{single_device:.4f}")
    print(f"test accuracy (deterministic weights, held out, not covered by epsilon): {accuracy:.3f}")
    print("summary:", json.dumps({
        "replicas": strategy.num_replicas_in_sync, "epsilon": statement["epsilon"],
        "single_device_epsilon": single_device, "delta": DELTA, "budget": EPSILON,
        "steps": statement["steps"], "test_accuracy": accuracy}))


if __name__ == "__main__":
    main()
