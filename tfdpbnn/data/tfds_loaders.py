"""MNIST, Fashion-MNIST and CIFAR-10 through TensorFlow Datasets, as numpy arrays scaled to [0, 1]."""

from __future__ import annotations

import numpy as np

DATASETS = ("mnist", "fashion_mnist", "cifar10")


def load_tfds(name: str, data_dir=None, download: bool = True):
    """Return ``((x_train, y_train), (x_test, y_test))`` of a TFDS image classification set.

    Args:
      name: one of ``DATASETS``.
      data_dir: TFDS data directory (None: TFDS's default, ``~/tensorflow_datasets``).
      download: let TFDS download and prepare the set if it is not in ``data_dir``.
    Images are float32 in [0, 1] with shape ``[H, W, C]``; labels int64.
    """
    import tensorflow_datasets as tfds

    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    splits = tfds.load(name, split=["train", "test"], as_supervised=True, data_dir=data_dir,
                       download=download)
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
    """MNIST (60000 train / 10000 test, 28x28x1): the DPVD paper's and paper 003's benchmark."""
    return load_tfds("mnist", data_dir=data_dir, download=download)


def load_fashion_mnist(data_dir=None, download=True):
    """Fashion-MNIST (60000 / 10000, 28x28x1)."""
    return load_tfds("fashion_mnist", data_dir=data_dir, download=download)


def load_cifar10(data_dir=None, download=True):
    """CIFAR-10 (50000 / 10000, 32x32x3): paper 004's benchmark."""
    return load_tfds("cifar10", data_dir=data_dir, download=download)
