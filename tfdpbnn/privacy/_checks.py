"""Argument validation shared by tfdpbnn: a ``ValueError`` that names the argument and the allowed range.

Nothing is clamped: a value outside its range is an error. Other packages (optimizers, layers) reuse these.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive(name: str, value) -> float:
    """Return ``value`` as float if it is a finite real number > 0, else raise ``ValueError``."""
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (allowed range (0, inf)); got {value!r}")
    return float(value)


def check_nonnegative(name: str, value) -> float:
    """Return ``value`` as float if it is a finite real number >= 0, else raise ``ValueError``."""
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (allowed range [0, inf)); got {value!r}")
    return float(value)


def check_open_unit(name: str, value) -> float:
    """Return ``value`` as float if 0 < value < 1 (e.g. delta), else raise ``ValueError``."""
    if not _is_real(value) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number in the open interval (0, 1); got {value!r}")
    return float(value)


def check_sample_rate(name: str, value) -> float:
    """Return ``value`` as float if 0 < value <= 1 (a sampling probability), else raise ``ValueError``."""
    if not _is_real(value) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in the interval (0, 1]; got {value!r}")
    return float(value)


def check_nonnegative_int(name: str, value) -> int:
    """Return ``value`` as int if it is an integer >= 0 (floats like 3.0 are refused), else raise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (allowed range [0, inf)); got {value!r}")
    return int(value)


def check_positive_int(name: str, value) -> int:
    """Return ``value`` as int if it is an integer >= 1, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (allowed range [1, inf)); got {value!r}")
    return int(value)


def check_choice(name: str, value, choices: Iterable) -> object:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing the allowed values."""
    choices = tuple(choices)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    return value
