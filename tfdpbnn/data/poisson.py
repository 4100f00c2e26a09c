"""Poisson-subsampled batches: the sampling that RDP, PLD and GDP accounting of DP-SGD assume."""

from __future__ import annotations

import hashlib
import math
import numbers
import secrets

import tensorflow as tf

from tfdpbnn._audit_hook import audit_bug
from tfdpbnn.data.sampling import SamplingSpec, tag
from tfdpbnn.record.records import record_keys, tag_record_keys
from tfdpbnn.record.store import data_fingerprint, tag_data_fingerprint

#: Iterations of the key derivation of ``secret_seed_digest`` (about 20 ms): a digest found in a ledger file
#: does not give the key back but by trying every key, each at this cost.
_DIGEST_ITERATIONS = 100_000


def secret_seed_digest(secret_seed: int) -> str:
    """A digest of a ``poisson_batches`` ``secret_seed`` (32 hex digits), never the seed itself.

    PBKDF2-HMAC-SHA256 of the seed's 8 bytes under a fixed salt, truncated to 128 bits: the same seed gives
    the same digest in every process (what the per-record ledger compares), and a digest gives the seed
    back only by trying seeds, each at the cost of ``_DIGEST_ITERATIONS`` hashes.
    """
    key = (int(secret_seed) % (2 ** 63)).to_bytes(8, "big")
    return hashlib.pbkdf2_hmac("sha256", key, b"tfdpbnn.data.poisson_batches secret_seed",
                               _DIGEST_ITERATIONS)[:16].hex()


