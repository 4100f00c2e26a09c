"""Record identity for the per-record privacy ledger: one 64-bit key per record of a data set.

A record is one example (one row on axis 0 of the training arrays). Its key is

- with ``record_ids`` (one id per row, given by the user where the training data is declared): the id. An
  id is an integer or a string (bytes, as a string tensor's ``.numpy()`` gives them, are their UTF-8 text);
  a string that ``int()`` reads as an integer is that integer ("7" and 7 are the same record); floats are
  refused. Use ids when a record's features can change (an edited row stays
  the same record) or when different records can have equal features.
- by default, a canonical content hash of the row's features (version 2, the one a new ledger file uses:
  ``tfdpbnn.record.record_ledger.CONTENT_KEY_VERSION``): every feature value of the row, rounded to
  float32 (so float64 and float32, int and float copies of the same values are the same record), ``-0.0``
  read as ``0.0`` and every NaN as one NaN (a string value: its UTF-8 text), in one sequence: each feature
  array flattened row-major, the arrays in order (a list's or tuple's order, a dict's sorted key order).
  Neither the arrays' shapes nor their names nor the container are part of it, and neither is the label: a
  row reshaped ((n, 64) or (n, 8, 8)), wrapped (``x``, ``[x]``, ``{"pixels": x}``), split into column
  blocks in order (``[x[:, :10], x[:, 10:]]``), or given with one-hot, integer or edited labels is the same
  record. The row's position in the data set is not part of it either, so shuffled rows, subsets,
  supersets and concatenations of the same rows map to the same keys. Two rows with equal features are ONE
  record (each release counts once for it; whoever owns either row has at most that record's history); a
  row whose features were edited, rescaled or re-encoded is a new record. Per-example sample weights are
  not part of a record.

Version 1 (the ledger files written before version 2, which keep their records' keys) also hashed the
label, each array's shape and name: a reshaped, wrapped or relabelled copy was a new record there.

Leaving information out of a key can only merge records: two records that share a key share one ledger
history, which counts the releases of both for each (an over-count, never an under-count). The hash is
vectorized with numpy (murmur3's 64-bit finalizer on each word, a weighted sum, the finalizer again). It is
not cryptographic, and need not be for soundness: two different records that get one key by chance (about
``n^2 / 2^65``, 3e-8 for a million records) are such a merge.
"""

from __future__ import annotations

import hashlib
import numbers

import numpy as np

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_CONTENT_SEED = 0x7466647062_6E6E31   # domain of content hashes
_ID_SEED = 0x7265636F72_646964     # domain of user-given ids
_FEATURES_SEED = 0x6665617475_726573  # domain of version-2 content hashes


