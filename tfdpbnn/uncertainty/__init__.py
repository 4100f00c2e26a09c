"""Uncertainty: MC prediction, heteroscedastic regression, calibration (Zhang et al. 2022, sec. 5.1).

Calibration metrics and temperature scaling follow Guo et al. (2017); private calibration and private
split-conformal prediction sets (Angelopoulos et al. 2022) report their privacy cost as a dp-accounting event.
The moving average of the DP iterates and a Gaussian fitted to them (``iterates``) cost no privacy.
"""

from tfdpbnn.record.private_release import PrivacyCost
from tfdpbnn.uncertainty.calibration import (
    ExpectedCalibrationError,
    MaximumCalibrationError,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_diagram,
)
from tfdpbnn.uncertainty.calibration_plan import CalibrationPlan, split_by_record
from tfdpbnn.uncertainty.conformal import (
    ConformalThreshold,
    conformal_privacy,
    conformal_threshold,
    conformity_scores,
    coverage_and_size,
    min_calibration_size,
    private_conformal_level,
    private_conformal_threshold,
)
from tfdpbnn.uncertainty.iterates import IterateAverage, IterateMoments
from tfdpbnn.uncertainty.mc import MCPrediction, mc_predict
from tfdpbnn.uncertainty.regression import (
    HeteroscedasticGaussianNLL,
    HeteroscedasticHead,
    heteroscedastic_nll,
)
from tfdpbnn.uncertainty.temperature import (
    TemperatureScaling,
    fit_temperature,
    fit_temperature_private,
    scale_probabilities,
    temperature_privacy,
)

__all__ = [
    "CalibrationPlan", "ConformalThreshold", "ExpectedCalibrationError", "HeteroscedasticGaussianNLL",
    "HeteroscedasticHead", "IterateAverage", "IterateMoments",
    "MCPrediction", "MaximumCalibrationError", "PrivacyCost", "TemperatureScaling", "conformal_privacy",
    "conformal_threshold",
    "conformity_scores", "coverage_and_size", "expected_calibration_error", "fit_temperature",
    "fit_temperature_private", "heteroscedastic_nll", "maximum_calibration_error", "mc_predict",
    "min_calibration_size", "private_conformal_level",
    "private_conformal_threshold", "reliability_diagram", "scale_probabilities", "split_by_record",
    "temperature_privacy",
]
