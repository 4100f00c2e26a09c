"""The privacy record store: an append-only SQLite record of every DP training run, per data set.

Choosing settings by training again and again on the same private data spends privacy too; and trained
weights carry the privacy cost of the runs that produced them, whatever path (a file, ``set_weights``,
``clone_model``, another process) carried them. One record covers both (budget scheduling over shared
data, Luo et al. 2021):

- each run (one ``fit``, or the ``train_on_batch`` calls of one ledger phase) gets a row in ``runs``: the
  data set's fingerprint (SHA-256 of the training arrays' bytes, never the data), the fingerprint of the
  weights it started from, and its planned phase (``tfdpbnn.record.ledger.Phase`` with the steps the run may
  take), written before its first step;
- ``snapshots`` rows (at every epoch end and at the end of the run) hold the run's own phase as counted,
  the model's whole ledger (every phase that produced the weights) and the weights' identity
  (``weights_fingerprint``: every bit of every variable);
- ``preprocessing_states`` rows hold each DP preprocessing release (``private_adapt_normalization``,
  ``private_discretization``) under the digest of the layer state it produced, so a layer holding that
  state by value (a model saved and loaded, a clone given the weights) is known to carry that release.

A run starting from weights that an earlier run's snapshot holds inherits that run's whole ledger, up to
its LAST snapshot (loading older weights does not erase what was spent after them). A data set's spending
is the composition of every run's own phase on it (a run with no final snapshot, e.g. killed, counts its
planned phase: an upper bound). A budget set on a data set (``set_budget``) makes ``fit`` refuse, before
its first step, a run whose planned phase would exceed it.

The file is in write-ahead-log mode (``PRAGMA journal_mode=WAL``) and every write is one transaction, so
another process reads a consistent record while a run writes, and a killed process leaves whole rows
only. Rows are only ever inserted. Location: the ``TFDPBNN_PRIVACY_STORE`` environment variable (a file
path, or ``off`` to keep no record), else ``~/.tfdpbnn/privacy_record.sqlite``; a team shares one store
by pointing every machine at one file on a file system with working locks (``docs/privacy.md``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import secrets
import socket
import sqlite3
import time

import numpy as np

from tfdpbnn._validation import check_open_unit, check_positive
from tfdpbnn.record import phase_versions
from tfdpbnn.record.ledger import Phase, PrivacyLedger

#: Environment variable naming the store file ("off": keep no record).
ENV_VAR = "TFDPBNN_PRIVACY_STORE"
#: The store used when ``ENV_VAR`` is unset.
DEFAULT_PATH = os.path.join("~", ".tfdpbnn", "privacy_record.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, dataset TEXT NOT NULL, started REAL NOT NULL, start_weights TEXT NOT NULL,
    planned_phase TEXT NOT NULL, phase_id INTEGER NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS snapshots (
    snapshot INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(run_id),
    recorded REAL NOT NULL, final INTEGER NOT NULL, weights TEXT NOT NULL, phase TEXT NOT NULL,
    ledger TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS snapshots_weights ON snapshots(weights);
CREATE INDEX IF NOT EXISTS snapshots_run ON snapshots(run_id);
CREATE INDEX IF NOT EXISTS runs_dataset ON runs(dataset);
CREATE INDEX IF NOT EXISTS runs_phase ON runs(phase_id);
CREATE TABLE IF NOT EXISTS variable_snapshots (
    digest TEXT NOT NULL, run_id TEXT NOT NULL REFERENCES runs(run_id), UNIQUE (digest, run_id));
CREATE TABLE IF NOT EXISTS budgets (
    dataset TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, accountant TEXT NOT NULL,
    set_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS preprocessing_states (
    digest TEXT NOT NULL, record TEXT NOT NULL, recorded REAL NOT NULL, UNIQUE (digest, record));
"""


#: The data set of the runs that stand for weights written outside the DP step (``written_outside_dp``).
WRITTEN_DATASET = "written:outside-dp"


def _hash_arrays(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(np.asarray(array))
        if array.dtype == object:
            array = np.asarray([str(v).encode() for v in array.ravel()], dtype=object)
            digest.update(f"object{array.shape}".encode())
            for item in array:
                digest.update(len(item).to_bytes(8, "little") + item)
            continue
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        # The array's buffer itself (C order, as tobytes() would copy it); a 0-d array's one value.
        digest.update(array.reshape(-1).view(np.uint8) if array.size and array.dtype.hasobject is False
                      else array.tobytes())
    return digest.hexdigest()


#: The data's SHA-256 last computed per kind ("data"), to skip hashing the same bytes again:
#: kind -> (the arrays' quick digests (``_quick_digests``), their SHA-256 hex digest).
_HELD: dict[str, tuple] = {}
#: This process's seed of ``_quick_digests`` (from ``os.urandom``; a forked child keeps its parent's, and
#: the digests it held).
_QUICK_SEED = int.from_bytes(os.urandom(8), "little")
#: Bytes compared per slice in ``same_bytes`` (a multiple of 8).
_COMPARE_BYTES = 1 << 22


_MEMCMP: list = []  # [libc's memcmp or None], found once per process
#: Arrays of at least this many bytes are compared in two halves at once (``same_bytes``).
_SPLIT_BYTES = 1 << 21
#: (process id, one worker thread) for ``same_bytes``'s second half, made on first use in each process.
_COMPARER: list = []


def _comparer():
    """A one-thread executor of this process (a forked child makes its own: threads do not cross a fork)."""
    if not _COMPARER or _COMPARER[0][0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _COMPARER[:] = [(os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="tfdpbnn-compare"))]
    return _COMPARER[0][1]


def _memcmp():
    """The C library's ``memcmp`` (ctypes), or None where it cannot be found (numpy compares then)."""
    if not _MEMCMP:
        import ctypes
        import ctypes.util

        function = None
        try:
            name = ctypes.util.find_library("c")
            if name:
                function = ctypes.CDLL(name).memcmp
                function.restype = ctypes.c_int
                function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError):
            function = None
        _MEMCMP.append(function)
    return _MEMCMP[0]


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays have the same dtype, shape and bytes.

    Exact: every bit (a NaN equals the same NaN, -0.0 is not 0.0), as ``np.ndarray.tobytes`` would compare.
    The C library's ``memcmp`` where it is found (about twice numpy's speed on megabytes; arrays of
    ``_SPLIT_BYTES`` or more in two halves at once, one on a worker thread), else numpy in slices.
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.flags.c_contiguous or not b.flags.c_contiguous:
        return a.tobytes() == b.tobytes()
    memcmp = _memcmp()
    if memcmp is not None:
        if a.nbytes < _SPLIT_BYTES:
            return a.nbytes == 0 or memcmp(a.ctypes.data, b.ctypes.data, a.nbytes) == 0
        # Two halves at once: ctypes lets go of the interpreter lock during the call, so the other half runs
        # on another core (memory reads: about half the time on the 18.8 MB of the 784-1000-10 MLP's data).
        half = a.nbytes // 2
        other = _comparer().submit(memcmp, a.ctypes.data + half, b.ctypes.data + half, a.nbytes - half)
        first = memcmp(a.ctypes.data, b.ctypes.data, half) == 0
        return other.result() == 0 and first
    a, b = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    for start in range(0, a.size, _COMPARE_BYTES):
        left, right = a[start:start + _COMPARE_BYTES], b[start:start + _COMPARE_BYTES]
        if left.size % 8 == 0:
            left, right = left.view(np.uint64), right.view(np.uint64)
        if not np.array_equal(left, right):
            return False
    return True


