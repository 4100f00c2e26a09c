"""Audit your own model: a measured lower bound on epsilon beside the accountant's upper bound.

An accountant proves an upper bound on epsilon for the algorithm it models; an audit measures a lower bound
from the code that actually ran. This script runs the one-run audit of Steinke, Nasr & Jagielski (2023)
with Dirac gradient canaries (Nasr et al. 2023) on a user's Bayesian model: ``GradientCanaryAudit`` wraps
the model (a second input and output through which each canary's gradient reaches exactly one weight),
appends m canaries to the DIGITS training data (each included with probability 1/2), trains with the user's
``DPVDOptimizer`` through ``compile``/``fit`` at a budget of epsilon = 2, scores every canary from the
recorded updates and turns the correct membership guesses into an epsilon that holds with 95% confidence.

Reading it: if the lower bound exceeded the reported epsilon, the reported epsilon would be false (at 95%
confidence); a lower bound below it finds nothing wrong, and does not prove the reported epsilon either. The
audit is a separate training run on the data plus canaries: audit the configuration you will release, then
train the released model without canaries. See ``docs/audit.md``::

    python examples/audit_own_model.py           # 1000 canaries, 2 epochs, about a minute on 2 cores

``--fast`` (or ``TFDPBNN_EXAMPLES_FAST=1``) runs the same audit with 100 canaries and 1 epoch.
"""

from __future__ import annotations

import argparse
import json
import os

import tensorflow as tf

import tfdpbnn
from tfdpbnn.audit import GradientCanaryAudit

EPSILON, DELTA, CLIP = 2.0, 1e-5, 1.0


def main():
    """Train the wrapped model with canaries and print the reported and the audited epsilon."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny settings (100 canaries, 1 epoch)")
    args = parser.parse_args()
    fast = args.fast or os.environ.get("TFDPBNN_EXAMPLES_FAST") == "1"
    num_canaries, epochs = (100, 1) if fast else (1000, 2)

    (x, y), _ = tfdpbnn.data.load_digits()
    audit = GradientCanaryAudit(num_canaries=num_canaries, seed=0)
    inputs, targets, weights = audit.data(x, y)         # the real examples, then one row per canary
    n = len(targets["task"])                             # the data set the accounting sees includes them
    user_model = tf.keras.Sequential([
        tf.keras.Input((64,)),
        tfdpbnn.layers.DenseVariational(64, activation="tanh", num_examples=n),
        tfdpbnn.layers.DenseVariational(10, num_examples=n),
    ])
    model = audit.wrap(user_model, l2_norm_clip=CLIP)
    optimizer = tfdpbnn.DPVDOptimizer(
        l2_norm_clip=CLIP, target_epsilon=EPSILON, delta=DELTA, num_examples=n, batch_size=n // 10,
        epochs=epochs, sampling="poisson", accountant="rdp", learning_rate=0.5)
    model.compile(optimizer=optimizer,
                  loss=audit.losses(tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
    model.fit(tfdpbnn.data.poisson_batches(inputs, targets, sample_rate=optimizer.sample_rate,
                                           sample_weight=weights),
              epochs=epochs, callbacks=[audit.recorder], verbose=0)

    reported = optimizer.epsilon()
    result, score = audit.result(model, optimizer, delta=DELTA)
    print(f"reported epsilon {reported:.4f} at delta {DELTA:g} ({optimizer.steps} steps, noise multiplier "
          f"{optimizer.noise_multiplier:.3f}, {n} examples including {num_canaries} canaries)")
    print(f"audited lower bound {result.epsilon:.4f} at {result.confidence:.0%} confidence ({score} score, "
          f"{result.num_correct} of {result.num_guesses} membership guesses correct)")
    if result.epsilon > reported:
        print("VIOLATION: the reported epsilon is below the measured lower bound")
    else:
        print("consistent: the audit found nothing above the reported epsilon")
    print("summary:", json.dumps({
        "reported_epsilon": reported, "audited_epsilon": result.epsilon, "confidence": result.confidence,
        "score": score, "num_guesses": result.num_guesses, "num_correct": result.num_correct,
        "num_canaries": num_canaries, "steps": optimizer.steps, "budget": EPSILON, "delta": DELTA}))


if __name__ == "__main__":
    main()
