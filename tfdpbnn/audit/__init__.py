"""Empirical privacy auditing: lower bounds on epsilon measured by training with canaries."""

from tfdpbnn.audit.bounds import (
    GDPResult,
    MultiRunResult,
    OneRunResult,
    clopper_pearson_lower,
    clopper_pearson_upper,
    gdp_lower_bound,
    max_multi_run_epsilon,
    multi_run_epsilon,
    one_run_epsilon,
    one_run_epsilon_from_counts,
    one_run_p_value,
)
from tfdpbnn.audit.canaries import (
    canary_losses,
    canary_weights,
    gradient_canary_data,
    mislabeled_canaries,
    sample_inclusion,
    with_gradient_canaries,
)
from tfdpbnn.audit.gradient_audit import GradientCanaryAudit
from tfdpbnn.audit.multi_run import multi_run_scores
from tfdpbnn.audit.scores import UpdateRecorder, displacement_scores, likelihood_ratio_scores, update_unit

__all__ = [
    "GradientCanaryAudit",
    "UpdateRecorder",
    "canary_losses",
    "canary_weights",
    "displacement_scores",
    "gradient_canary_data",
    "likelihood_ratio_scores",
    "mislabeled_canaries",
    "multi_run_scores",
    "sample_inclusion",
    "update_unit",
    "with_gradient_canaries",
    "MultiRunResult",
    "GDPResult",
    "OneRunResult",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "gdp_lower_bound",
    "max_multi_run_epsilon",
    "multi_run_epsilon",
    "one_run_epsilon",
    "one_run_epsilon_from_counts",
    "one_run_p_value",
]
