"""Poisson sampling over a stream from disk (``poisson_stream``) on a generated TFRecord set, and the
argument checks of ``tfdpbnn.data.distributed`` (the multi-replica cases run in tests/test_distributed.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import tfdpbnn
from tfdpbnn.data.distributed import (
    check_distributed_input,
    distributed_poisson_batches,
    poisson_stream,
    tfrecord_shards,
)

# Not in the fast tier (./scripts/test --fast): TFRecord sets written and streamed.
pytestmark = pytest.mark.slow


def write_records(path, n, files=1):
    """n records (id, 3 features) over ``files`` TFRecord files; returns the file names."""
    names = [str(path / f"part-{k}.tfrecord") for k in range(files)]
    writers = [tf.io.TFRecordWriter(name) for name in names]
    for i in range(n):
        example = tf.train.Example(features=tf.train.Features(feature={
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, 2.0 * i, -1.0 * i]))}))
        writers[i % files].write(example.SerializeToString())
    for w in writers:
        w.close()
    return names


def parse(record):
    f = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64),
                                            "x": tf.io.FixedLenFeature([3], tf.float32)})
    return f["x"], f["id"]


def test_stream_batches_are_poisson_samples_of_the_records(tmp_path):
    n, q, steps = 200, 0.1, 60
    records = tf.data.TFRecordDataset(write_records(tmp_path, n, files=3)).map(parse)
    data = poisson_stream(records, q, n, steps_per_epoch=steps, chunk_size=64)
    first = [ids.numpy().tolist() for _, ids in data.take(3)]
    assert first != [ids.numpy().tolist() for _, ids in data.take(3)]   # every iteration is a fresh draw
    sizes, counts = [], np.zeros(n)
    for x, ids in data:
        ids = ids.numpy()
        assert len(set(ids)) == len(ids)                          # each record at most once per batch
        np.testing.assert_allclose(x.numpy()[:, 1], 2.0 * ids)    # features stay with their record
        sizes.append(len(ids))
        counts[ids] += 1
    assert len(sizes) == steps
    # The draws are fresh (OS entropy), so each bound is set by its false-alarm probability.
    # Memberships pooled over records and steps: Binomial(12000, q); exact test at level 1e-7 (it was 1e-3:
    # one run in a thousand failed). A rate off by 1.5x is 18 standard deviations away.
    assert stats.binomtest(int(counts.sum()), n * steps, q).pvalue > 1e-7
    # Batch sizes: the mean of Binomial(200, 0.1) within 6 standard errors (2e-9; 5 was 5.7e-7).
    assert abs(np.mean(sizes) - n * q) < 6 * np.sqrt(n * q * (1 - q) / len(sizes))
    # Memberships of one step are independent of the next: correlation of consecutive batch sizes ~ 0
    # (59 pairs: |r| >= 5 / sqrt(60) with probability about 1e-8, Fisher z).
    assert abs(np.corrcoef(sizes[:-1], sizes[1:])[0, 1]) < 5 / np.sqrt(len(sizes))


def test_stream_keeps_empty_batches_and_trains(tmp_path):
    n, q = 50, 0.02   # P(empty batch) = 0.98^50 = 0.36
    records = tf.data.TFRecordDataset(write_records(tmp_path, n)).map(parse)
    # A fixed sampling seed (what is tested is that empty batches are kept, not that the draw is fresh):
    # with fresh draws, at most 3 empty batches of 30 happened with probability 1.2e-3.
    batches = [ids.numpy() for _, ids in poisson_stream(records, q, n, steps_per_epoch=30, seed=3,
                                                          debug_fixed_seed=True)]
    assert len(batches) == 30 and sum(len(b) == 0 for b in batches) > 3
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.01, num_examples=n, batch_size=1,
                                 sampling="poisson", delta=1e-5)
    model.compile(opt, loss="mse")
    model.fit(poisson_stream(records.map(lambda x, i: (x, tf.cast(i, tf.float32))), q, n,
                             steps_per_epoch=5), epochs=2, verbose=0)
    assert int(opt.iterations.numpy()) == 10


def test_stream_checks_the_record_count_and_arguments(tmp_path):
    records = tf.data.TFRecordDataset(write_records(tmp_path, 10)).map(parse)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_examples"):
        for _ in poisson_stream(records, 0.5, 12, steps_per_epoch=1):
            pass
    with pytest.raises(ValueError, match="seed"):
        poisson_stream(records, 0.5, 10, seed=3)
    with pytest.raises(ValueError, match="sample_rate"):
        poisson_stream(records, 1.5, 10)
    with pytest.raises(ValueError, match="num_examples"):
        poisson_stream(records, 0.5, 0)
    with pytest.raises(ValueError, match="dataset"):
        poisson_stream(np.zeros(3), 0.5, 3)
    with pytest.raises(ValueError, match="fixed shape"):
        poisson_stream(tf.data.Dataset.from_generator(lambda: iter([[1.0]]), output_signature=tf.TensorSpec(
            [None], tf.float32)), 0.5, 1)
    # A debug seed reproduces the batches.
    def ids(stream):
        return [b.numpy().tolist() for _, b in stream]

    assert ids(poisson_stream(records, 0.5, 10, 3, seed=4, debug_fixed_seed=True)) == \
        ids(poisson_stream(records, 0.5, 10, 3, seed=4, debug_fixed_seed=True))


def test_tfrecord_shards_are_disjoint_and_cover_the_records(tmp_path):
    for files in (1, 4):
        folder = tmp_path / f"f{files}"
        folder.mkdir()
        shard_fn = tfrecord_shards(write_records(folder, 30, files), parse)
        seen = [sorted(int(i) for _, i in shard_fn(k, 3)) for k in range(3)]
        assert sorted(sum(seen, [])) == list(range(30))
    with pytest.raises(ValueError, match="files"):
        tfrecord_shards([], parse)


def test_single_worker_input_passes_the_multi_worker_check():
    strategy = tf.distribute.get_strategy()
    check_distributed_input(strategy, tf.data.Dataset.range(3))
    check_distributed_input(strategy, np.zeros(3), shuffle=True)
    with pytest.raises(ValueError, match="sample_rate"):
        distributed_poisson_batches(strategy, np.zeros((4, 1)), sample_rate=0)
