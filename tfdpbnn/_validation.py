"""Argument validation shared by every tfdpbnn module: a ``ValueError`` naming the argument and the range.

Nothing is clamped: a value outside its range is an error.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable


def _real(value: object) -> float | None:
    """``float(value)`` for a real number (bools excluded), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def _integer(value: object) -> int | None:
    """``int(value)`` for an integer (bools and floats such as 3.0 excluded), else None."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def check_positive(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite real number > 0, else raise ``ValueError``."""
    number = _real(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (allowed range (0, inf)); got {value!r}")
    return number


def check_nonnegative(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite real number >= 0, else raise ``ValueError``."""
    number = _real(value)
    if number is None or not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (allowed range [0, inf)); got {value!r}")
    return number


def check_nonnegative_or_inf(name: str, value: object) -> float:
    """Return ``value`` as float if it is a real number >= 0 or +inf (e.g. a target epsilon), else raise."""
    number = _real(value)
    if number is None or math.isnan(number) or number < 0:
        raise ValueError(f"{name} must be a number >= 0 or inf (allowed range [0, inf]); got {value!r}")
    return number


def check_open_unit(name: str, value: object) -> float:
    """Return ``value`` as float if 0 < value < 1 (e.g. delta), else raise ``ValueError``."""
    number = _real(value)
    if number is None or not 0 < number < 1:
        raise ValueError(f"{name} must be a number in the open interval (0, 1); got {value!r}")
    return number


def check_sample_rate(name: str, value: object) -> float:
    """Return ``value`` as float if 0 < value <= 1 (a sampling probability), else raise ``ValueError``."""
    number = _real(value)
    if number is None or not 0 < number <= 1:
        raise ValueError(f"{name} must be a number in the interval (0, 1]; got {value!r}")
    return number


def check_real(name: str, value: object, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
    """Return ``float(value)`` if it is finite and inside the stated interval, else raise ``ValueError``.

    ``low``/``high``: bounds (None: unbounded); ``low_open``/``high_open``: exclude the bound itself.
    """
    number = _real(value)
    if number is None or not math.isfinite(number):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    bad_low = low is not None and (number <= low if low_open else number < low)
    bad_high = high is not None and (number >= high if high_open else number > high)
    if bad_low or bad_high:
        lo = "(-inf" if low is None else ("(" if low_open else "[") + repr(float(low))
        hi = "inf)" if high is None else repr(float(high)) + (")" if high_open else "]")
        raise ValueError(f"{name} must lie in {lo}, {hi}, got {number!r}")
    return number


def check_nonnegative_int(name: str, value: object) -> int:
    """Return ``value`` as int if it is an integer >= 0 (floats like 3.0 are refused), else raise."""
    integer = _integer(value)
    if integer is None or integer < 0:
        raise ValueError(f"{name} must be an integer >= 0 (allowed range [0, inf)); got {value!r}")
    return integer


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as int if it is an integer >= 1, else raise ``ValueError``."""
    integer = _integer(value)
    if integer is None or integer < 1:
        raise ValueError(f"{name} must be an integer >= 1 (allowed range [1, inf)); got {value!r}")
    return integer


def check_pair(name: str, value: object) -> tuple[int, int]:
    """Normalize an int or a pair of ints >= 1 (kernel size, strides) to a tuple of two ints."""
    single = _integer(value)
    items: tuple[object, ...]
    if single is not None:
        items = (single, single)
    elif isinstance(value, Iterable) and not isinstance(value, str):
        items = tuple(value)
    else:
        items = ()
    pair = [_integer(v) for v in items]
    if len(pair) != 2 or any(v is None or v < 1 for v in pair):
        raise ValueError(f"{name} must be an integer >= 1 or a pair of them, got {value!r}")
    return (int(pair[0] or 0), int(pair[1] or 0))


def check_padding(name: str, value: object) -> str:
    """Return a convolution padding mode lower-cased; allowed: 'valid', 'same' (any case)."""
    if not isinstance(value, str) or value.lower() not in ("valid", "same"):
        raise ValueError(f"{name} must be 'valid' or 'same', got {value!r}")
    return value.lower()


def check_choice(name: str, value: object, choices: Iterable[object]) -> object:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing the allowed values."""
    allowed = tuple(choices)
    if value not in allowed:
        listing = ", ".join(repr(c) for c in allowed)
        raise ValueError(f"{name} must be one of {listing}; got {value!r}")
    return value


__all__ = ["check_choice", "check_nonnegative", "check_nonnegative_int", "check_open_unit", "check_padding",
           "check_pair", "check_positive", "check_positive_int", "check_real", "check_sample_rate"]
