"""Data for DP training: DIGITS (offline), TFDS loaders, Poisson-subsampled batches, sampling assertions."""

from tfdpbnn.data.digits import load_digits
from tfdpbnn.data.distributed import (
    distributed_poisson_batches,
    distributed_poisson_stream,
    poisson_stream,
    tfrecord_shards,
)
from tfdpbnn.data.poisson import poisson_batches
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
           "load_fashion_mnist", "load_mnist", "load_tfds", "poisson_batches", "poisson_stream",
           "tfrecord_shards"]