def _fmix(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finalizer, in place on a uint64 array (a bijection that mixes every bit)."""
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= _M1
        h ^= h >> np.uint64(33)
        h *= _M2
        h ^= h >> np.uint64(33)
    return h


def _multipliers(count: int, seed: int) -> np.ndarray:
    """``count`` fixed odd 64-bit multipliers (a SplitMix-style sequence from ``seed``)."""
    state = (np.arange(1, count + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(seed)
    return _fmix(state) | np.uint64(1)


def _seed_of(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _arrays(structure, prefix=""):
    """(name, array) pairs of a nested structure of arrays, dicts in sorted key order."""
    if isinstance(structure, dict):
        for key in sorted(structure, key=str):
            yield from _arrays(structure[key], f"{prefix}/{key}")
    elif isinstance(structure, list | tuple):
        for i, item in enumerate(structure):
            yield from _arrays(item, f"{prefix}[{i}]")
    else:
        yield prefix, np.asarray(structure)


def _text_words(name: str, rows: np.ndarray) -> np.ndarray:
    """One uint64 word per string element (BLAKE2b of its UTF-8 text; bytes are read as UTF-8)."""
    words = []
    for item in rows.ravel().tolist():
        if isinstance(item, bytes):
            item = item.decode("utf-8", "surrogateescape")
        if not isinstance(item, str):
            raise ValueError(f"x, y: {name or 'x'} holds {type(item).__name__} objects, which have no "
                             "canonical content hash; pass record_ids (one integer or string id per record)")
        words.append(_seed_of("text:" + item))
    return np.array(words, dtype=np.uint64).reshape(rows.shape)


def _check_rows(name: str, array: np.ndarray, n: int) -> None:
    """Refuse an array without the ``n`` records on axis 0."""
    if array.ndim == 0 or array.shape[0] != n:
        raise ValueError(f"x, y: every array must have the {n} records on axis 0, got shape {array.shape} "
                         f"for {name or 'x'}")


def _numeric_extension(array: np.ndarray) -> bool:
    """Whether ``array`` holds numbers of a numpy extension type (ml_dtypes' bfloat16, float8, int4).

    Their dtype's kind is "V", as a raw void's or a structured array's, whose scalar type is ``np.void``;
    theirs is a number type that converts to float32 (the values TensorFlow's bfloat16 tensors give numpy).
    """
    return array.dtype.kind == "V" and array.dtype.names is None and array.dtype.type is not np.void


def _canonical_words(name: str, array: np.ndarray, n: int) -> np.ndarray:
    """The array's rows as canonical words: float32 bits two per uint64, or one per string: (n, words)."""
    _check_rows(name, array, n)
    if _numeric_extension(array):   # bfloat16, float8, int4 (ml_dtypes): numbers, rounded to float32 below
        array = np.asarray(array, dtype=np.float32)
    if array.dtype == object or array.dtype.kind in "USV":
        return _text_words(name, array.reshape(n, -1))
    if array.dtype.kind == "c":
        array = np.stack([array.real, array.imag], axis=-1)
    rows = np.asarray(array.reshape(n, -1), dtype=np.float32)  # values rounded to float32
    rows = rows + np.float32(0.0)  # -0.0 -> 0.0 (and a copy we may change)
    rows[np.isnan(rows)] = np.float32(np.nan)
    bits = rows.view(np.uint32)
    if bits.shape[1] % 2:
        bits = np.concatenate([bits, np.zeros((n, 1), np.uint32)], axis=1)
    return np.ascontiguousarray(bits).view(np.uint64)


def _content_keys_v1(x, y=None) -> np.ndarray:
    """The version-1 content hash (int64) of each record of ``x`` and ``y`` (features, label and layout).

    Args:
      x: an array, or a list/tuple/dict of arrays, with the records on axis 0.
      y: optional labels, the same.
    Returns an int64 array with one key per record, in the data's order.
    """
    parts = list(_arrays(x, "x")) + ([] if y is None else list(_arrays(y, "y")))
    if not parts:
        raise ValueError("x: no arrays to identify records by")
    n = parts[0][1].shape[0] if parts[0][1].ndim else -1
    layout = ";".join(f"{name}:{a.shape[1:]}" for name, a in parts)
    h = np.full(n if n >= 0 else 0, np.uint64(_CONTENT_SEED ^ _seed_of(layout)), dtype=np.uint64)
    for index, (name, array) in enumerate(parts):
        words = _canonical_words(name, array, n)
        if words.shape[1] == 0:
            continue
        mixed = _fmix(words.copy())
        weights = _multipliers(words.shape[1], _seed_of(f"{index}:{name}"))
        with np.errstate(over="ignore"):
            h ^= mixed @ weights   # integer matmul: wraps modulo 2^64
            h = _fmix(h)
    return h.view(np.int64)


def _rows_of(name: str, array: np.ndarray, n: int) -> np.ndarray:
    """The array's rows as canonical 32-bit units: float32 bits, or a string's two halves: (n, units)."""
    words = _canonical_words(name, array, n).view(np.uint32)
    if (array.dtype == object or array.dtype.kind in "USV") and not _numeric_extension(array):
        return words
    values = array.reshape(n, -1).shape[1] * (2 if array.dtype.kind == "c" else 1)
    return words[:, :values]   # without the padding unit of an odd count


def _content_keys_v2(x, y=None) -> np.ndarray:
    """The version-2 content hash (int64) of each record: its features' values only (see the module)."""
    parts = list(_arrays(x, "x"))
    if not parts:
        raise ValueError("x: no arrays to identify records by")
    n = parts[0][1].shape[0] if parts[0][1].ndim else -1
    for name, array in [] if y is None else _arrays(y, "y"):
        _check_rows(name, array, n)
    blocks = [_rows_of(name, array, n) for name, array in parts]
    units = blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)
    if units.shape[1] % 2:
        units = np.concatenate([units, np.zeros((n, 1), np.uint32)], axis=1)
    h = np.full(n, np.uint64(_CONTENT_SEED ^ _FEATURES_SEED), dtype=np.uint64)
    if units.shape[1]:
        mixed = _fmix(np.ascontiguousarray(units).view(np.uint64).copy())
        with np.errstate(over="ignore"):
            h ^= mixed @ _multipliers(mixed.shape[1], _FEATURES_SEED)  # integer matmul: wraps modulo 2^64
        h = _fmix(h)
    return h.view(np.int64)


def content_keys(x, y=None, version: int | None = None) -> np.ndarray:
    """The canonical content hash (int64) of each record of ``x`` (and ``y``): see the module.

    Args:
      x: an array, or a list/tuple/dict of arrays, with the records on axis 0.
      y: optional labels, the same (checked for their number of rows; part of a version-1 key only).
      version: the content hash's version (1 or 2); None: the one naming the records of the default ledger
        (``tfdpbnn.record.record_ledger.content_key_version``: 2 unless the file was written with 1).
    Returns an int64 array with one key per record, in the data's order.
    """
    if version is None:
        from tfdpbnn.record.record_ledger import content_key_version

        version = content_key_version()
    if version == 1:
        return _content_keys_v1(x, y)
    if version != 2:
        raise ValueError(f"version must be 1 or 2 (a content hash's version), got {version!r}")
    return _content_keys_v2(x, y)


def id_keys(record_ids) -> np.ndarray:
    """The key (int64) of each user-given record id (integers, or strings; see the module)."""
    ids = np.asarray(record_ids)
    if ids.ndim != 1:
        raise ValueError(f"record_ids must be one id per record (a 1-D sequence), got shape {ids.shape}")
    if ids.dtype == bool or ids.dtype.kind in "fc":
        raise ValueError(f"record_ids must be integers or strings, got {ids.dtype} values")
    if ids.dtype.kind not in "iu":
        words = []
        for item in ids.tolist():
            if isinstance(item, bytes):   # a string tensor's ids (``.numpy()``): their UTF-8 text
                item = item.decode("utf-8", "surrogateescape")
            if isinstance(item, bool) or not isinstance(item, str | numbers.Integral):
                raise ValueError(f"record_ids must be integers or strings, got {type(item).__name__} "
                                 f"{item!r}")
            if isinstance(item, str):
                try:
                    item = int(item)
                except ValueError:
                    words.append(_seed_of("id:" + item))
                    continue
            if not -(1 << 63) <= int(item) < (1 << 63):
                raise ValueError(f"record_ids: integer ids must fit in 64 bits, got {item}")
            words.append((int(item) & ((1 << 64) - 1)) ^ _ID_SEED)
        return _fmix(np.array(words, dtype=np.uint64)).view(np.int64)
    if ids.dtype.kind == "u" and ids.size and ids.max() >= (1 << 63):
        raise ValueError("record_ids: integer ids must fit in 64 bits")
    h = ids.astype(np.int64).view(np.uint64) ^ np.uint64(_ID_SEED)
    return _fmix(h).view(np.int64)


class IdKeys(np.ndarray):
    """Keys (int64) of user-given record ids (``distinct_id_keys``), with their rows' content keys.

    ``content``: the content keys of the same rows, in order, where the rows are known (``record_keys(x, y,
    record_ids)``, ``input_keys``); else None.

    The ledger refuses a record named by its id in one release and by its content in another (two
    histories for one record, neither holding the other's spending: ``tfdpbnn.record.record_ledger``). An
    array derived from it (a slice, ``np.unique``) has no ``content``: its rows no longer line up.
    """

    content: np.ndarray | None

    def __array_finalize__(self, obj) -> None:
        self.content = None


def _with_content(keys: np.ndarray, content: np.ndarray | None) -> np.ndarray:
    """``keys`` (ids' keys) as ``IdKeys`` carrying ``content`` (None: no content known)."""
    named = keys.view(IdKeys)
    named.content = None if content is None else np.asarray(content, dtype=np.int64)
    return named


def _content_or_none(x, y, fingerprint: str | None = None) -> np.ndarray | None:
    """The content keys of rows that have ids too, or None where they have no canonical content.

    Ragged, sparse and object features have none (which is why their records need ids): then there is no
    content naming to tell apart from the ids, and nothing to check.
    """
    import tensorflow as tf

    if any(isinstance(t, tf.RaggedTensor | tf.SparseTensor) for t in tf.nest.flatten([x, y])):
        return None
    try:
        return _cached_content_keys(x, y, fingerprint)
    except ValueError:
        return None


def distinct_id_keys(record_ids) -> np.ndarray:
    """``id_keys(record_ids)`` for the rows of one release, refusing an id given to more than one row.

    Every epsilon counts each row once per noised sum it can enter (a row is the unit of privacy). Two rows
    under one id are one record in the ledger, and that record enters a pass twice: its true epsilon is a
    group-of-two bound, about twice as large, so ids repeated within one release are refused.
    """
    keys = id_keys(record_ids)
    unique, counts = np.unique(keys, return_counts=True)
    if unique.size != keys.size:
        ids = np.asarray(record_ids).ravel()
        first = ids[int(np.flatnonzero(keys == unique[np.argmax(counts)])[0])]
        first = first.item() if isinstance(first, np.generic) else first
        raise ValueError(
            f"record_ids: {keys.size - unique.size} rows repeat an id given to another row (id "
            f"{first!r} names {int(counts.max())} rows). A record must be one row: two rows of one "
            "record enter every pass twice, and their epsilon (a group of two) is larger than the one "
            "printed for rows. Give each row its own id, or merge the rows of a record into one row")
    return keys.view(IdKeys)   # named by ids (their rows' content unknown here)


def _ids_for_rows(x, record_ids) -> np.ndarray:
    """``distinct_id_keys(record_ids)``, refusing a number of ids other than the number of rows of ``x``."""
    keys = distinct_id_keys(record_ids)
    rows = {a.shape[0] for _, a in _arrays(x) if a.ndim}
    if rows and rows != {len(keys)}:
        raise ValueError(f"record_ids: {len(keys)} ids for {sorted(rows)} records of x; give one id per "
                         "record")
    return keys


def record_keys(x=None, y=None, record_ids=None) -> np.ndarray:
    """One int64 key per record: ``distinct_id_keys(record_ids)`` when given, else ``content_keys(x, y)``.

    With both, the number of ids must equal the number of records of ``x``, and the keys are ``IdKeys``
    carrying the rows' content keys.
    """
    if record_ids is not None:
        if x is None:
            return distinct_id_keys(record_ids)
        return _with_content(_ids_for_rows(x, record_ids), _content_or_none(x, y))
    if x is None:
        raise ValueError("x or record_ids: give the data or the records' ids")
    return content_keys(x, y)


def tag_record_keys(dataset, keys):
    """Attach the keys of the records a tf.data pipeline draws from (``record_keys``) and return it.

    ``tfdpbnn.data.poisson_batches`` tags its output; tag a pipeline of your own before ``fit`` so that its
    runs are written to the per-record ledger against its records.
    """
    keys = np.asanyarray(keys)   # ``IdKeys`` keep the content of their rows
    if keys.ndim != 1 or keys.dtype != np.int64:
        raise ValueError(f"keys must come from tfdpbnn.record.records.record_keys (1-D int64), got "
                         f"{keys.dtype} of shape {keys.shape}")
    from tfdpbnn.record import attributes

    attributes.set_dataset_record_keys(dataset, keys)
    return dataset


#: Content keys of recent inputs: (SHA-256 data fingerprint, array names, version) -> keys (read-only),
#: newest last.
_KEYS_CACHE: dict[tuple, np.ndarray] = {}
_KEYS_CACHE_MAX = 4


def _cached_content_keys(x, y, fingerprint: str | None) -> np.ndarray:
    """``content_keys(x, y)``, reused across calls on the same bytes.

    ``fingerprint``: ``tfdpbnn.record.store.data_fingerprint(x, y)`` (SHA-256 of every array's dtype, shape
    and bytes, in ``tf.nest.flatten`` order), computed by the caller on these very arrays. Keys are reused
    only when that fingerprint and the arrays' names and order match a cached entry, and only for numeric
    and boolean arrays (an object array's fingerprint hashes ``str`` of its items, which is not its content
    hash's input). Equal SHA-256 digests mean equal bytes (a collision is not known to be findable), so an
    array changed in place, or a new array, always gets its keys computed again.
    """
    parts = list(_arrays(x, "x")) + ([] if y is None else list(_arrays(y, "y")))
    if fingerprint is None or not parts or any(a.dtype.kind not in "biufc" for _, a in parts):
        return content_keys(x, y)
    from tfdpbnn.record.record_ledger import content_key_version

    version = content_key_version()
    key = (fingerprint, tuple(name for name, _ in parts), version)
    keys = _KEYS_CACHE.pop(key, None)
    if keys is None:
        keys = content_keys(x, y, version)
        keys.setflags(write=False)
    _KEYS_CACHE[key] = keys  # most recent last
    while len(_KEYS_CACHE) > _KEYS_CACHE_MAX:
        del _KEYS_CACHE[next(iter(_KEYS_CACHE))]
    return keys


def input_keys(x, y=None, record_ids=None, fingerprint: str | None = None) -> np.ndarray | None:
    """The record keys of ``fit``'s input: arrays are hashed, a pipeline carries its tag (else None).

    ``fingerprint``: ``tfdpbnn.record.store.data_fingerprint(x, y)`` of these arrays when the caller has
    it: the content keys of the same bytes are then reused from an earlier call (``_cached_content_keys``).
    """
    import tensorflow as tf

    from tfdpbnn.record import attributes

    if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        if record_ids is not None:
            return distinct_id_keys(record_ids)
        return attributes.dataset_record_keys(x)
    if x is None or callable(getattr(x, "__next__", None)) or isinstance(x, tf.keras.utils.Sequence):
        return None if record_ids is None else distinct_id_keys(record_ids)
    if record_ids is None and any(isinstance(t, tf.RaggedTensor | tf.SparseTensor)
                                  for t in tf.nest.flatten([x, y])):
        return None  # no canonical content for ragged or sparse rows: the statement says records are unknown
    if record_ids is None:
        return _cached_content_keys(x, y, fingerprint)
    return _with_content(_ids_for_rows(x, record_ids), _content_or_none(x, y, fingerprint))


__all__ = ["IdKeys", "content_keys", "distinct_id_keys", "id_keys", "input_keys", "record_keys",
           "tag_record_keys"]
