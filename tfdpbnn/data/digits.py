"""DIGITS: scikit-learn's bundled UCI handwritten digits, the benchmark of Ermis & Cemgil (2017a, 2017b)."""

from __future__ import annotations

import numpy as np

TEST_SIZE = 360


def load_digits(test_size: int = TEST_SIZE, seed: int = 0, flatten: bool = True):
    """Return ``((x_train, y_train), (x_test, y_test))`` of the 1797 8x8 digits, pixels scaled to [0, 1].

    Split as in Ermis & Cemgil (2017a, 2017b): ``test_size`` (360) test images, the rest (1437) for training,
    drawn by a
    fixed-seed permutation (``seed``). ``flatten``: images as 64-vectors, else ``[8, 8, 1]``. Labels int64.
    """
    from sklearn import datasets

    if isinstance(test_size, bool) or not isinstance(test_size, int | np.integer) \
            or not 0 < test_size < 1797:
        raise ValueError(f"test_size must be an integer in [1, 1796], got {test_size!r}")
    bunch = datasets.load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    if not flatten:
        x = x.reshape(-1, 8, 8, 1)
    return (x[test_size:], y[test_size:]), (x[:test_size], y[:test_size])
