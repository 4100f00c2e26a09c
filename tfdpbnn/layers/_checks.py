"""The layers' former names for the argument checks of ``tfdpbnn._validation`` (one implementation)."""

from tfdpbnn._validation import check_pair as pair
from tfdpbnn._validation import check_positive_int as positive_int
from tfdpbnn._validation import check_real as finite_float


def padding(value: object) -> str:
    """``check_padding("padding", value)``: 'valid' or 'same', lower-cased."""
    from tfdpbnn._validation import check_padding

    return check_padding("padding", value)


__all__ = ["finite_float", "pair", "padding", "positive_int"]
