"""Differentially private optimizers for Bayesian neural networks.

Each is a subclass of a tensorflow-privacy vectorized Keras optimizer on Keras 2, and of
``keras.optimizers.SGD``/``Adam`` on Keras 3 (``tfdpbnn._adapters``), and is used as any Keras optimizer:
``model.compile(optimizer=tfdpbnn.DPVDOptimizer(...), loss=..., metrics=...)``, ``model.fit(...)``.
Importing this package changes nothing in Keras; the first DP optimizer constructed installs the ``fit``
integration (``tfdpbnn.optimizers.keras_integration``). Every optimizer takes its DP step through one
``DPMechanism`` (``optimizer.mechanism``), which custom training loops use directly.
"""

from tfdpbnn.optimizers.base import DPOptimizerMixin
from tfdpbnn.optimizers.dpsgd import DPAdamOptimizer, DPSGDOptimizer
from tfdpbnn.optimizers.dpsgld import DPSGLDOptimizer, sgld_learning_rate, sgld_noise_multiplier
from tfdpbnn.optimizers.dpvd import DPVDOptimizer
from tfdpbnn.optimizers.mechanism import DPGradients, DPMechanism
from tfdpbnn.optimizers.per_example_loss import compiled_per_example_loss_fn
from tfdpbnn.optimizers.sidp import SIDPOptimizer

__all__ = [
    "DPAdamOptimizer",
    "DPGradients",
    "DPMechanism",
    "DPOptimizerMixin",
    "DPSGDOptimizer",
    "DPSGLDOptimizer",
    "DPVDOptimizer",
    "SIDPOptimizer",
    "compiled_per_example_loss_fn",
    "sgld_learning_rate",
    "sgld_noise_multiplier",
]
