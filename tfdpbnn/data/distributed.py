"""Poisson sampling across replicas and workers, and over data streamed from disk.

The accountants of DP-SGD (Abadi et al. 2016; Mironov et al. 2019's sampled Gaussian mechanism) assume that
at every step each of the n examples joins the batch independently with probability q. Under
``tf.distribute`` the global batch is the union of the replicas' batches, so that union must be one such
draw. Here the data is split into R disjoint shards (R = replicas in sync: shard ``g`` holds the examples
``i`` with ``i mod R = g``, or the records a ``shard_fn`` gives replica ``g``), and the replica that owns
shard ``g`` draws its own Bernoulli(q) mask over its shard at every step, from its own secret seed.

Why this is exactly Poisson sampling over all n examples: every example lies in exactly one shard, so its
membership in step t's global batch is the Bernoulli(q) draw of its shard's replica; draws of different
examples use different coordinates of one replica's stream or different replicas' independent streams, and
different steps use different step seeds, so all memberships are independent Bernoulli(q). No example can
be in two replicas' batches of one step (shards are disjoint). Accounting is then the single-device
Poisson accounting with sample rate q and expected global batch size q n (pass the DP optimizer
``sampling="poisson"``, ``batch_size = q n``, ``num_examples = n``); every replica takes part in every
step, possibly with an empty batch.

Seeds: nobody else may know which examples a batch holds (amplification), so by default each worker draws
its seed from the operating system's entropy (``secrets``), and replicas' streams differ by their shard
index. No shared seed has to travel between workers: disjoint shards make the union a Poisson draw without
one. A fixed ``seed`` is for debugging only (``debug_fixed_seed=True``); it is folded with the shard index
so shards still draw independently.

Data larger than memory (``poisson_stream``): each step reads the whole stream once and keeps each record
with probability q (a per-record Bernoulli filter), which is the same mechanism as the in-memory mask; a
step costs one pass over the data on disk.
"""

from __future__ import annotations

import numbers
import secrets

import numpy as np
import tensorflow as tf

from tfdpbnn._audit_hook import audit_bug
from tfdpbnn.data.poisson import check_debug_seed, check_rate_and_steps
from tfdpbnn.data.sampling import SamplingSpec, tag

_SHARD_SALT = 0x5D3A9C71


def _base_seed(seed, debug_fixed_seed):
    """The worker's secret seed (``secrets``), or the debug seed (``check_debug_seed``)."""
    check_debug_seed(seed, debug_fixed_seed)
    return secrets.randbits(63) if seed is None else int(seed)


