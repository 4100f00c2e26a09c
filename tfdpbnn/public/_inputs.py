"""One way to take public data: a ``tf.data.Dataset`` of (x, y) batches or an ``(x, y)`` pair of arrays."""

from __future__ import annotations

import tensorflow as tf


def as_dataset(name: str, data, batch_size: int | None):
    """``data`` as a batched ``tf.data.Dataset`` of (x, y).

    A Dataset is used as given (``batch_size`` must then be None: it is already batched); a pair (x, y) is
    batched by ``batch_size`` (default 128).
    """
    if isinstance(data, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError(f"batch_size must be None when {name} is a tf.data.Dataset (batch it yourself)")
        return data
    if isinstance(data, tuple | list) and len(data) == 2:
        x, y = data
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"{name}: x and y must be non-empty with the same length, got {len(x)} and "
                             f"{len(y)}")
        size = 128 if batch_size is None else batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(size)
    raise ValueError(f"{name} must be a tf.data.Dataset of (x, y) batches or a pair (x, y), got "
                     f"{type(data).__name__}")
