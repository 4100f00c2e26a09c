"""The privacy package's former home of the argument checks; they live in ``tfdpbnn._validation``."""

from tfdpbnn._validation import (
    check_choice,
    check_nonnegative,
    check_nonnegative_int,
    check_open_unit,
    check_positive,
    check_positive_int,
    check_sample_rate,
)

__all__ = ["check_choice", "check_nonnegative", "check_nonnegative_int", "check_open_unit", "check_positive",
           "check_positive_int", "check_sample_rate"]