def _quick_digests(arrays) -> tuple:
    """XXH3-128 (Collet 2020) of each array's bytes, with its dtype and shape; in memory only.

    A check that bytes hashed before (``_held_digest``) are still the same, not an identity that is ever
    written: one read of the bytes at memory speed (about 0.4 ms for the 18.8 MB of the 784-1000-10 MLP's
    data, a third of comparing them with a copy, which read twice as many bytes and held a copy as large),
    seeded per process (``_QUICK_SEED``). Every bit counts (a NaN's payload, -0.0 against 0.0), as in
    ``_hash_arrays``. Bytes that differ get equal digests only by a collision of XXH3-128: chance about
    2^-128 for values no one chose to collide; not a cryptographic bound, as for the weights' identity
    (``weights_fingerprint``; ``docs/privacy.md`` says why that is accepted). Plain numeric arrays in C
    order only (the caller checks).
    """
    import xxhash

    return tuple((a.dtype.str, a.shape, xxhash.xxh3_128_intdigest(a.reshape(-1).view(np.uint8), _QUICK_SEED))
                 for a in arrays)


def _holdable(arrays) -> bool:
    """Whether ``arrays`` are plain numeric arrays in C order (no subclass): those whose digests are held."""
    return bool(arrays) and all(type(a) is np.ndarray and a.dtype.kind in "biufc" and a.flags.c_contiguous
                                for a in arrays)


def _held_digest(kind: str, arrays, quick=None) -> str:
    """``_hash_arrays(arrays)``, without hashing again bytes equal to the arrays hashed last for ``kind``.

    The SHA-256 of the last arrays hashed is reused only when every array has the dtype, shape and quick
    digest (``_quick_digests``) of the arrays it was computed from; nothing of the arrays is held but these
    digests. Plain numeric arrays in C order only (no subclass); others are hashed every time. ``quick``:
    their quick digests, computed by the caller (``DataDigests``).
    """
    arrays = list(arrays)
    if not _holdable(arrays):
        return _hash_arrays(arrays)
    quick = _quick_digests(arrays) if quick is None else quick
    held = _HELD.get(kind)
    if held is not None and held[0] == quick:
        return held[1]
    digest = _hash_arrays(arrays)
    _HELD[kind] = (quick, digest)
    return digest


def _data_arrays(x, y=None) -> list:
    import tensorflow as tf

    return tf.nest.flatten(x) + ([] if y is None else tf.nest.flatten(y))


class DataDigests:
    """The quick digests (``_quick_digests``) of ``fit``'s input arrays, computed on a worker thread.

    Started before the input and model checks, which do not read the data (they run the model on a
    synthetic batch), and taken by ``input_fingerprint`` after them: the data's one read runs on the other
    core meanwhile (XXH3 lets go of the interpreter lock). The arrays are the caller's: nothing of tfdpbnn
    writes them in between, and code that would (a layer writing into the training arrays from its
    ``call``) is the model's own, outside what the record checks.
    """

    def __init__(self, x, y=None):
        import tensorflow as tf

        self._arrays: list | None = None
        self._pending = None
        if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
            return
        arrays = _data_arrays(x, y)
        if _holdable(arrays):
            self._arrays = arrays
            self._pending = _comparer().submit(_quick_digests, arrays)

    def of(self, arrays):
        """The digests if ``arrays`` are the very arrays started on (the same objects), else None."""
        started = self._arrays
        if self._pending is None or started is None or len(arrays) != len(started) or any(
                a is not b for a, b in zip(arrays, started, strict=True)):
            return None
        return self._pending.result()


def data_fingerprint(x, y=None, digests: DataDigests | None = None) -> str:
    """SHA-256 of the training data's contents (every array of ``x`` and ``y``, dtype and shape included).

    The data never leaves the process; equal data gives equal fingerprints in any process. Arrays fed to
    ``fit`` again are checked against the bytes hashed last by a quick digest instead of hashed again
    (``_held_digest``); ``digests``: those of these arrays, started earlier (``DataDigests``).
    """
    arrays = _data_arrays(x, y)
    return "data:" + _held_digest("data", arrays, None if digests is None else digests.of(arrays))


def tag_data_fingerprint(dataset, fingerprint: str):
    """Attach a data fingerprint (``data_fingerprint``) to a tf.data pipeline (in place) and return it.

    ``tfdpbnn.data.poisson_batches`` tags its output; tag a pipeline of your own before ``fit`` so that its
    runs count against the data set's record.
    """
    if not isinstance(fingerprint, str) or not fingerprint.startswith("data:"):
        raise ValueError(f"fingerprint must come from tfdpbnn.record.store.data_fingerprint, got "
                         f"{fingerprint!r}")
    from tfdpbnn.record import attributes

    attributes.set_dataset_fingerprint(dataset, fingerprint)
    return dataset


