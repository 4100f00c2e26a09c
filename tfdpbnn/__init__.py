"""tfdpbnn: differentially private Bayesian neural networks for Keras/TensorFlow 2.15.

The main names are re-exported here; see the subpackages for the rest:
``tfdpbnn.privacy`` (accountants, noise calibration), ``tfdpbnn.layers`` (Bayesian and noisy layers),
``tfdpbnn.optimizers`` (DP optimizers), ``tfdpbnn.uncertainty`` (MC prediction, calibration),
``tfdpbnn.data`` (DIGITS, TFDS loaders, Poisson batches), ``tfdpbnn.callbacks``.
"""

__version__ = "0.1.0"
