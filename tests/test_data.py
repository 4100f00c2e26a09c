"""tfdpbnn.data: DIGITS split, TFDS loaders on mock data, Poisson batches ~ Binomial(n, q)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tfdpbnn.data import load_cifar10, load_digits, load_fashion_mnist, load_mnist, load_tfds, poisson_batches


def test_digits_split_scaling_and_determinism():
    (x_train, y_train), (x_test, y_test) = load_digits()
    assert x_train.shape == (1437, 64) and x_test.shape == (360, 64)  # Ermis & Cemgil 2017a/b: 360 test
    assert x_train.dtype == np.float32 and x_train.min() == 0.0 and x_train.max() == 1.0
    assert set(np.unique(y_train)) == set(range(10))
    (x2, _), (x2_test, _) = load_digits()
    np.testing.assert_array_equal(x_train, x2)
    np.testing.assert_array_equal(x_test, x2_test)
    (x3, _), _ = load_digits(seed=1)
    assert not np.array_equal(x_train, x3)
    images = load_digits(flatten=False)[0][0]
    assert images.shape == (1437, 8, 8, 1)
    # train and test together are exactly sklearn's 1797 images (a permutation, nothing lost or repeated)
    from sklearn.datasets import load_digits as sk_load

    all_rows = np.concatenate([x_train, x_test])
    reference = (sk_load().data / 16.0).astype(np.float32)
    assert sorted(map(bytes, all_rows)) == sorted(map(bytes, reference))
    with pytest.raises(ValueError, match="test_size"):
        load_digits(test_size=0)


@pytest.mark.parametrize("loader,shape", [(load_mnist, (28, 28, 1)), (load_fashion_mnist, (28, 28, 1)),
                                          (load_cifar10, (32, 32, 3))])
def test_tfds_loaders_on_mock_data(loader, shape, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed (the Keras 3 "
                               "test set installs only the public extra)")
    with tfds.testing.mock_data(num_examples=6, data_dir=str(tmp_path)):
        (x_train, y_train), (x_test, y_test) = loader(data_dir=str(tmp_path))
    assert x_train.shape == (6,) + shape and x_test.shape == (6,) + shape
    assert x_train.dtype == np.float32 and x_train.min() >= 0.0 and x_train.max() <= 1.0
    assert y_train.dtype == np.int64 and y_train.shape == (6,)
    with pytest.raises(ValueError, match="name"):
        load_tfds("imagenet")


def test_poisson_batch_sizes_follow_binomial():
    n, q, steps = 200, 0.1, 100
    x = np.arange(n, dtype=np.float32)[:, None]
    y = np.arange(n)
    ds = poisson_batches(x, y, sample_rate=q, steps_per_epoch=steps, seed=42, debug_fixed_seed=True)
    sizes, counts = [], np.zeros(n)
    for _epoch in range(4):  # each iteration of the dataset is a fresh draw
        for xb, yb in ds:
            np.testing.assert_array_equal(xb.numpy()[:, 0].astype(int), yb.numpy())  # pairs stay together
            sizes.append(len(yb))
            counts[yb.numpy()] += 1
    sizes = np.array(sizes)
    # Chi-square goodness of fit of 400 batch sizes to Binomial(200, 0.1), bins with expected count >= 5.
    edges = [0, 14, 16, 18, 20, 22, 24, 26, n + 1]
    observed = np.histogram(sizes, bins=edges)[0]
    cdf = stats.binom.cdf(np.array(edges) - 1, n, q)
    expected = np.diff(cdf) * len(sizes)
    assert expected.min() >= 5
    _, p_value = stats.chisquare(observed, expected * observed.sum() / expected.sum())
    assert p_value > 1e-3
    # each example joins each batch with probability q: inclusion counts ~ Binomial(400, 0.1)
    assert abs(counts.mean() - 400 * q) < 5 * np.sqrt(400 * q * (1 - q) / n)
    again = [len(b[1]) for b in poisson_batches(x, y, sample_rate=q, steps_per_epoch=steps, seed=42,
                                                debug_fixed_seed=True)]
    assert again == list(sizes[:steps])  # seeded: reproducible
    assert list(sizes[:steps]) != list(sizes[steps:2 * steps])  # but epochs differ


def test_poisson_batches_default_steps_and_bad_input():
    x = np.zeros((30, 2), np.float32)
    assert len(list(poisson_batches(x, sample_rate=0.25))) == 4  # ceil(1 / q)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="sample_rate"):
            poisson_batches(x, sample_rate=bad)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        poisson_batches(x, sample_rate=0.5, steps_per_epoch=0)
    with pytest.raises(ValueError, match="same number of examples"):
        poisson_batches(x, np.zeros(5), sample_rate=0.5)
