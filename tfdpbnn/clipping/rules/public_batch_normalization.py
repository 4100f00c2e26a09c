"""Clipping rule of ``tfdpbnn.layers.PublicBatchNormalization`` in stored mode; carried mode has none."""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn.clipping.rules.affine_normalization import AffineNormalizationRule

CARRIED_REASON = ("public rows carried through the network: every layer before a carried "
                  "PublicBatchNormalization gets gradient through the public statistics")


class PublicBatchNormalizationRule(AffineNormalizationRule):
    """``y = gamma xhat + beta`` with xhat from a stored public batch.

    The forward pass is the layer's own (``normalize``, then ``scale_and_shift``), run once.
    """

    def unsupported_reason(self, layer):
        if layer.carried:
            return "carried=True: the statistics depend on earlier layers' weights through the public rows"
        return None

    def param_axes(self, layer, rank):
        return [layer.feature_axis]

    def forward_normalized(self, layer, call, inputs, *args, **kwargs):
        xhat = layer.normalize(tf.convert_to_tensor(inputs))
        return layer.scale_and_shift(xhat), xhat
