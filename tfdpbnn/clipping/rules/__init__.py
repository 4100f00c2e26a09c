"""The built-in per-layer clipping rules, one module per layer type (as Opacus's ``grad_sample/``).

Each module holds the rule of one layer class; the tfdpbnn layers expose the pieces of their forward pass
that the rules need as public methods (``preactivation_moments``, ``sample_preactivation``,
``outputs_from_preactivation``, ``preactivation``, ``normalize``), so each forward pass runs once and no rule
calls a private layer method. ``register_builtin_rules()`` registers them all; ``tfdpbnn.clipping`` calls it
once when it is imported. Derivations: docs/fast_clipping.md.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.registry import ClippingRule, mark_unsupported, register_rule
from tfdpbnn.clipping.rules.conv2d import Conv2DRule
from tfdpbnn.clipping.rules.conv2d_variational import Conv2DVariationalRule
from tfdpbnn.clipping.rules.dense import DenseRule
from tfdpbnn.clipping.rules.dense_bayes_by_backprop import DenseBayesByBackpropRule
from tfdpbnn.clipping.rules.dense_variational import DenseVariationalRule
from tfdpbnn.clipping.rules.embedding import EmbeddingRule
from tfdpbnn.clipping.rules.heteroscedastic_head import HeteroscedasticHeadRule
from tfdpbnn.clipping.rules.layer_normalization import LayerNormalizationRule
from tfdpbnn.clipping.rules.noisy_conv2d import NoisyConv2DRule
from tfdpbnn.clipping.rules.noisy_dense import NoisyDenseRule
from tfdpbnn.clipping.rules.public_batch_normalization import CARRIED_REASON, PublicBatchNormalizationRule


def builtin_rules() -> list[tuple[type, ClippingRule]]:
    """``(layer_class, rule)`` for every layer type tfdpbnn clips fast out of the box."""
    from tfdpbnn import layers

    return [
        (tf.keras.layers.Dense, DenseRule()),
        (tf.keras.layers.Conv2D, Conv2DRule()),
        (tf.keras.layers.Embedding, EmbeddingRule()),
        (tf.keras.layers.LayerNormalization, LayerNormalizationRule()),
        (layers.DenseVariational, DenseVariationalRule()),
        (layers.Conv2DVariational, Conv2DVariationalRule()),
        (layers.DenseBayesByBackprop, DenseBayesByBackpropRule()),
        (layers.NoisyDense, NoisyDenseRule()),
        (layers.NoisyConv2D, NoisyConv2DRule()),
        (layers.PublicBatchNormalization, PublicBatchNormalizationRule()),
        (layers.HeteroscedasticHead, HeteroscedasticHeadRule()),
    ]


def register_builtin_rules() -> None:
    """Register every built-in rule, replacing earlier ones for those classes.

    Also marks the layers that need the jacobian path (``AppendPublicBatch``: carried public rows).
    """
    from tfdpbnn.layers import AppendPublicBatch

    for layer_class, rule in builtin_rules():
        register_rule(layer_class, rule)
    mark_unsupported(AppendPublicBatch, CARRIED_REASON)


__all__ = ["Conv2DRule", "Conv2DVariationalRule", "DenseBayesByBackpropRule", "DenseRule",
           "DenseVariationalRule", "EmbeddingRule", "HeteroscedasticHeadRule", "LayerNormalizationRule",
           "NoisyConv2DRule", "NoisyDenseRule", "PublicBatchNormalizationRule", "builtin_rules",
           "register_builtin_rules"]
