"""Per-example gradient clipping engines for the DP optimizers.

``clipped_gradients(...)`` is the one entry point the optimizers call: a forward pass, the per-example data
losses, ``sum_i min(1, C/||g_i||) g_i`` and the gradient of the data-independent losses (``model.losses``).
"""

from tfdpbnn.clipping.engine import clipped_gradients
from tfdpbnn.clipping.independence import check_per_example_independence
from tfdpbnn.clipping.jacobian import clip_factors, jacobian_clipped_gradients
from tfdpbnn.clipping.result import ClippedGradients

__all__ = [
    "ClippedGradients",
    "check_per_example_independence",
    "clip_factors",
    "clipped_gradients",
    "jacobian_clipped_gradients",
]