def _shard_seed(base, shard):
    """A distinct 63-bit seed per shard (SeedSequence mixing of the base seed and the shard index)."""
    state = np.random.SeedSequence([base & (2 ** 63 - 1), shard, _SHARD_SALT]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def _step_seeds(seed, steps_per_epoch):
    """One int64 seed per step, a fresh sequence every time the dataset is iterated (every epoch).

    ``steps_per_epoch=None``: an endless sequence (distributed input, which ``model.fit`` iterates once).
    """
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    return seeds if steps_per_epoch is None else seeds.take(steps_per_epoch)


def _mask(step_seed, size, q, salt):
    if audit_bug("sample-rate-1.5x"):  # AUDIT BUG only: a rate other than the declared one
        q = q * audit_bug("sample-rate-1.5x")
    return tf.random.stateless_uniform([size], seed=tf.stack([step_seed, tf.cast(salt, tf.int64)])) < q


def _array_shard_batches(parts, shard, num_shards, q, steps_per_epoch, seed):
    """The batches of one shard of in-memory arrays: examples ``i mod num_shards == shard``."""
    shard_parts = [tf.nest.map_structure(lambda t: t[shard::num_shards], p) for p in parts]
    overlap = audit_bug("shard-overlap")
    if overlap is not None and shard == 1:  # AUDIT BUG only: shard 0's example ``overlap`` is also in shard 1
        shard_parts = [tf.nest.map_structure(lambda full, own: tf.concat([full[overlap:overlap + 1], own], 0),
                                             p, sp) for p, sp in zip(parts, shard_parts, strict=True)]
    size = int(tf.nest.flatten(shard_parts[0])[0].shape[0])

    def batch(s):
        mask = _mask(s, size, q, 7)
        picked = tuple(tf.nest.map_structure(lambda t: tf.boolean_mask(t, mask), p) for p in shard_parts)
        return picked[0] if len(picked) == 1 else picked

    return _step_seeds(seed, steps_per_epoch).map(batch)


def _interleave_replicas(per_replica):
    """Step t's batch of local replica 0, then of replica 1, ... (what a worker's iterator hands out)."""
    if len(per_replica) == 1:
        return per_replica[0]

    def steps(*batches):
        out = tf.data.Dataset.from_tensors(batches[0])
        for b in batches[1:]:
            out = out.concatenate(tf.data.Dataset.from_tensors(b))
        return out

    return tf.data.Dataset.zip(tuple(per_replica)).flat_map(steps)


def _tag(dataset, q, num_examples, fixed_seed, sharded=False, element_spec=None):
    """Attach how the batches were drawn, for the DP optimizers' checks, and return ``dataset``.

    The ``SamplingSpec`` (Poisson at rate q over n examples, drawn by tfdpbnn; a fixed debug seed voids
    amplification), whether replicas sample disjoint shards (``check_distributed_input``) and, for a
    distributed dataset, one replica's element spec (the fit checks build a synthetic batch from it).
    """
    dataset._tfdpbnn_sharded_poisson = sharded
    dataset._tfdpbnn_element_spec = element_spec
    return tag(dataset, SamplingSpec("poisson", num_examples, q, "poisson_batches", fixed_seed))


def _local_shards(context, strategy):
    """The global shard (replica) indices this input pipeline serves, and the number of shards."""
    replicas = int(strategy.num_replicas_in_sync)
    local = replicas // context.num_input_pipelines
    first = context.input_pipeline_id * local
    return list(range(first, first + local)), replicas


def distributed_poisson_batches(strategy, x, y=None, sample_rate=None, seed=None, sample_weight=None, *,
                                debug_fixed_seed=False):
    """Poisson batches for ``model.fit`` under ``strategy``: each replica samples its own disjoint shard.

    The union of the replicas' batches at each step is one Poisson(q) draw over all n examples, with no
    example in two replicas' batches (module docstring). The batches never end (``model.fit`` keeps one
    iterator of a distributed dataset across epochs): pass ``steps_per_epoch`` (e.g. ``ceil(1 / q)``) to
    ``model.fit``.

    Args:
      strategy: a ``tf.distribute`` strategy (MirroredStrategy, MultiWorkerMirroredStrategy, or the default).
      x: array (or nested structure of arrays) with n examples on axis 0, the same on every worker.
      y: optional array with n examples.
      sample_rate: q in (0, 1]; give the optimizer ``batch_size = q n`` (the global expected batch size).
      seed: None (a secret seed per worker from OS entropy), or an integer with ``debug_fixed_seed=True``.
      sample_weight: optional array with n examples (needs ``y``).
      debug_fixed_seed: allow a fixed ``seed`` (debugging only; no amplification is claimed).

    Returns:
      a ``tf.distribute.DistributedDataset``; pass ``steps_per_epoch`` to ``model.fit`` as well.
    """
    q, _ = check_rate_and_steps(sample_rate, None)
    base = _base_seed(seed, debug_fixed_seed)
    if sample_weight is not None and y is None:
        raise ValueError("y is required when sample_weight is given")
    parts = [x] + [a for a in (y, sample_weight) if a is not None]
    parts = [tf.nest.map_structure(tf.convert_to_tensor, p) for p in parts]
    sizes = {int(t.shape[0]) for p in parts for t in tf.nest.flatten(p)}
    if len(sizes) != 1:
        raise ValueError("x, y, sample_weight must have the same number of examples, got sizes "
                         f"{sorted(sizes)}")
    n = sizes.pop()
    if n < strategy.num_replicas_in_sync:
        raise ValueError(f"x: {n} examples cannot fill {strategy.num_replicas_in_sync} replicas' shards")

    def dataset_fn(context):
        shards, count = _local_shards(context, strategy)
        return _interleave_replicas([
            _array_shard_batches(parts, s, count, q, None, _shard_seed(base, s)) for s in shards])

    one_replica = _array_shard_batches(parts, 0, 1, q, 1, 0).element_spec
    return _tag(strategy.distribute_datasets_from_function(dataset_fn), q, n, seed is not None, sharded=True,
                element_spec=one_replica)


def replica_shard_batches(x, num_replicas, sample_rate, steps, seed=None, *, debug_fixed_seed=False):
    """The batches each of ``num_replicas`` replicas draws from its shard, as ``distributed_poisson_batches``.

    One ``tf.data.Dataset`` per replica, ``steps`` batches each, built by the same shard split, shard seeds
    and masks as the datasets ``distributed_poisson_batches`` hands a strategy's replicas (without the
    strategy): what the sampling audit (``tfdpbnn.audit.sampling_audit(replicas=R)``) inspects.
    """
    q, steps = check_rate_and_steps(sample_rate, steps)
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, numbers.Integral) or num_replicas < 1:
        raise ValueError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    base = _base_seed(seed, debug_fixed_seed)
    parts = [tf.nest.map_structure(tf.convert_to_tensor, x)]
    return [_array_shard_batches(parts, s, int(num_replicas), q, steps, _shard_seed(base, s))
            for s in range(int(num_replicas))]


