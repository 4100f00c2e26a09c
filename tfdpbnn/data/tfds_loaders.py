"""MNIST, Fashion-MNIST and CIFAR-10 through TensorFlow Datasets, as numpy arrays scaled to [0, 1]."""

from __future__ import annotations

import os
import socket

import numpy as np

DATASETS = ("mnist", "fashion_mnist", "cifar10")
#: What installs tensorflow-datasets for these loaders (the ``tfds`` extra of setup.cfg).
TFDS_EXTRA_REQUIREMENT = "tfdpbnn[tfds]"
#: host TFDS downloads from first; resolved before a download so an offline machine fails in a second
#: instead of after minutes of retries.
_TFDS_HOST = "storage.googleapis.com"


class DatasetNotAvailableError(ValueError):
    """A TFDS data set is not prepared in ``data_dir`` and cannot be downloaded.

    The message says how to fetch it elsewhere and where to put it.
    """


def _default_data_dir():
    return os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def _how_to_fetch(name, data_dir):
    where = data_dir or os.environ.get("TFDS_DATA_DIR") or _default_data_dir()
    return (f"on a machine with internet access run: python -c \"import tensorflow_datasets as tfds; "
            f"tfds.builder('{name}', data_dir='DIR').download_and_prepare()\", then copy DIR/{name} to "
            f"{os.path.join(where, name)} (or pass that DIR as data_dir / --data-dir)")


def _offline_reason():
    """Why a download cannot work (no name resolution for the TFDS host), or None if it may work."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy may reach what local name resolution cannot
    try:
        socket.getaddrinfo(_TFDS_HOST, 443)
    except OSError as err:
        return f"cannot resolve {_TFDS_HOST} ({err})"
    return None


def load_tfds(name: str, data_dir=None, download: bool = True):
    """Return ``((x_train, y_train), (x_test, y_test))`` of a TFDS image classification set.

    Args:
      name: one of ``DATASETS``.
      data_dir: TFDS data directory (None: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
      download: let TFDS download and prepare the set if it is not in ``data_dir``.
    Images are float32 in [0, 1] with shape ``[H, W, C]``; labels int64.
    Raises ``DatasetNotAvailableError`` (a ``ValueError``) with a one-line fix when the set is neither
    prepared nor downloadable (offline machine or ``download=False``), and ``ImportError`` naming the extra
    when tensorflow-datasets is not installed (``pip install 'tfdpbnn[tfds]'``).
    """
    try:
        import tensorflow_datasets as tfds
    except ModuleNotFoundError as err:
        raise ImportError(f"load_tfds({name!r}) needs tensorflow-datasets, which is an optional extra: "
                          f"pip install '{TFDS_EXTRA_REQUIREMENT}'") from err

    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    try:
        splits = tfds.load(name, split=["train", "test"], as_supervised=True, data_dir=data_dir,
                           download=False)
    except AssertionError as err:  # TFDS: "Dataset mnist: could not find data in ..."
        if not download:
            raise DatasetNotAvailableError(f"{name} is not prepared in data_dir (download=False); "
                                           f"{_how_to_fetch(name, data_dir)}") from err
        offline = _offline_reason()
        if offline is not None:
            raise DatasetNotAvailableError(f"{name} is not prepared and cannot be downloaded: {offline}; "
                                           f"{_how_to_fetch(name, data_dir)}") from err
        try:
            splits = tfds.load(name, split=["train", "test"], as_supervised=True, data_dir=data_dir,
                               download=True)
        except Exception as download_err:  # network, checksum or disk errors from TFDS's downloader
            first_line = str(download_err).splitlines()[0] if str(download_err) else ""
            raise DatasetNotAvailableError(
                f"{name} could not be downloaded ({type(download_err).__name__}: {first_line[:200]}); "
                f"{_how_to_fetch(name, data_dir)}") from download_err
    out = []
    for split in splits:
        images, labels = [], []
        for x, y in tfds.as_numpy(split.batch(4096)):
            images.append(x)
            labels.append(y)
        out.append((np.concatenate(images).astype(np.float32) / 255.0,
                    np.concatenate(labels).astype(np.int64)))
    return tuple(out)


def load_mnist(data_dir=None, download=True):
    """MNIST (60000 train / 10000 test, 28x28x1): the DPVD paper's and Zhang et al.'s (2022) benchmark."""
    return load_tfds("mnist", data_dir=data_dir, download=download)


def load_fashion_mnist(data_dir=None, download=True):
    """Fashion-MNIST (60000 / 10000, 28x28x1)."""
    return load_tfds("fashion_mnist", data_dir=data_dir, download=download)


def load_cifar10(data_dir=None, download=True):
    """CIFAR-10 (50000 / 10000, 32x32x3): Davody et al.'s (2020) benchmark."""
    return load_tfds("cifar10", data_dir=data_dir, download=download)
