"""Per-example gradient clipping engines for the DP optimizers.

``clipped_gradients(...)`` is the one entry point the optimizers call: a forward pass, the per-example data
losses, ``sum_i min(1, C/||g_i||) g_i`` and the gradient of the data-independent losses (``model.losses``).
The fast "ghost" engine uses per-layer rules from a public registry (``register_rule``; the built-in rules,
one module per layer type in ``tfdpbnn.clipping.rules``, are registered here); models with a layer that has
no rule fall back to the "jacobian" reference with a warning.
"""

from tfdpbnn.clipping.engine import METHODS, clipped_gradients
from tfdpbnn.clipping.ghost import UnsupportedModelError, ghost_clipped_gradients
from tfdpbnn.clipping.independence import check_per_example_independence
from tfdpbnn.clipping.jacobian import clip_factors, jacobian_clipped_gradients, jacobian_clipped_sum
from tfdpbnn.clipping.registry import (
    ClippingRule,
    mark_unsupported,
    register_rule,
    registered_rules,
    rule_for,
    unregister_rule,
)
from tfdpbnn.clipping.result import ClippedGradients
from tfdpbnn.clipping.rules import register_builtin_rules

register_builtin_rules()

__all__ = [
    "METHODS",
    "ClippedGradients",
    "ClippingRule",
    "UnsupportedModelError",
    "check_per_example_independence",
    "clip_factors",
    "clipped_gradients",
    "ghost_clipped_gradients",
    "jacobian_clipped_gradients",
    "jacobian_clipped_sum",
    "mark_unsupported",
    "register_rule",
    "registered_rules",
    "rule_for",
    "unregister_rule",
]
