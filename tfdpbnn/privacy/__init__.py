"""Privacy accounting for DP training: accountants, DP-SGD events, epsilon and noise calibration.

The Gaussian noise of the DP step (and of the noisy layers' weights under ``SIDPOptimizer``) is drawn by
``tfdpbnn.privacy.noise``: exact tails, the run's own key, secure mode; what the accounting assumes of it.

Accountants (all ``dp_accounting.PrivacyAccountant`` subclasses, swappable with dp-accounting's):
"rdp", "pld" (dp-accounting), "zcdp" (``ZCDPAccountant``), "gdp" (``GDPAccountant``, approximate under
subsampling), "ac" (``AdvancedCompositionAccountant``, Ermis & Cemgil's (2017a) DPVD-AC). See docs/privacy.md.
"""

from tfdpbnn.privacy.advanced_composition import AdvancedCompositionAccountant
from tfdpbnn.privacy.budget import SAMPLINGS, calibrate_noise, compute_epsilon, dp_sgd_event, steps_per_epoch
from tfdpbnn.privacy.gdp import GDPAccountant, GDPApproximationWarning, gdp_delta, gdp_epsilon
from tfdpbnn.privacy.registry import (
    available_accountants,
    get_accountant,
    register_accountant,
    sound_accountants,
)
from tfdpbnn.privacy.zcdp import ZCDPAccountant

__all__ = [
    "SAMPLINGS",
    "AdvancedCompositionAccountant",
    "GDPAccountant",
    "GDPApproximationWarning",
    "ZCDPAccountant",
    "available_accountants",
    "calibrate_noise",
    "compute_epsilon",
    "dp_sgd_event",
    "gdp_delta",
    "gdp_epsilon",
    "get_accountant",
    "register_accountant",
    "sound_accountants",
    "steps_per_epoch",
]
