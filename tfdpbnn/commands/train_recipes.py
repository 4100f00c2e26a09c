"""Default model and optimizer of each ``tfdpbnn train`` method (architectures from Ermis & Cemgil (2017a),
Zhang et al. (2022) and Davody et al. (2020)).

DIGITS defaults (64 inputs, centred to [-0.5, 0.5]; 10 classes): one hidden layer of 64 tanh units, large
Poisson batches (q = 0.2) and few steps (20 epochs = 100 steps), clip 1: at epsilon 1 the noise per step is
then small against the clipped sum of ~290 examples. Image datasets get the same MLP on flattened pixels.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

METHODS = ("dpvd", "dpsgld", "dpbbp", "dpmcdropout", "sidp", "dpsgd")
STOCHASTIC = ("dpvd", "dpbbp", "dpmcdropout", "sidp")


@dataclasses.dataclass
class Recipe:
    """Hyperparameters of one method (command-line flags override them)."""

    hidden: int = 64
    sample_rate: float = 0.2
    epochs: int = 20
    learning_rate: float = 1.0
    clip: float = 1.0
    mc_samples: int = 30


RECIPES = {
    "dpvd": Recipe(),
    "dpsgld": Recipe(),  # learning rate: calibrated to the budget (Zhang et al. 2022, Theorem 1)
    "dpbbp": Recipe(learning_rate=1.0),
    "dpmcdropout": Recipe(),
    "sidp": Recipe(learning_rate=1.0),
    "dpsgd": Recipe(),
}


def build_model(method: str, input_shape, num_classes: int, num_examples: int, hidden: int, seed: int):
    """The Keras model of ``method``: Ermis & Cemgil's (2017a) variational dropout MLP (dpvd), Zhang et al.'s
    (2022) BBP / MC
    dropout / plain MLP (dpbbp, dpmcdropout, dpsgld, dpsgd), Davody et al.'s (2020) noisy MLP with LayerNorm
    (sidp)."""
    from tfdpbnn import layers

    tf.keras.utils.set_random_seed(seed)
    n = num_examples
    stack = [tf.keras.Input(input_shape)]
    if len(input_shape) > 1:
        stack.append(tf.keras.layers.Flatten())
    if method == "dpvd":
        stack += [layers.DenseVariational(hidden, num_examples=n, activation="tanh"),
                  layers.DenseVariational(num_classes, num_examples=n)]
    elif method == "dpbbp":
        stack += [layers.DenseBayesByBackprop(hidden, num_examples=n, activation="tanh"),
                  layers.DenseBayesByBackprop(num_classes, num_examples=n)]
    elif method == "dpmcdropout":
        stack += [tf.keras.layers.Dense(hidden, activation="tanh"), layers.MCDropout(0.2),
                  tf.keras.layers.Dense(num_classes)]
    elif method == "sidp":
        stack += [layers.NoisyDense(hidden), tf.keras.layers.LayerNormalization(),
                  tf.keras.layers.Activation("tanh"), layers.NoisyDense(num_classes)]
    elif method in ("dpsgld", "dpsgd"):
        stack += [tf.keras.layers.Dense(hidden, activation="tanh"), tf.keras.layers.Dense(num_classes)]
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return tf.keras.Sequential(stack)


def build_optimizer(method: str, recipe: Recipe, epsilon: float, delta: float, num_examples: int,
                    batch_size: int):
    """The DP optimizer of ``method``, its noise calibrated to (epsilon, delta) by RDP under Poisson
    sampling for ``recipe.epochs`` epochs."""
    from tfdpbnn import optimizers

    common = dict(target_epsilon=epsilon, delta=delta, num_examples=num_examples, batch_size=batch_size,
                  epochs=recipe.epochs, accountant="rdp", sampling="poisson")
    if method == "dpsgld":
        return optimizers.DPSGLDOptimizer(recipe.clip, **common)
    cls = {"dpvd": optimizers.DPVDOptimizer, "sidp": optimizers.SIDPOptimizer}.get(
        method, optimizers.DPSGDOptimizer)
    return cls(recipe.clip, learning_rate=recipe.learning_rate, **common)
