"""Clipping rule of ``tfdpbnn.uncertainty.HeteroscedasticHead``: an affine map ``[mu, log s^2] = x W + b``."""

from __future__ import annotations

from tfdpbnn.clipping.rules.dense import DenseRule


class HeteroscedasticHeadRule(DenseRule):
    """The head has no activation, so its output is the dense pre-activation: ``DenseRule`` applies as is."""
