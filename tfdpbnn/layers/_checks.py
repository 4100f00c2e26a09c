"""Argument checks for the layers: each raises ``ValueError`` naming the argument and the allowed range."""

from __future__ import annotations

import math
import numbers


def positive_int(name: str, value) -> int:
    """Return ``value`` if it is an integer >= 1, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def finite_float(name: str, value, low=None, high=None, low_open=False, high_open=False) -> float:
    """Return ``float(value)`` if finite and inside the stated interval, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    value = float(value)
    bad_low = low is not None and (value <= low if low_open else value < low)
    bad_high = high is not None and (value >= high if high_open else value > high)
    if bad_low or bad_high:
        lo = "(-inf" if low is None else ("(" if low_open else "[") + repr(float(low))
        hi = "inf)" if high is None else repr(float(high)) + (")" if high_open else "]")
        raise ValueError(f"{name} must lie in {lo}, {hi}, got {value!r}")
    return value


def pair(name: str, value) -> tuple:
    """Normalize an int or a pair of ints >= 1 (kernel size, strides) to a tuple of two ints."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    try:
        items = tuple(value)
    except TypeError:
        items = ()
    if len(items) != 2 or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1
                               for v in items):
        raise ValueError(f"{name} must be an integer >= 1 or a pair of them, got {value!r}")
    return (int(items[0]), int(items[1]))


def padding(value) -> str:
    """Return the padding mode upper-cased for ``tf.nn.conv2d``; allowed: 'valid', 'same'."""
    if not isinstance(value, str) or value.lower() not in ("valid", "same"):
        raise ValueError(f"padding must be 'valid' or 'same', got {value!r}")
    return value.lower()


def refuse(kwargs: dict, reasons: dict) -> None:
    """Raise ``ValueError`` if ``kwargs`` holds a standard Keras argument this layer does not support.

    ``reasons`` maps each refused argument name to why it has no meaning here (what to use instead).
    """
    for name, why in reasons.items():
        if name in kwargs:
            raise ValueError(f"{name} is not supported: {why}")


def unit_dilation(value) -> tuple:
    """``dilation_rate``: only 1 (or (1, 1)): the per-example clipping rules assume undilated kernels."""
    rate = pair("dilation_rate", value)
    if rate != (1, 1):
        raise ValueError(f"dilation_rate must be 1 (or (1, 1)), got {value!r}: the layer's per-example "
                         "clipping rule computes gradients for undilated convolutions only")
    return rate


def channels_last(value) -> str:
    """``data_format``: only "channels_last" (NHWC; None means the same), as the clipping rules assume."""
    if value not in (None, "channels_last"):
        raise ValueError(f"data_format must be 'channels_last' (or None), got {value!r}: the layer and its "
                         "per-example clipping rule are NHWC; move channels last with "
                         "tf.keras.layers.Permute((2, 3, 1))")
    return "channels_last"
