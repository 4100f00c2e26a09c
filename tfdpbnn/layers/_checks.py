"""Argument checks only the layers need; the generic checks are in ``tfdpbnn._validation``."""

from tfdpbnn._validation import check_padding, check_pair, check_positive_int


def refuse(kwargs: dict, reasons: dict) -> None:
    """Raise ``ValueError`` if ``kwargs`` holds a standard Keras argument this layer does not support.

    ``reasons`` maps each refused argument name to why it has no meaning here (what to use instead).
    """
    for name, why in reasons.items():
        if name in kwargs:
            raise ValueError(f"{name} is not supported: {why}")


def unit_dilation(value) -> tuple:
    """``dilation_rate``: only 1 (or (1, 1)): the per-example clipping rules assume undilated kernels."""
    rate = check_pair("dilation_rate", value)
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


def conv2d_arguments(filters, kernel_size, strides, padding, data_format, dilation_rate) -> tuple:
    """The checked ``(filters, kernel_size, strides, padding, data_format, dilation_rate)`` of a 2-D conv.

    For the convolutions that have a per-example clipping rule: NHWC and undilated.
    """
    return (check_positive_int("filters", filters), check_pair("kernel_size", kernel_size),
            check_pair("strides", strides), check_padding("padding", padding), channels_last(data_format),
            unit_dilation(dilation_rate))


__all__ = ["channels_last", "conv2d_arguments", "refuse", "unit_dilation"]