def _empty_batch(spec):
    return tf.nest.map_structure(lambda s: tf.zeros([0] + s.shape.as_list(), s.dtype), spec)


def _stream_batches(examples, q, steps_per_epoch, seed, chunk_size, num_examples=None):
    """One Poisson batch per step, each from one full pass over the stream ``examples``."""
    spec = examples.element_spec
    for s in tf.nest.flatten(spec):
        if not s.shape.is_fully_defined():
            raise ValueError(f"dataset: poisson_stream needs records of fixed shape, got {s.shape}")
    empty = _empty_batch(spec)

    def one_step(step_seed):
        def keep(state, indexed):
            index, chunk = indexed
            size = tf.shape(tf.nest.flatten(chunk)[0])[0]
            mask = tf.random.stateless_uniform(
                [size], seed=tf.stack([step_seed, index])) < q
            picked = tf.nest.map_structure(lambda t: tf.boolean_mask(t, mask), chunk)
            count, batch = state
            merged = tf.nest.map_structure(lambda a, b: tf.concat([a, b], axis=0), batch, picked)
            return count + tf.cast(size, tf.int64), merged

        count, batch = examples.batch(chunk_size).enumerate().reduce((tf.constant(0, tf.int64), empty), keep)
        if num_examples is not None:
            with tf.control_dependencies([tf.debugging.assert_equal(
                    count, tf.constant(num_examples, tf.int64),
                    message="num_examples: the stream does not hold num_examples records")]):
                batch = tf.nest.map_structure(tf.identity, batch)
        return batch

    return _step_seeds(seed, steps_per_epoch).map(one_step)


