"""Bayesian and noisy Keras layers (papers 000, 003, 004) and the MC sampling switch; see docs/layers.md."""

from tfdpbnn.layers.bayes_by_backprop import DenseBayesByBackprop
from tfdpbnn.layers.dropout import MCDropout
from tfdpbnn.layers.noisy import NoisyConv2D, NoisyDense
from tfdpbnn.layers.normalization import AppendPublicBatch, DropPublicBatch, PublicBatchNormalization
from tfdpbnn.layers.sampling import mc_sampling, mc_sampling_active
from tfdpbnn.layers.variational import LOG_ALPHA_RANGE, Conv2DVariational, DenseVariational, log_uniform_kl

__all__ = [
    "AppendPublicBatch", "Conv2DVariational", "DenseBayesByBackprop", "DenseVariational", "DropPublicBatch",
    "LOG_ALPHA_RANGE", "MCDropout", "NoisyConv2D", "NoisyDense", "PublicBatchNormalization", "log_uniform_kl",
    "mc_sampling", "mc_sampling_active",
]
