"""Data for DP training: DIGITS (offline), public MNIST-5k in DIGITS' format, TFDS loaders, Poisson batches.

Also sampling assertions.
"""

from tfdpbnn.data.digits import load_digits
from tfdpbnn.data.distributed import (
    distributed_poisson_batches,
    distributed_poisson_stream,
    poisson_stream,
    tfrecord_shards,
)
from tfdpbnn.data.poisson import poisson_batches
from tfdpbnn.data.public import load_mnist5k_as_digits, mnist_to_digits
from tfdpbnn.data.sampling import SamplingSpec, assert_sampling
from tfdpbnn.data.tfds_loaders import (
    DATASETS,
    DatasetNotAvailableError,
    load_cifar10,
    load_fashion_mnist,
    load_mnist,
    load_tfds,
)

__all__ = ["DATASETS", "DatasetNotAvailableError", "SamplingSpec", "assert_sampling",
           "distributed_poisson_batches", "distributed_poisson_stream", "load_cifar10", "load_digits",
           "load_fashion_mnist", "load_mnist", "load_mnist5k_as_digits", "load_tfds",
           "mnist_to_digits", "poisson_batches", "poisson_stream",
           "tfrecord_shards"]