def poisson_stream(dataset, sample_rate, num_examples, steps_per_epoch=None, seed=None, *,
                   debug_fixed_seed=False, chunk_size=4096):
    """Poisson batches over a ``tf.data`` stream of single examples too large for memory (e.g. TFRecords).

    Each step reads the whole stream once and keeps each record independently with probability q
    (Bernoulli filter of ``chunk_size`` records at a time, from the step's seed and the chunk's index), so
    each batch is exactly a Poisson(q) sample of the n records, as ``tfdpbnn.data.poisson_batches`` draws in
    memory; empty batches are kept (the step still runs). Every pass checks that the stream held
    ``num_examples`` records (the n of the accounting); a mismatch raises ``InvalidArgumentError``.
    Cost: one read of the data per step (``ceil(1 / q)`` reads per epoch).

    Args:
      dataset: ``tf.data.Dataset`` of single examples of fixed shape (a structure such as ``(x, y)``), the
        same records, in any order, on every iteration.
      sample_rate: q in (0, 1].
      num_examples: n, the number of records.
      steps_per_epoch: batches per iteration (default ``ceil(1 / q)``).
      seed: None (secret, OS entropy) or an integer with ``debug_fixed_seed=True``.
      debug_fixed_seed: allow a fixed ``seed`` (debugging only; no amplification is claimed).
      chunk_size: records filtered per vectorized Bernoulli draw.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral) or num_examples < 1:
        raise ValueError(f"num_examples must be an integer >= 1, got {num_examples!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    q, steps = check_rate_and_steps(sample_rate, steps_per_epoch)
    base = _base_seed(seed, debug_fixed_seed)
    return _tag(_stream_batches(dataset, q, steps, _shard_seed(base, 0), int(chunk_size), int(num_examples)),
                q, int(num_examples), seed is not None)


def distributed_poisson_stream(strategy, shard_fn, sample_rate, num_examples, seed=None, *,
                               debug_fixed_seed=False, chunk_size=4096):
    """``poisson_stream`` under ``strategy``: replica g streams ``shard_fn(g, R)`` and samples it at rate q.

    Endless, like ``distributed_poisson_batches``: pass ``steps_per_epoch`` to ``model.fit``.
    ``shard_fn(index, count)`` must return the records of shard ``index`` of ``count``, the shards disjoint
    and together the ``num_examples`` records of the accounting (``tfrecord_shards`` builds one from
    TFRecord files; the user asserts n, which no worker can count alone); the union of the replicas'
    batches is then a Poisson(q) draw over all n (module docstring).
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral) or num_examples < 1:
        raise ValueError(f"num_examples must be an integer >= 1, got {num_examples!r}")
    if not callable(shard_fn):
        raise ValueError(f"shard_fn must be callable (index, count) -> tf.data.Dataset, got {shard_fn!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    q, _ = check_rate_and_steps(sample_rate, None)
    base = _base_seed(seed, debug_fixed_seed)

    def dataset_fn(context):
        shards, count = _local_shards(context, strategy)
        return _interleave_replicas([
            _stream_batches(shard_fn(s, count), q, None, _shard_seed(base, s), int(chunk_size))
            for s in shards])

    one_replica = tf.nest.map_structure(lambda t: tf.TensorSpec([None] + t.shape.as_list(), t.dtype),
                                        shard_fn(0, int(strategy.num_replicas_in_sync)).element_spec)
    return _tag(strategy.distribute_datasets_from_function(dataset_fn), q, int(num_examples),
                seed is not None, sharded=True, element_spec=one_replica)


def tfrecord_shards(files, parse_fn):
    """A ``shard_fn`` for ``distributed_poisson_stream``: TFRecord files split into disjoint shards.

    With at least as many files as shards, shard k reads files k, k + count, ...; otherwise every shard
    reads all files and keeps records k, k + count, ... . ``parse_fn`` maps a serialized record to one
    example.
    """
    files = [str(f) for f in files]
    if not files:
        raise ValueError("files: give at least one TFRecord file")

    def shard_fn(index, count):
        if len(files) >= count:
            return tf.data.TFRecordDataset(files[index::count]).map(parse_fn)
        return tf.data.TFRecordDataset(files).shard(count, index).map(parse_fn)

    return shard_fn


def num_workers(strategy) -> int:
    """Workers (processes) taking part in ``strategy``'s steps (1 for Mirrored or default strategies)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, sum(len(spec.get(job, [])) for job in ("chief", "worker")))


def check_distributed_input(strategy, x, shuffle=True):
    """Refuse ``model.fit`` input whose sampling cannot be accounted when several workers train together.

    Under ``MultiWorkerMirroredStrategy`` every worker reads its own copy of the input and keeps its part of
    each global batch. Poisson batches drawn independently per worker (``poisson_batches`` with a secret
    seed) then overlap: an example can sit in two workers' parts of one step, which no accountant covers;
    arrays shuffled independently per worker break "each example once per epoch" the same way. Raises
    ``ValueError`` for those; ``distributed_poisson_batches`` / ``distributed_poisson_stream`` input, and
    arrays with ``shuffle=False``, pass. One worker (MirroredStrategy): everything passes (one process draws
    the global batch and splits it).
    """
    if num_workers(strategy) == 1 or getattr(x, "_tfdpbnn_sharded_poisson", False):
        return
    if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        raise ValueError(
            "x: under a multi-worker strategy each worker draws this dataset's batches on its own, so an "
            "example can be in two workers' parts of one step and epsilon would not hold. Use "
            "tfdpbnn.data.distributed_poisson_batches(strategy, x, y, sample_rate=...) (or "
            "distributed_poisson_stream for data on disk).")
    if shuffle:
        raise ValueError(
            "shuffle: under a multi-worker strategy each worker shuffles the arrays on its own, so an "
            "example can be used twice in one epoch; pass shuffle=False or use "
            "tfdpbnn.data.distributed_poisson_batches(strategy, x, y, sample_rate=...).")


__all__ = ["check_distributed_input", "distributed_poisson_batches", "distributed_poisson_stream",
           "replica_shard_batches",
           "num_workers", "poisson_stream", "tfrecord_shards"]
