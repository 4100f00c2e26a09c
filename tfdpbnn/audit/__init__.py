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
from tfdpbnn.audit.fdp_one_run import FdpOneRunResult, fdp_claim_rejected, one_run_gdp_bound
from tfdpbnn.audit.gradient_audit import GradientCanaryAudit
from tfdpbnn.audit.multi_run import multi_run_scores
from tfdpbnn.audit.mutations import MUTATIONS, PIPELINE_MUTATIONS, STEP_MUTATIONS, inject_bug
from tfdpbnn.audit.participation import ParticipationRecorder
from tfdpbnn.audit.sampling import SamplingAuditResult, audit_participation, sampling_audit
from tfdpbnn.audit.scores import UpdateRecorder, displacement_scores, likelihood_ratio_scores, update_unit
from tfdpbnn.audit.shift import ShiftBound, paired_shift_bound, paired_shift_power
from tfdpbnn.audit.step import StepAuditor, StepAuditResult, step_audit
from tfdpbnn.audit.traced import TracedAuditResult, method_traced_audit, traced_audit

__all__ = [
    "FdpOneRunResult",
    "MUTATIONS",
    "PIPELINE_MUTATIONS",
    "STEP_MUTATIONS",
    "fdp_claim_rejected",
    "one_run_gdp_bound",
    "ParticipationRecorder",
    "SamplingAuditResult",
    "ShiftBound",
    "StepAuditResult",
    "StepAuditor",
    "audit_participation",
    "inject_bug",
    "paired_shift_bound",
    "paired_shift_power",
    "sampling_audit",
    "step_audit",
    "TracedAuditResult",
    "method_traced_audit",
    "traced_audit",
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
