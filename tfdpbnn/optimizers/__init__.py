"""Differentially private optimizers for Bayesian neural networks.

Each is a subclass of a tensorflow-privacy vectorized Keras optimizer and is used as any Keras optimizer:
``model.compile(optimizer=tfdpbnn.DPVDOptimizer(...), loss=..., metrics=...)``, ``model.fit(...)``.
Importing this package installs the train-step hook (``tfdpbnn.optimizers.train_step``).
"""

from tfdpbnn.optimizers import train_step as _train_step
from tfdpbnn.optimizers.base import DPOptimizerMixin
from tfdpbnn.optimizers.dpsgd import DPAdamOptimizer, DPSGDOptimizer
from tfdpbnn.optimizers.dpsgld import DPSGLDOptimizer, sgld_learning_rate, sgld_noise_multiplier
from tfdpbnn.optimizers.dpvd import DPVDOptimizer
from tfdpbnn.optimizers.per_example_loss import compiled_per_example_loss_fn
from tfdpbnn.optimizers.sidp import SIDPOptimizer

_train_step.install()

__all__ = [
    "DPAdamOptimizer",
    "DPOptimizerMixin",
    "DPSGDOptimizer",
    "DPSGLDOptimizer",
    "DPVDOptimizer",
    "SIDPOptimizer",
    "compiled_per_example_loss_fn",
    "sgld_learning_rate",
    "sgld_noise_multiplier",
]
