"""Bayesian and noisy Keras layers (Ermis & Cemgil 2017; Zhang et al. 2023; Davody et al. 2020).

Also the heteroscedastic regression head and the MC sampling switch; see docs/layers.md.
"""

from tfdpbnn.layers.bayes_by_backprop import DenseBayesByBackprop
from tfdpbnn.layers.dropout import MCDropout
from tfdpbnn.layers.heteroscedastic import HeteroscedasticHead
from tfdpbnn.layers.multiplicity import (
    AugmentationCopies,
    CopiesSparseCategoricalCrossentropy,
    augment_digit_counts,
)
from tfdpbnn.layers.noisy import NoisyConv2D, NoisyDense
from tfdpbnn.layers.normalization import AppendPublicBatch, DropPublicBatch, PublicBatchNormalization
from tfdpbnn.layers.sampling import mc_sampling, mc_sampling_active
from tfdpbnn.layers.variational import LOG_ALPHA_RANGE, Conv2DVariational, DenseVariational, log_uniform_kl

__all__ = [
    "AppendPublicBatch", "AugmentationCopies", "Conv2DVariational", "CopiesSparseCategoricalCrossentropy",
    "DenseBayesByBackprop", "DenseVariational", "DropPublicBatch", "HeteroscedasticHead", "LOG_ALPHA_RANGE",
    "MCDropout", "NoisyConv2D", "NoisyDense", "PublicBatchNormalization", "augment_digit_counts",
    "log_uniform_kl", "mc_sampling", "mc_sampling_active",
]
