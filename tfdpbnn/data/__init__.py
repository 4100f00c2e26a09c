"""Data for DP training: DIGITS (offline), TFDS loaders, Poisson-subsampled batches."""

from tfdpbnn.data.digits import load_digits
from tfdpbnn.data.poisson import poisson_batches
from tfdpbnn.data.tfds_loaders import (
    DATASETS,
    DatasetNotAvailableError,
    load_cifar10,
    load_fashion_mnist,
    load_mnist,
    load_tfds,
)

__all__ = ["DATASETS", "DatasetNotAvailableError", "load_cifar10", "load_digits", "load_fashion_mnist",
           "load_mnist", "load_tfds", "poisson_batches"]
