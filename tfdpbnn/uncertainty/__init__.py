"""Uncertainty: MC prediction, heteroscedastic regression, calibration (Zhang et al. 2022, sec. 5.1).

Calibration metrics follow Guo et al. (2017).
"""

from tfdpbnn.uncertainty.calibration import (
    ExpectedCalibrationError,
    MaximumCalibrationError,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_diagram,
)
from tfdpbnn.uncertainty.mc import MCPrediction, mc_predict
from tfdpbnn.uncertainty.regression import (
    HeteroscedasticGaussianNLL,
    HeteroscedasticHead,
    heteroscedastic_nll,
)

__all__ = [
    "ExpectedCalibrationError", "HeteroscedasticGaussianNLL", "HeteroscedasticHead", "MCPrediction",
    "MaximumCalibrationError", "expected_calibration_error", "heteroscedastic_nll",
    "maximum_calibration_error", "mc_predict", "reliability_diagram",
]