def input_fingerprint(x, y=None, digests: DataDigests | None = None) -> str | None:
    """The data fingerprint of ``fit``'s input: arrays are hashed; a pipeline carries its tag (or None).

    ``digests``: the arrays' quick digests, started before (``DataDigests``).
    """
    import tensorflow as tf

    from tfdpbnn.record import attributes

    if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        return attributes.dataset_fingerprint(x)
    return data_fingerprint(x, y, digests)


#: What the weights' identity is made of (``weights_identity``), hashed first: a new scheme gets a new name.
_IDENTITY_SCHEME = b"tfdpbnn weights identity v3: XXH3-128 of each variable's bytes, its dtype and shape\n"
#: Prefix of the weights' identity after "weights:" (earlier identities: ``legacy_weights_fingerprints``).
IDENTITY_PREFIX = "v3:"
#: The scheme of the "v2" identity (FarmHash64 rows, ``_legacy_identity_and_keys``), still looked up.
_V2_SCHEME = b"tfdpbnn weights identity: FarmHash64 of each variable's bytes, its dtype and shape\n"
#: The weights' identities and keys last computed, most recent last: (kind, ids of the variables) ->
#: (the arrays' quick digests, ``_quick_digests``; identity; the float variables' keys). Kinds: "weights"
#: (``model.weights``), "written" (a write check's copies).
_HELD_WEIGHTS: dict[tuple, tuple] = {}
#: At most this many entries in ``_HELD_WEIGHTS`` (a model and its write check, for a few models; an entry
#: holds digests and keys, not the arrays).
_HELD_WEIGHTS_MAX = 16
#: The traced function computing the earlier identity's and keys' FarmHash64s (``_fingerprint_function``),
#: made on first use (only for a store holding rows of an earlier version).
_FINGERPRINTS: list = []


#: The float variables' keys (``variable_fingerprints``) round this many of their values (every value of a
#: smaller variable), at evenly spaced positions.
KEY_VALUES = 2048


