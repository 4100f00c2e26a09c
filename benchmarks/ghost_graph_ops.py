"""Op count of one traced ghost-clipping step per model: a load-independent check of the engine's work.

Run from two checkouts (``PYTHONPATH=<checkout> python benchmarks/ghost_graph_ops.py``) to compare the
graphs the per-layer rules build, e.g. before and after a refactoring: fewer or equal ops per model means no
added work, whatever the machine's load. Seconds, no training.
"""
import collections

import numpy as np
import tensorflow as tf

from tfdpbnn import layers
from tfdpbnn.clipping import clipped_gradients

loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def per_example(y, y_pred, sw):
    """Unreduced cross-entropy: the per-example data losses."""
    return loss_fn(y, y_pred)


def models():
    """(name, model, input shape) of the models whose clipping step is traced."""
    tf.keras.utils.set_random_seed(0)
    yield "dv", tf.keras.Sequential([
        tf.keras.Input((20,)), layers.DenseVariational(16, 100, activation="relu"),
        layers.DenseVariational(3, 100)]), (20,)
    yield "convvd", tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)), layers.Conv2DVariational(4, 3, 100), tf.keras.layers.Flatten(),
        layers.DenseVariational(3, 100)]), (8, 8, 1)
    yield "bbb", tf.keras.Sequential([
        tf.keras.Input((20,)), layers.DenseBayesByBackprop(16, 100, activation="relu"),
        layers.DenseBayesByBackprop(3, 100)]), (20,)
    yield "noisy_ln_pbn", tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)), layers.NoisyConv2D(4, 3, padding="same"),
        layers.PublicBatchNormalization(public_batch=np.zeros((8, 8, 8, 4), "float32")),
        tf.keras.layers.Flatten(), layers.NoisyDense(8), tf.keras.layers.LayerNormalization(),
        tf.keras.layers.Dense(3)]), (8, 8, 1)


def main() -> None:
    """Print, per model, the number of ops in the traced step and the six most frequent op types."""
    for name, model, shape in models():
        x = tf.random.normal((16, *shape))
        y = tf.constant(np.arange(16) % 3)

        @tf.function
        def step(x, y, model=model):
            r = clipped_gradients(model, x, y, None, per_example, 1.0, method="ghost", sum_scale=1 / 16)
            return r.clipped_sum, r.per_example_norms

        graph = step.get_concrete_function(x, y).graph
        ops = [op.type for op in graph.get_operations()]
        print(name, len(ops), sorted(collections.Counter(ops).items(), key=lambda kv: -kv[1])[:6])


if __name__ == "__main__":
    main()
