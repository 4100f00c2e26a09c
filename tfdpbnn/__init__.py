"""tfdpbnn: differentially private Bayesian neural networks for Keras 2 and Keras 3 on TensorFlow.

The main names are re-exported here; see the subpackages for the rest:
``tfdpbnn.privacy`` (accountants, noise calibration), ``tfdpbnn.layers`` (Bayesian and noisy layers),
``tfdpbnn.optimizers`` (DP optimizers), ``tfdpbnn.uncertainty`` (MC prediction, calibration),
``tfdpbnn.data`` (DIGITS, TFDS loaders, Poisson batches), ``tfdpbnn.callbacks``, ``tfdpbnn.record``
(the privacy record: ledgers, run store, releases, statement).
"""

# The release version; setup.cfg reads it (``attr: tfdpbnn.__version__``, a literal parsed without importing).
__version__ = "0.1.0"

# First of all: which Keras tf.keras is (Keras 2 or 3; tfdpbnn._adapters), or one clear ImportError.
from tfdpbnn import _keras_version  # noqa: E402

_keras_version.select()

from tfdpbnn import privacy  # noqa: E402,F401
from tfdpbnn.privacy import (  # noqa: E402,F401
    AdvancedCompositionAccountant,
    GDPAccountant,
    ZCDPAccountant,
    calibrate_noise,
    compute_epsilon,
    get_accountant,
)

# isort: split
from tfdpbnn.export import export_saved_model, read_privacy  # noqa: E402,F401
from tfdpbnn.layers import (  # noqa: E402,F401
    AppendPublicBatch,
    Conv2DVariational,
    DenseBayesByBackprop,
    DenseVariational,
    DropPublicBatch,
    MCDropout,
    NoisyConv2D,
    NoisyDense,
    PublicBatchNormalization,
    mc_sampling,
)
from tfdpbnn.uncertainty import (  # noqa: E402,F401
    ExpectedCalibrationError,
    HeteroscedasticGaussianNLL,
    HeteroscedasticHead,
    MaximumCalibrationError,
    expected_calibration_error,
    heteroscedastic_nll,
    maximum_calibration_error,
    mc_predict,
    reliability_diagram,
)

# isort: split
from tfdpbnn import callbacks, data, preprocessing  # noqa: E402,F401
from tfdpbnn.callbacks import PosteriorSampler, PrivacyCallback  # noqa: E402,F401
from tfdpbnn.optimizers import (  # noqa: E402,F401
    DPAdamOptimizer,
    DPGradients,
    DPMechanism,
    DPSGDOptimizer,
    DPSGLDOptimizer,
    DPVDOptimizer,
    SIDPOptimizer,
)

# isort: split
from tfdpbnn.clipping import ClippingRule, clipped_gradients, register_rule  # noqa: E402,F401