def _sampled(flat: np.ndarray) -> np.ndarray:
    """``KEY_VALUES`` values of a flat array at the positions ``floor(i n / k)``, i < k (all when n <= k)."""
    n = flat.size
    if n <= KEY_VALUES:
        return flat
    return flat[np.arange(KEY_VALUES, dtype=np.int64) * n // KEY_VALUES]


def _rounding_keys(array: np.ndarray, shape) -> list[str]:
    """A float variable's two keys (``variable_fingerprints``): its float16 and bfloat16 roundings, hashed.

    Of ``_sampled`` values of ``array`` (C order) taken to float32 (exact from float16 and bfloat16; float64
    rounded to nearest even), made canonical first (every NaN one NaN; zeros and subnormals +0.0, as a
    TensorFlow kernel that flushes subnormals would see them), then rounded to nearest even: to float16 as
    numpy casts (IEEE 754), to bfloat16 on the bits (the upper 16 bits after adding 0x7FFF and the lowest
    kept bit). Each key is XXH3-64 (seed 0) of the rounded values' little-endian bytes, with the variable's
    shape: ``"variable:f16x:<shape>:<16 hex digits>"`` and ``"variable:bf16x:..."``.
    """
    import xxhash

    wide = np.asarray(_sampled(array.reshape(-1)), dtype=np.float32)
    bits = wide.view(np.uint32).astype(np.uint64)
    magnitude = bits & 0x7FFFFFFF
    bits = np.where(magnitude > 0x7F800000, 0x7FC00000, np.where(magnitude < 0x00800000, 0, bits))
    canonical = bits.astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        half = canonical.astype(np.float16).view(np.uint16).astype("<u2")
    brain = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    text = "x".join(str(d) for d in shape)
    return [f"variable:f16x:{text}:{xxhash.xxh3_64_hexdigest(half.tobytes())}",
            f"variable:bf16x:{text}:{xxhash.xxh3_64_hexdigest(brain.tobytes())}"]


def _exact_digest(array: np.ndarray) -> bytes:
    """XXH3-128 (seed 0, canonical big-endian bytes) of an array's exact bytes in C order.

    Every bit counts (a NaN's payload, -0.0 against 0.0); a bool is one byte per value; strings (an array of
    ``bytes``) are hashed element by element in C order, each as its length (8 bytes, little-endian) and its
    bytes. The same on every platform and in every version of XXH3 (its output is specified; a test pins two
    values, one of them the specification's).
    """
    import xxhash

    if array.dtype == object:
        hasher = xxhash.xxh3_128()
        for item in array.ravel():
            item = item if isinstance(item, bytes) else str(item).encode()
            hasher.update(len(item).to_bytes(8, "little") + item)
        return hasher.digest()
    return xxhash.xxh3_128_digest(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)


def _identity_and_keys(variables, arrays) -> tuple[str, list[str]]:
    """The identity (``weights_identity``) of the values ``arrays`` of ``variables``, and their float keys.

    ``arrays``: the variables' values as numpy arrays (views of a fresh read where they are plain), whose
    bytes the identity hashes (``_exact_digest``) and whose float values the keys round (``_rounding_keys``);
    ``variables`` give each one's dtype, ``arrays`` its shape (a copy made with no static shape has the
    shape of its value). No TensorFlow operation runs.
    """
    import tensorflow as tf

    digest = hashlib.sha256(_IDENTITY_SCHEME)
    found: list[str] = []
    for variable, array in zip(variables, arrays, strict=True):
        dtype, shape = tf.as_dtype(variable.dtype), tuple(array.shape)
        digest.update(f"{dtype.name}{shape}:".encode() + _exact_digest(array))
        if dtype.is_floating:
            found += _rounding_keys(array, shape)
    return IDENTITY_PREFIX + digest.hexdigest(), found


def _fingerprint_function():
    """A traced function: one ``uint8`` tensor ``[rows, 8]`` of FarmHash64s (``tf.fingerprint``) of values.

    The earlier ("v2") identity's and keys' hashes, computed only to find rows an earlier version wrote
    (``_legacy_identity_and_keys``). Rows: for each value, the fingerprint of its exact bytes (``tf.bitcast``
    to bytes, C order; a bool as one byte per value; strings by each element's fingerprint); then, for each
    floating value, those of the float16 and of the bfloat16 rounding (from float32, round to nearest even)
    of its values at the positions ``_sampled`` picks.
    """
    if not _FINGERPRINTS:
        import tensorflow as tf

        def row(data):  # the fingerprint of the bytes of ``data`` in one row
            return tf.fingerprint(tf.reshape(data, [1, -1]))[0]

        def exact(value):
            if value.dtype == tf.string:
                return row(tf.fingerprint(tf.reshape(value, [-1])))
            if value.dtype == tf.bool:
                return row(tf.cast(value, tf.uint8))
            return row(value if value.dtype == tf.uint8 else tf.bitcast(value, tf.uint8))

        def rounded(value, dtype):  # round to nearest even, then the bytes hashed in one row
            return row(tf.bitcast(tf.cast(value, dtype), tf.uint8))

        def sample(value):  # KEY_VALUES values at evenly spaced flat positions (all of a smaller value)
            flat = tf.reshape(value, [-1])
            if value.shape.is_fully_defined() and value.shape.num_elements() <= KEY_VALUES:
                return flat
            n = tf.size(flat, out_type=tf.int64)
            k = tf.minimum(n, KEY_VALUES)
            return tf.gather(flat, tf.range(k) * n // tf.maximum(k, 1))

        @tf.function(autograph=False, reduce_retracing=True)
        def fingerprints(values):
            rows = [exact(v) for v in values]
            for value in values:
                if value.dtype.is_floating:
                    wide = tf.cast(sample(value), tf.float32)
                    rows += [rounded(wide, tf.float16), rounded(wide, tf.bfloat16)]
            return tf.stack(rows)

        _FINGERPRINTS.append(fingerprints)
    return _FINGERPRINTS[0]


def _legacy_identity_and_keys(values) -> tuple[str, list[str]]:
    """The "v2" identity and keys of tensors ``values``, as stores written before v3 hold them.

    The identity: ``"v2:"`` and SHA-256 over each value's dtype, shape and FarmHash64 of its exact bytes; the
    keys: ``"variable:f16s:<shape>:<hex>"`` and ``"variable:bf16s:..."``, FarmHash64 of the roundings
    (``_fingerprint_function``, one traced call).
    """
    import tensorflow as tf

    rows = _fingerprint_function()(list(values)).numpy() if values else np.zeros((0, 8), np.uint8)
    digest = hashlib.sha256(_V2_SCHEME)
    for value, row in zip(values, rows, strict=False):
        digest.update(f"{tf.as_dtype(value.dtype).name}{tuple(value.shape)}:".encode() + row.tobytes())
    found, pairs = [], iter(rows[len(values):])
    for value in values:
        if tf.as_dtype(value.dtype).is_floating:
            shape = "x".join(str(d) for d in value.shape)
            found += [f"variable:f16s:{shape}:{bytes(next(pairs)).hex()}",
                      f"variable:bf16s:{shape}:{bytes(next(pairs)).hex()}"]
    return "v2:" + digest.hexdigest(), found


def _held_identity(kind: str, variables, arrays=None) -> tuple[str, list[str]]:
    """``(identity, keys)`` of the variables' values, reusing those last computed for the same bytes.

    The values are read once each (``_private_api.read_tensors_and_views``: views of fresh reads' buffers;
    ``arrays``: values already read, e.g. ``get_weights()`` of distributed variables) and their quick digests
    (``_quick_digests``: one read at memory speed) looked up among those held (``_HELD_WEIGHTS``): the
    identity and the keys are functions of the bytes, dtypes and shapes alone, so any entry of equal digests
    gives them (the write check's key of a model's trainable weights at an epoch's end, then the record's
    snapshot of the same weights, the next run's start; the entries of other models trained in between
    stay). Otherwise the arrays of that read are hashed (``_identity_and_keys``, in numpy: no TensorFlow
    operation) and the entry of ``kind`` and these variables holds their digests (the least recently used
    entries dropped beyond ``_HELD_WEIGHTS_MAX``). Plain numeric arrays in C order only are looked up and
    held.
    """
    from tfdpbnn import _private_api

    if arrays is None:
        arrays = [view for _, view in _private_api.read_tensors_and_views(variables)]
    arrays = [np.asarray(a) for a in arrays]
    holdable = _holdable(arrays)
    quick = _quick_digests(arrays) if holdable else None
    if holdable:
        for key, entry in reversed(list(_HELD_WEIGHTS.items())):
            if entry[0] == quick:
                _HELD_WEIGHTS[key] = _HELD_WEIGHTS.pop(key)  # most recently used
                return entry[1], entry[2]
    identity, found = _identity_and_keys(variables, arrays)
    if holdable:
        name = (kind, tuple(id(v) for v in variables))
        _HELD_WEIGHTS.pop(name, None)
        _HELD_WEIGHTS[name] = (quick, identity, found)
        while len(_HELD_WEIGHTS) > _HELD_WEIGHTS_MAX:
            del _HELD_WEIGHTS[next(iter(_HELD_WEIGHTS))]  # the least recently used
    return identity, found


def _weights_arrays(model, weights):
    """``model.get_weights()`` when a variable of ``weights`` (``model``'s) is distributed, else None."""
    import tensorflow as tf

    if any(isinstance(v, tf.distribute.DistributedValues) for v in weights):
        return model.get_weights()
    return None


def weights_identity(model) -> tuple[str, list[str]]:
    """The weights' fingerprint (``weights_fingerprint``) and their float variables' keys, in one call.

    Both come from one read of the values of ``model.weights`` (the arrays ``get_weights`` returns, read
    directly unless a variable is distributed), hashed in numpy (``_identity_and_keys``); weights whose
    quick digests equal those held (an epoch's end as the write check keyed it, then the final snapshot and
    the next run's start) reuse their identity and keys (``_held_identity``).
    """
    from tfdpbnn import _private_api

    weights = _private_api.weights(model)  # a tf-keras model not built yet: its layers' weights so far
    identity, keys = _held_identity("weights", weights, arrays=_weights_arrays(model, weights))
    return "weights:" + identity, list(keys)


def weights_fingerprint(model) -> str:
    """The weights' identity: every variable of ``model.weights``, in order, each with its dtype and shape.

    ``"weights:v3:"`` and the SHA-256 (hex) of the list of each variable's dtype, shape and XXH3-128 (Collet
    2020; seed 0) of its exact bytes (``_exact_digest``: every bit counts, -0.0 is not 0.0, a NaN's payload
    counts; a bool as one byte per value). XXH3's output is specified, the same on every platform and in
    every version of xxHash: a test pins two values (``tests/test_weights_identity.py``). The bytes are
    the variables' in the machine's order (little-endian on every platform TensorFlow supports). Two
    different weights share an identity only if every variable that differs shares its XXH3-128 with the
    other value (chance about 2^-128 for values no one chose to collide; not a cryptographic bound: an
    over-count where the record inherits, an under-count where it accepts weights as known,
    ``docs/privacy.md`` says why that is accepted). Stores written before this identity hold earlier ones
    (``legacy_weights_fingerprints``); the record still finds them (``RunStore.weights_record``).
    """
    return weights_identity(model)[0]


def legacy_weights_fingerprints(model) -> tuple[list[str], list[str]]:
    """The weights' identities and float variables' keys as stores written before "v3" hold them.

    Identities: ``"weights:v2:"`` and the SHA-256 (hex) of each variable's dtype, shape and FarmHash64 of its
    exact bytes; and ``"weights:"`` and the SHA-256 (hex) of every array of ``get_weights()`` in order (each
    one's dtype, shape and bytes, ``_hash_arrays``), the identity before that. Keys: FarmHash64 of the
    float16 and bfloat16 roundings (``_legacy_identity_and_keys``). Computed only to find rows such a store
    holds (``RunStore.weights_record``, ``RunStore.weights_ledger``).
    """
    import tensorflow as tf

    from tfdpbnn import _private_api

    weights = _private_api.weights(model)
    arrays = _weights_arrays(model, weights)
    if arrays is None:
        reads = _private_api.read_tensors_and_views(weights)
        tensors, arrays = [tensor for tensor, _ in reads], [view for _, view in reads]
    else:
        tensors = [tf.constant(a) for a in arrays]
    identity, keys = _legacy_identity_and_keys(tensors)
    return ["weights:" + identity, "weights:" + _hash_arrays(arrays)], keys


def legacy_lookup(model):
    """``RunStore.weights_record``'s ``legacy``: a function computing ``legacy_weights_fingerprints(model)``.

    Computed only when called (when the store holds rows of an earlier version and none of this one holds
    the weights).
    """
    return lambda: legacy_weights_fingerprints(model)


def variables_identity(variables) -> str:
    """The identity of the variables' values (``weights_fingerprint`` without "weights:"), as held.

    The write check's key of the trainable weights (``tfdpbnn.optimizers.state_checks.WriteWatch``): for a
    model whose weights are all trainable, the key of the weights is the weights' identity, computed once for
    both (``_held_identity``: the same bytes are found by their quick digests, not hashed again; the float
    variables' keys are computed in the same call, for the record's snapshot that follows).
    """
    return _held_identity("written", variables)[0]


def variable_fingerprints(model) -> list[str]:
    """Keys of each float variable of ``model.weights``: XXH3-64 of its float16 and bfloat16 roundings.

    A snapshot writes the keys of the variables its run changed (``RunStore.snapshot``'s ``variables``), so
    one layer's weights copied into another model (``set_weights(layer.get_weights())``) are found
    (``RunStore.weights_record``): exact copies, float64 casts and copies rounded to float16 or bfloat16
    (rounding is idempotent: a rounded copy rounds to the same values). A key rounds ``KEY_VALUES`` of the
    variable's values, at fixed evenly spaced positions (all of them in a smaller variable): a copy is
    found whatever its size (its values at those positions round alike), and hashing the roundings of a
    large variable costs next to nothing. Two different variables of one shape share a key when their
    roundings agree at those positions (a DP-trained variable has fresh noise in every value, so only by a
    key collision, chance about 2^-64) or their keys collide: an over-count (the other run's phases are
    added), never a missed copy (``_rounding_keys`` makes NaNs, zeros and subnormals canonical first, so a
    copy rounded by a kernel that flushes subnormals is found too). Each key names the variable's shape
    too. Computed with the weights' identity (``weights_identity``), in numpy.
    """
    return weights_identity(model)[1]


def variable_keys(variables) -> list[str]:
    """The keys (``variable_fingerprints``) of ``variables``' values alone, in order."""
    arrays = [np.asarray(v.numpy()) for v in variables]
    return list(_held_identity("keys", variables, arrays=arrays)[1])


def default_path() -> str | None:
    """The store file ``ENV_VAR`` names (None for "off"), else ``DEFAULT_PATH`` expanded."""
    value = os.environ.get(ENV_VAR)
    if value is not None and value.strip().lower() == "off":
        return None
    return os.path.expanduser(value or DEFAULT_PATH)


def default_store() -> RunStore | None:
    """The ``RunStore`` at ``default_path()`` (None when the record is switched off)."""
    path = default_path()
    return None if path is None else RunStore(path)


def open_connection(path: str, timeout: float) -> sqlite3.Connection:
    """A connection to the SQLite file ``path`` in write-ahead-log mode, in autocommit mode.

    Switching a file to WAL needs an exclusive lock, and SQLite may answer "database is locked" at once
    (without its busy handler) when another process opens the same new file at that moment: retried until
    ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            return conn
        except sqlite3.OperationalError as err:
            conn.close()
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


#: Open connections kept by ``kept_connection``: (path, process, thread) -> (connection, file identity).
_KEPT: dict[tuple, tuple] = {}
_KEPT_MAX = 4


def kept_connection(path: str, timeout: float) -> sqlite3.Connection:
    """A connection to ``path`` (``open_connection``) kept open for this process and thread.

    Closing the last connection to a WAL file checkpoints the log and deletes it (file system syncs, about
    10 ms); a kept connection avoids that for every transaction. Kept per process and thread (a connection
    never crosses a fork), for the ``_KEPT_MAX`` files used last; a file replaced at the same path gets a new
    connection.
    """
    import threading

    path = os.path.abspath(path)
    key = (path, os.getpid(), threading.get_ident())
    try:
        stat = os.stat(path)
        identity = (stat.st_dev, stat.st_ino)
    except FileNotFoundError:
        identity = None
    kept = _KEPT.pop(key, None)
    if kept is not None and kept[1] == identity and identity is not None:
        _KEPT[key] = kept  # most recent last
        return kept[0]
    if kept is not None:
        kept[0].close()
    conn = open_connection(path, timeout)
    stat = os.stat(path)
    _KEPT[key] = (conn, (stat.st_dev, stat.st_ino))
    while len(_KEPT) > _KEPT_MAX:
        old = next(iter(_KEPT))
        connection, _ = _KEPT.pop(old)
        if old[1:] == key[1:]:  # only the owning process and thread may close it
            connection.close()
    return conn


#: Commits whose wait for the disk runs on the worker thread (``transaction(sync_on_worker=True)``): each
#: as (process id, future of the wait), joined by ``wait_durable``.
_SYNCING: list[tuple] = []


def _sync_log(path: str) -> None:
    """Wait until what was committed to the SQLite file ``path`` is on the disk (``fsync`` of its log).

    What ``PRAGMA synchronous=FULL`` does at a commit in WAL mode. A log that is gone was checkpointed into
    the file, which SQLite syncs itself after a checkpoint (also under ``synchronous=NORMAL``).
    """
    try:
        fd = os.open(path + "-wal", os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wait_durable() -> None:
    """Return once every commit whose wait for the disk runs on the worker thread is on the disk.

    Raises the ``OSError`` of a failed wait. Waits of another process (a parent's, in a forked child) are
    that process's.
    """
    while True:
        try:
            pid, pending = _SYNCING.pop()  # atomic: fits in two threads each join what they find
        except IndexError:
            return
        if pid == os.getpid():
            pending.result()


#: The open transaction of each (path as given, process, thread): a nested ``transaction`` joins it at once.
_IN_TRANSACTION: dict[tuple, sqlite3.Connection] = {}
#: ``total_changes`` of each connection (by id) when its open ``transaction`` began (``unwritten``).
_CHANGES_AT_BEGIN: dict[int, int] = {}


def unwritten(conn: sqlite3.Connection) -> bool:
    """Whether ``conn``'s open ``transaction`` has written no row yet: all it reads is committed.

    Outside a transaction every read is committed too.
    """
    if not conn.in_transaction:
        return True
    return _CHANGES_AT_BEGIN.get(id(conn)) == conn.total_changes


@contextlib.contextmanager
def transaction(path: str, timeout: float = 60.0, mode: str = "IMMEDIATE", durable: bool = True,
                sync_on_worker: bool = False):
    """The kept connection to ``path`` inside one transaction (committed at the end, rolled back on an error).

    Inside another ``transaction`` on the same file (same process and thread) it joins that one, so that
    several writes (a run's row and its ledger reservation) share one commit and one wait for the disk.
    ``mode``: "IMMEDIATE" (the write lock at once: serialized with every other process) or "DEFERRED"
    (reads). ``durable=False``: the commit does not wait for the disk (``synchronous=NORMAL``).
    ``sync_on_worker=True``: the commit is visible to every process (and survives a crash of this one) when
    the block ends, and the wait for the disk runs on the worker thread (``_sync_log``) until
    ``wait_durable`` joins it: for a write that must be on the disk before what follows can leave the
    process, not before the process goes on (a run's reservation, before its weights can be saved).
    """
    import threading

    key = (os.fspath(path), os.getpid(), threading.get_ident())
    conn = _IN_TRANSACTION.get(key)  # a transaction this thread holds open on the path as given
    if conn is not None and conn.in_transaction:
        yield conn
        return
    conn = kept_connection(path, timeout)
    if conn.in_transaction:
        yield conn
        return
    later = durable and sync_on_worker
    if not durable or later:
        conn.execute("PRAGMA synchronous=NORMAL")
    _IN_TRANSACTION[key] = conn
    try:
        conn.execute(f"BEGIN {mode}")
        _CHANGES_AT_BEGIN[id(conn)] = conn.total_changes
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if later:
            _SYNCING.append((os.getpid(), _comparer().submit(_sync_log, os.path.abspath(os.fspath(path)))))
    finally:
        _IN_TRANSACTION.pop(key, None)
        _CHANGES_AT_BEGIN.pop(id(conn), None)
        if not durable or later:
            conn.execute("PRAGMA synchronous=FULL")  # the kept connection's setting for everyone else


def _phase_json(phase: Phase) -> str:
    return json.dumps(phase.to_config(), sort_keys=True)


def _max_steps(phases):
    """One phase per id: the version with the most steps (a phase is only ever extended)."""
    best: dict[int, Phase] = {}
    for phase in phases:
        current = best.get(phase.phase_id)
        if current is None or _size(phase) > _size(current):
            best[phase.phase_id] = phase
    return list(best.values())


def _size(phase: Phase) -> tuple:
    return (phase.steps, phase.participations or 0, phase.examples)


#: Store files whose tables this process has made, by (path, device, inode).
_MADE: set[tuple] = set()


def checked_file(path, what: str) -> str:
    """``path`` as a string (``os.fspath``), with its directory created; an empty path is refused.

    ``what``: what the file holds, for the error ("the privacy record store", "the record ledger").
    """
    path = os.fspath(path)
    if not path:
        raise ValueError(f"path: {what} needs a file path, got ''")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path


def file_identity(path: str) -> tuple:
    """(absolute path, device, inode) of ``path``; (path, None, None) while it does not exist."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return (os.path.abspath(path), None, None)
    return (os.path.abspath(path), stat.st_dev, stat.st_ino)


class RunStore:
    """An append-only SQLite record of DP training runs (see the module).

    Args:
      path: the SQLite file (created with its directory if missing).
      timeout: seconds to wait for another process's write lock.
    """

    def __init__(self, path, timeout: float = 60.0):
        self.path = checked_file(path, "the privacy record store")
        self._timeout = float(timeout)
        identity = file_identity(self.path)
        if identity in _MADE:
            return  # this process made the tables of this very file (a file replaced at the path is new)
        # One write transaction taken up front: "CREATE ... IF NOT EXISTS" in autocommit mode reads the schema
        # and then upgrades to a write, and in WAL mode SQLite refuses that upgrade at once ("database is
        # locked", no busy wait) when another process wrote in between, e.g. two processes opening a new
        # store together.
        with self._connect() as conn:
            for statement in _SCHEMA.strip().split(";"):
                if statement.strip():
                    conn.execute(statement)
        _MADE.add(file_identity(self.path))

    def _open(self) -> sqlite3.Connection:
        return kept_connection(self.path, self._timeout)

    def _connect(self):
        return transaction(self.path, self._timeout)

    # ------------------------------------------------------------------------------------------ writes
    def begin_run(self, dataset: str, start_weights: str, planned_phase: Phase) -> str:
        """Insert a run (before its first step) and return its id."""
        run_id = secrets.token_hex(16)
        with self._connect() as conn:
            conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (run_id, dataset, time.time(), start_weights, _phase_json(planned_phase),
                          int(planned_phase.phase_id), socket.gethostname(), os.getpid()))
        return run_id

    def written_outside_dp(self, start_weights: str, weights: str, phase: Phase, ledger: PrivacyLedger,
                           variables=()) -> str:
        """Record weights written outside the DP step after a run: a run of its own, ended, holding them.

        ``phase``: the write (``written_outside_dp_phase``, without noise); ``ledger``: the ledger of the
        weights it changed, ending with ``phase``; ``start_weights``: their identity. The weights (and the
        keys ``variables`` of the variables written) are then found by ``weights_record`` with that
        ledger: infinite, in any process. Its data set is none (``WRITTEN_DATASET``): a data set's record
        and budget count the DP runs on it. Returns the run's id.
        """
        run_id = secrets.token_hex(16)
        with self._connect() as conn:
            conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (run_id, WRITTEN_DATASET, time.time(), start_weights, _phase_json(phase),
                          int(phase.phase_id), socket.gethostname(), os.getpid()))
        self.snapshot(run_id, weights, phase, ledger, final=True, variables=variables)
        return run_id

    def snapshot(self, run_id: str, weights: str, phase: Phase | None, ledger: PrivacyLedger,
                 final: bool = False, variables=()) -> None:
        """Append what the run has counted so far (``final``: the run ended) and the weights it produced.

        ``variables``: keys (``variable_fingerprints``) of the variables the run wrote, each found later by
        ``weights_record`` (one row per key and run).
        """
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO snapshots (run_id, recorded, final, weights, phase, ledger) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, time.time(), int(bool(final)), weights,
                 "null" if phase is None else _phase_json(phase), json.dumps(ledger.to_config())))
            if variables:  # one statement for every key
                conn.execute("INSERT OR IGNORE INTO variable_snapshots SELECT value, ? FROM json_each(?)",
                             (run_id, json.dumps(list(variables))))

    def set_budget(self, dataset: str, epsilon: float, delta: float, accountant: str = "rdp") -> None:
        """Set the data set's budget (the latest one set holds; earlier ones stay in the record)."""
        from tfdpbnn.privacy.registry import sound_accountants

        epsilon = check_positive("epsilon", epsilon)
        delta = check_open_unit("delta", delta)
        if accountant not in sound_accountants():
            raise ValueError(f"accountant must be one of the sound accountants {sound_accountants()}, got "
                             f"{accountant!r}")
        with self._connect() as conn:
            conn.execute("INSERT INTO budgets VALUES (?, ?, ?, ?, ?)",
                         (dataset, float(epsilon), float(delta), accountant, time.time()))

    # ------------------------------------------------------------------------------------------- reads
    def budget(self, dataset: str) -> dict | None:
        """The data set's budget ``{"epsilon", "delta", "accountant"}``, or None."""
        with self._connect() as conn:
            row = conn.execute("SELECT epsilon, delta, accountant FROM budgets WHERE dataset = ? "
                               "ORDER BY set_at DESC, rowid DESC LIMIT 1", (dataset,)).fetchone()
        return None if row is None else {"epsilon": row[0], "delta": row[1], "accountant": row[2]}

    def runs(self, dataset: str | None = None) -> list[dict]:
        """Every run (of ``dataset``), oldest first: id, data set, start, host, pid, whether it ended."""
        query = ("SELECT r.run_id, r.dataset, r.started, r.host, r.pid, "
                 "EXISTS (SELECT 1 FROM snapshots s WHERE s.run_id = r.run_id AND s.final = 1) FROM runs r")
        args: tuple[str, ...] = ()
        if dataset is not None:
            query += " WHERE r.dataset = ?"
            args = (dataset,)
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY r.started, r.rowid", args).fetchall()
        return [{"run_id": r[0], "dataset": r[1], "started": r[2], "host": r[3], "pid": r[4],
                 "ended": bool(r[5])} for r in rows]

    def dataset_phases(self, dataset: str) -> list[Phase]:
        """The phases every run on ``dataset`` spent (one per phase id, the largest version)."""
        with self._connect() as conn:  # read incrementally (``phase_versions``)
            return phase_versions.dataset_versions(conn, file_identity(self.path), dataset,
                                                   incremental=unwritten(conn))

    def dataset_epsilon(self, dataset: str, delta: float, accountant: str = "rdp",
                        extra: Phase | None = None) -> float:
        """Epsilon the data set has spent over every recorded run (plus ``extra``, a planned phase)."""
        phases = self.dataset_phases(dataset) + ([] if extra is None else [extra])
        return PrivacyLedger(_max_steps(phases)).epsilon(delta, accountant)

    def weights_record(self, weights: str, exclude_run: str | None = None, variables=(),
                       legacy=None) -> list[Phase]:
        """The ledger of the runs whose snapshots hold these weights, each phase as far as any run took it.

        A run that never wrote a final snapshot (killed, or still running elsewhere) adds its planned phase.
        ``exclude_run``: a run whose own phase is left out (the caller's run, still going). ``variables``:
        keys of the model's variables (``variable_fingerprints``); the runs that wrote any of them count too
        (one layer's weights copied by value from a trained model carry that model's training). ``legacy``:
        a function giving the weights' identities and keys as earlier versions wrote them
        (``legacy_weights_fingerprints``), called only when no snapshot holds ``weights`` and the store
        holds rows of an earlier version (``legacy_rows``; weights a snapshot of this version holds carry in
        its ledger what their run inherited at its start). One transaction.
        """
        with self._connect() as conn:
            found = self._runs_holding(conn, [weights], sorted(set(variables)))
            if not found[0] and legacy is not None:
                identities, keys = self.legacy_rows(conn)
                if identities or keys:
                    older = legacy()
                    more = self._runs_holding(conn, older[0] if identities else [], older[1] if keys else [])
                    found = (found[0] + more[0], found[1] + more[1])
            run_ids = list(dict.fromkeys(found[0]))
            run_ids += [r for r in dict.fromkeys(found[1]) if r not in run_ids]
            return self._runs_record(conn, run_ids, exclude_run)

    @staticmethod
    def _runs_holding(conn, identities, keys) -> tuple[list[str], list[str]]:
        """(runs whose snapshots hold one of ``identities``, runs that wrote one of ``keys``): one query."""
        found: tuple[list[str], list[str]] = ([], [])
        for run_id, by_variable in conn.execute(
                "SELECT run_id, 0 FROM (SELECT DISTINCT run_id FROM snapshots WHERE weights IN "
                "(SELECT value FROM json_each(?))) UNION ALL SELECT run_id, 1 FROM (SELECT DISTINCT run_id "
                "FROM variable_snapshots WHERE digest IN (SELECT value FROM json_each(?)))",
                (json.dumps(list(identities)), json.dumps(list(keys)))):
            found[by_variable].append(run_id)
        return found

    @staticmethod
    def legacy_rows(conn) -> tuple[bool, bool]:
        """Whether the store holds weights' identities, and variables' keys, that an earlier version wrote.

        Identities (``legacy_weights_fingerprints``): the first kind ("weights:" and 64 hex digits) sorts
        before "weights:g", the "v2:" ones between "weights:v2:" and "weights:v2;"; keys: the FarmHash64
        ones ("variable:f16s:", "variable:bf16s:", always written together). Three looks into the indexes in
        one statement (an older version of the library may still write into a shared store, so this is
        asked every time it matters).
        """
        identities, keys = conn.execute(
            "SELECT EXISTS(SELECT 1 FROM snapshots WHERE weights >= 'weights:0' AND weights < 'weights:g') "
            "OR EXISTS(SELECT 1 FROM snapshots WHERE weights >= 'weights:v2:' AND weights < 'weights:v2;'), "
            "EXISTS(SELECT 1 FROM variable_snapshots WHERE digest >= 'variable:bf16s:' "
            "AND digest < 'variable:bf16s;')").fetchone()
        return bool(identities), bool(keys)

    def _runs_record(self, conn, run_ids, exclude_run) -> list[Phase]:
        """Every phase of the runs ``run_ids`` (their last snapshot's ledger and their own phase)."""
        phases: list[Phase] = []
        if run_ids:
            # Each run's last snapshot's ledger and its own phase (``phase_versions``), in one statement.
            rows = {run_id: (ledger, own) for run_id, ledger, own in conn.execute(
                "SELECT j.value, (SELECT s.ledger FROM snapshots s WHERE s.run_id = j.value "
                "ORDER BY s.snapshot DESC LIMIT 1), COALESCE(NULLIF((SELECT s.phase FROM snapshots s "
                "WHERE s.run_id = j.value AND s.final = 1 ORDER BY s.snapshot DESC LIMIT 1), 'null'), "
                "(SELECT r.planned_phase FROM runs r WHERE r.run_id = j.value)) FROM json_each(?) j",
                (json.dumps(run_ids),))}
            for run_id in run_ids:
                ledger, own = rows[run_id]
                phases.extend(Phase(**p) for p in json.loads(ledger))
                phases.append(Phase(**json.loads(own)))
        # A phase that later runs extended (the same optimizer went on after these weights) counts in
        # full: loading older weights does not erase what was spent after them. The largest version of
        # each phase over every run's own, read incrementally (``phase_versions``).
        phases.extend(phase_versions.largest_versions(conn, file_identity(self.path),
                                                      [p.phase_id for p in phases], exclude_run,
                                                      incremental=unwritten(conn)))
        return _max_steps(phases)

    def record_preprocessing(self, digest: str, record: dict) -> None:
        """Keep a DP preprocessing release (``PreprocessingRecord.to_config``) under its state's digest."""
        with self._connect() as conn:
            conn.execute("INSERT OR IGNORE INTO preprocessing_states VALUES (?, ?, ?)",
                         (digest, json.dumps(record, sort_keys=True), time.time()))

    def preprocessing_records(self, digest: str) -> list[dict]:
        """The DP preprocessing releases kept under ``digest`` (``record_preprocessing``), oldest first."""
        with self._connect() as conn:
            rows = conn.execute("SELECT record FROM preprocessing_states WHERE digest = ? ORDER BY rowid",
                                (digest,)).fetchall()
        return [json.loads(row[0]) for row in rows]

    def weights_ledger(self, weights: str, legacy=None) -> list[Phase] | None:
        """The ledger that produced these exact weights: the phases of the snapshots holding them (or None).

        Unlike ``weights_record`` (what was spent, including steps taken after these weights), this is each
        phase as counted when the weights were written: the training behind the weights in hand. ``legacy``:
        as for ``weights_record``.
        """
        with self._connect() as conn:
            rows = conn.execute("SELECT ledger FROM snapshots WHERE weights = ?", (weights,)).fetchall()
            if not rows and legacy is not None and self.legacy_rows(conn)[0]:
                rows = conn.execute("SELECT ledger FROM snapshots WHERE weights IN "
                                    "(SELECT value FROM json_each(?))", (json.dumps(legacy()[0]),)).fetchall()
        if not rows:
            return None
        return _max_steps(Phase(**p) for row in rows for p in json.loads(row[0]))

    def summary(self, dataset: str, delta: float, accountant: str = "rdp") -> dict:
        """What the privacy statement says about the data set: runs, epsilon spent, budget."""
        runs = self.runs(dataset)
        epsilon = self.dataset_epsilon(dataset, delta, accountant) if runs else 0.0
        return {"store": self.path, "dataset": dataset, "runs": len(runs),
                "runs_not_ended": sum(not r["ended"] for r in runs),
                "epsilon": None if math.isinf(epsilon) else epsilon,
                "epsilon_is_infinite": math.isinf(epsilon),
                "delta": delta, "accountant": accountant, "budget": self.budget(dataset)}


__all__ = ["DEFAULT_PATH", "ENV_VAR", "IDENTITY_PREFIX", "RunStore", "data_fingerprint", "default_path",
           "default_store", "input_fingerprint", "legacy_lookup", "legacy_weights_fingerprints",
           "tag_data_fingerprint", "variable_fingerprints", "variable_keys", "variables_identity",
           "weights_fingerprint",
           "weights_identity"]
