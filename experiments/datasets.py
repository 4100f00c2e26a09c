"""The data sets of the reproduction experiments: DIGITS (bundled) or MNIST from a prepared TFDS directory.

MNIST is read with ``download=False``: an experiment never downloads. Without the prepared data it stops with
a ``ValueError`` that starts with ``data_dir:`` and says how to prepare it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DATASETS", "load_flat", "resolve_dataset"]

DATASETS = ("digits", "mnist")


def resolve_dataset(experiment: str, dataset: str | None, data_dir: str | None) -> str:
    """The data set an experiment runs on.

    ``dataset`` if given, else "mnist" with a ``data_dir``, else "digits". A ``data_dir`` with
    ``dataset="digits"`` is an error (DIGITS is bundled: it would be ignored).
    """
    dataset = dataset or ("mnist" if data_dir is not None else "digits")
    if dataset not in DATASETS:
        raise ValueError(f"dataset: must be one of {DATASETS}, got {dataset!r}")
    if dataset == "digits" and data_dir is not None:
        raise ValueError(f"data_dir: the DIGITS variant of {experiment} uses the bundled data and no "
                         "data_dir; leave dataset unset or pass dataset='mnist'")
    return dataset


def load_flat(dataset: str, data_dir: str | None, experiment: str):
    """Load ``((x_train, y_train), (x_test, y_test))`` with flat float32 inputs in [0, 1].

    DIGITS has 64 features, MNIST 784; int32 training and int64 test labels. MNIST is read from ``data_dir``
    (None: TFDS's default directory), never downloaded.
    """
    from tfdpbnn import data

    if dataset not in DATASETS:
        raise ValueError(f"dataset: must be one of {DATASETS}, got {dataset!r}")
    if dataset == "digits":
        (x_train, y_train), (x_test, y_test) = data.load_digits()
    else:
        try:
            (x_train, y_train), (x_test, y_test) = data.load_mnist(data_dir=data_dir, download=False)
        except data.DatasetNotAvailableError as err:
            where = repr(data_dir) if data_dir is not None else "TFDS's default directory"
            raise ValueError(
                f"data_dir: no prepared TFDS 'mnist' in {where}; {experiment} never downloads. Prepare it "
                "where there is network access (e.g. tfds.builder('mnist', data_dir=...)"
                ".download_and_prepare()) and pass that directory") from err
    x_train = np.asarray(x_train, np.float32).reshape(len(x_train), -1)
    x_test = np.asarray(x_test, np.float32).reshape(len(x_test), -1)
    return (x_train, np.asarray(y_train).astype(np.int32)), (x_test, np.asarray(y_test).astype(np.int64))
