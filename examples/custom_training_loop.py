"""A ``tf.GradientTape`` training loop on tfdpbnn's DP mechanism, with your own dp-accounting accountant.

When you write the loop yourself, ``tfdpbnn.DPMechanism`` does the DP part of each step (per-example
clipping, one Gaussian draw, division by the expected batch size; Abadi et al. 2016, Algorithm 1) and
``mechanism.step_event(q)`` gives the step's ``DpEvent``; the sampling and the counting are yours. This
script

1. calibrates the noise multiplier for a budget of (epsilon, delta) = (1, 1e-5) and the planned number of
   Poisson steps (``tfdpbnn.calibrate_noise``),
2. runs the loop on the bundled DIGITS data with a plain Keras SGD optimizer and Poisson batches from
   ``tfdpbnn.data.poisson_batches`` (secret seed: the amplification by sampling the accountant assumes),
   composing one event per step that ran into a dp-accounting ``RdpAccountant``, and refusing a step that
   would take the accountant past the budget,
3. prints the epsilon of the steps that ran (and the PLD accountant's, tighter, as a cross-check).

The model's KL terms (``model.losses``) are data-independent and stay out of the clipped loss:
``privatize_model`` adds their gradient unclipped, as the tfdpbnn optimizers do. See
``docs/custom_training.md``::

    python examples/custom_training_loop.py          # 10 epochs, about a minute on a 2-core CPU

``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) runs the same loop for 1 epoch at a larger sample rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import dp_accounting
import numpy as np
import tensorflow as tf

import tfdpbnn

EPSILON, DELTA, CLIP = 1.0, 1e-5, 1.0


def main():
    """Run the calibrated DP loop and print its epsilon (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings (1 epoch)")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"
    epochs = 1 if fast else 10

    (x_train, y_train), (x_test, y_test) = tfdpbnn.data.load_digits()
    n = len(x_train)
    batch_size = 256 if fast else 128
    q = batch_size / n
    steps_per_epoch = math.ceil(1 / q)
    planned = epochs * steps_per_epoch
    sigma = tfdpbnn.calibrate_noise(EPSILON, DELTA, q, planned, accountant="rdp")
    print(f"plan: {planned} Poisson steps at q = {q:.4f}; noise multiplier {sigma:.3f} for epsilon {EPSILON}")

    model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tfdpbnn.DenseVariational(64, num_examples=n, activation="tanh"),
        tfdpbnn.DenseVariational(10, num_examples=n),
    ])
    sgd = tf.keras.optimizers.SGD(learning_rate=0.5)
    mechanism = tfdpbnn.DPMechanism(l2_norm_clip=CLIP, noise_multiplier=sigma, expected_batch_size=batch_size)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    accountant = dp_accounting.rdp.RdpAccountant()
    event = mechanism.step_event(sample_rate=q)        # the same event for every Poisson step

    @tf.function(reduce_retracing=True)
    def dp_step(x, y):
        result = mechanism.privatize_model(model, x, y, loss_fn=lambda y, y_pred, w: loss_fn(y, y_pred))
        sgd.apply_gradients(zip(result.gradients, model.trainable_variables, strict=True))
        return tf.reduce_mean(result.clipped.per_example_loss)

    batches = tfdpbnn.data.poisson_batches(x_train, y_train, sample_rate=q, steps_per_epoch=steps_per_epoch)
    steps, budget_left = 0, True
    for epoch in range(epochs):
        for x, y in batches:     # every pass over the dataset draws new Poisson batches
            # Refuse a step that would exceed the budget (never here: sigma was calibrated for the plan).
            next_epsilon = dp_accounting.rdp.RdpAccountant().compose(event, steps + 1).get_epsilon(DELTA)
            if next_epsilon > EPSILON:
                print(f"stopping before step {steps + 1}: it would reach epsilon {next_epsilon:.4f}")
                budget_left = False
                break
            dp_step(x, y)                # a DP release of this batch ...
            accountant.compose(event)    # ... so it is counted, whatever its realized size (even 0)
            steps += 1
        print(f"epoch {epoch + 1}: {steps} steps, epsilon so far {accountant.get_epsilon(DELTA):.4f}")
        if not budget_left:
            break

    epsilon = accountant.get_epsilon(DELTA)
    pld = dp_accounting.pld.PLDAccountant().compose(event, steps).get_epsilon(DELTA)
    accuracy = float(np.mean(np.argmax(model(x_test, training=False), axis=1) == y_test))
    print(f"privacy: epsilon {epsilon:.4f} at delta {DELTA:g} by RDP ({pld:.4f} by PLD) after {steps} steps, "
          f"noise multiplier {sigma:.3f}, clip {CLIP}, q = {q:.4f}, add-or-remove neighbours")
    print(f"test accuracy (held-out images, not covered by epsilon): {accuracy:.3f}")
    print("summary:", json.dumps({"epsilon": epsilon, "epsilon_pld": pld, "delta": DELTA, "budget": EPSILON,
                                  "steps": steps, "planned_steps": planned, "noise_multiplier": sigma,
                                  "sample_rate": q, "test_accuracy": accuracy}))


if __name__ == "__main__":
    main()