def check_rate_and_steps(sample_rate, steps_per_epoch) -> tuple[float, int]:
    """``(q, steps_per_epoch)`` after checking them; ``steps_per_epoch`` None means ``ceil(1 / q)``."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real) or not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if steps_per_epoch is None:
        steps_per_epoch = int(math.ceil(1.0 / sample_rate))
    if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, numbers.Integral) \
            or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be an integer >= 1, got {steps_per_epoch!r}")
    return float(sample_rate), int(steps_per_epoch)


def check_debug_seed(seed, debug_fixed_seed) -> None:
    """Refuse a fixed sampling ``seed`` without ``debug_fixed_seed=True``, and the flag without a seed."""
    if not isinstance(debug_fixed_seed, bool):
        raise ValueError(f"debug_fixed_seed must be True or False, got {debug_fixed_seed!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"seed must be an integer or None, got {seed!r}")
    if seed is not None and not debug_fixed_seed:
        raise ValueError(
            f"seed: a fixed sampling seed ({seed!r}) lets anyone who knows it see which examples each batch "
            "holds, which voids the subsampling amplification epsilon relies on. Leave seed=None (a secret "
            "seed from OS entropy, drawn by each process), or pass debug_fixed_seed=True to debug; epsilon "
            "is then accounted without amplification.")
    if debug_fixed_seed and seed is None:
        raise ValueError("debug_fixed_seed: True needs an integer seed; got seed=None")


def poisson_batches(x, y=None, sample_rate=None, steps_per_epoch=None, seed=None, sample_weight=None, *,
                    debug_fixed_seed=False, secret_seed=None, record_ids=None):
    """A ``tf.data.Dataset`` of batches where each example joins each batch independently with prob. q.

    Every batch draws a fresh Bernoulli(q) mask over all n examples (Abadi et al. 2016, "lots"; Mironov et
    al. 2019's sampled Gaussian mechanism), so batch sizes are Binomial(n, q) and may be 0. Each epoch is
    ``steps_per_epoch`` batches (default ``ceil(1 / q)``) and is resampled every time the dataset is
    iterated (``model.fit(ds, epochs=...)``). Pass the DP optimizer ``sampling="poisson"`` and
    ``batch_size = q * n``.

    Subsampling amplification holds only if nobody but the training code knows which examples each batch
    holds, so by default the sampling seed is drawn from the operating system's entropy (``secrets``), never
    from TensorFlow's global seed. A fixed seed is for debugging only and needs ``debug_fixed_seed=True``;
    the DP optimizers then claim no amplification (every step is accounted as if every example took part)
    and the privacy statement says so.

    Args:
      x: array (or nested structure of arrays) with n examples on axis 0. Without ``y``, a tuple or list
        of 2 or 3 arrays is what Keras reads it as in a batch: ``(x, y)`` or ``(x, y, sample_weight)``.
      y: optional targets: array (or nested structure of arrays) with n examples.
      sample_weight: optional per-example weights with n examples (array or nested structure); needs ``y``.
      sample_rate: q in (0, 1].
      steps_per_epoch: batches per epoch (integer >= 1).
      seed: integer seed for reproducible batches (only with ``debug_fixed_seed=True``), or None (secret).
      debug_fixed_seed: allow ``seed``; the privacy statement reports it.
      secret_seed: an integer seed YOU keep secret (e.g. read from a local key file that is never published),
        for a run that must repeat exactly on one machine. Amplification is then claimed on your word: the
        privacy statement lists the seed's secrecy under ``asserted_by_user``. Every dataset made from the
        same ``secret_seed`` draws the same batches, in any process, so two DP runs on the same records from
        one key are not independent (a step of each on the same batch is one Poisson-sampled release, at
        sigma / sqrt(2) for two runs at sigma), and composing them as independent would understate epsilon:
        the per-record ledger keeps a digest of the key (``secret_seed_digest``, never the key) and a random
        name of the dataset object with each run, and a DP run on records that a run from the same key and
        another dataset object trained on is refused (``ValueError`` naming ``secret_seed``, before any
        step, nothing written). Training the same dataset object again (a second ``fit``, more epochs) goes
        on with its stream of draws: accepted. Use one key per run, or leave ``secret_seed=None``: the
        sampler's own key from OS entropy, fresh for every dataset.
      record_ids: one id per example for the per-record ledger (``tfdpbnn.record.records``); by default
        each example's canonical content hash of ``x`` and ``y``.
    Yields ``x_b``, ``(x_b, y_b)`` or ``(x_b, y_b, w_b)``.
    """
    sample_rate, steps_per_epoch = check_rate_and_steps(sample_rate, steps_per_epoch)
    check_debug_seed(seed, debug_fixed_seed)
    if secret_seed is not None:
        if isinstance(secret_seed, bool) or not isinstance(secret_seed, numbers.Integral):
            raise ValueError(f"secret_seed must be an integer or None, got {type(secret_seed).__name__}")
        if seed is not None:
            raise ValueError("seed and secret_seed: give at most one (a public debugging seed, or a seed you "
                             "keep secret)")
    fixed = seed is not None
    asserted_secret = secret_seed is not None
    if asserted_secret:
        seed = int(secret_seed) % (2 ** 63)
    if seed is None:
        seed = secrets.randbits(63)
    parts = [x] + [a for a in (y, sample_weight) if a is not None]
    if sample_weight is not None and y is None:
        raise ValueError("y is required when sample_weight is given")
    parts = [tf.nest.map_structure(tf.convert_to_tensor, p) for p in parts]
    sizes = {int(t.shape[0]) for p in parts for t in tf.nest.flatten(p)}
    if len(sizes) != 1:
        raise ValueError("x, y, sample_weight must have the same number of examples, got sizes "
                         f"{sorted(sizes)}")
    n = sizes.pop()
    q = float(sample_rate)
    drawn = q * audit_bug("sample-rate-1.5x") if audit_bug("sample-rate-1.5x") else q  # AUDIT BUG only
    seed_stream = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(steps_per_epoch)

    def batch(s):
        mask = tf.random.stateless_uniform([n], seed=tf.stack([s, tf.constant(7, tf.int64)])) < drawn
        picked = tuple(tf.nest.map_structure(lambda t: tf.boolean_mask(t, mask), p) for p in parts)
        return picked[0] if len(picked) == 1 else picked

    dataset = seed_stream.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    source = "asserted_by_user" if asserted_secret else "poisson_batches"
    # The data set's fingerprint is of x and y, as ``fit`` on the same arrays hashes them: sample weights are
    # no part of the data set (a budget set on ``data_fingerprint(x, y)`` holds for weighted runs too).
    data = parts if sample_weight is None else parts[:-1]
    arrays = [t.numpy() for p in data for t in tf.nest.flatten(p)]
    dataset = tag_data_fingerprint(dataset, data_fingerprint(arrays))
    features, labels = parts[0], (None if y is None else parts[1])
    if y is None and isinstance(x, tuple | list) and len(x) in (2, 3):
        # Keras reads a batch that is a tuple (or list) of 2 or 3 as (x, y) or (x, y, sample_weight): the
        # records' features are its first part, as in ``fit(x, y)`` on the same arrays (a content key holds
        # the features alone, so the same records get the same keys however they are fed).
        features, labels = parts[0][0], parts[0][1]
    labels = None if labels is None else tf.nest.map_structure(lambda t: t.numpy(), labels)
    keys = record_keys(tf.nest.map_structure(lambda t: t.numpy(), features), labels, record_ids)
    dataset = tag_record_keys(dataset, keys)
    # A run from the user's key is written in the per-record ledger with the key's digest and this object's
    # stream (``tfdpbnn.record.record_ledger``): another object from the same key draws the same batches.
    sampler = dict(key_digest=secret_seed_digest(secret_seed), stream=secrets.token_hex(16)) \
        if asserted_secret else {}
    return tag(dataset, SamplingSpec("poisson", n, q, source, fixed, **sampler))

