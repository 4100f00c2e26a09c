"""The per-record privacy ledger: every DP release, written against the records it could have touched.

A record is identified by a 64-bit key (``tfdpbnn.record.records``: a user-given id or a canonical content
hash). Every DP release (a training run, a DP preprocessing release, a private calibration release, a
search) is written against the keys of the records it could have touched, so the privacy spent on a record
follows the record, whatever data set, order, subset or superset it came in. The composed epsilon of a
record is the accountant's epsilon of the composition (``ComposedDpEvent``) of every release that touched
it. Records with the same set of releases share one *history* (a chain: a parent history plus one
release), so the work is per distinct history, not per record.

A release has a planned event, written before it runs, and a spent event, written when it stops:

- ``reserve`` writes the release with its planned event against its records in ONE transaction
  (``BEGIN IMMEDIATE``). With a budget set (``set_budget``), it first composes the planned event with every
  distinct history of the records and refuses (``BudgetExceededError``, nothing written) if any record would
  exceed the budget. Concurrent runs therefore see each other's reservations: of two runs that together
  exceed a budget, the second to reserve is refused.
- ``Reservation.commit`` replaces the planned event by what was actually spent (a run that stopped early
  returns the part it did not spend). A release never committed (a killed process) counts its planned event:
  an upper bound.

Training releases carry their ledger phase's id (``tfdpbnn.record.ledger.Phase``): a phase's count is
cumulative over the fits that extend it, so a history composes, per phase id, only the largest version.

Storage is behind ``LedgerBackend``: ``SQLiteLedger`` (the standard library's ``sqlite3``, write-ahead log,
one file shared by the processes of one machine) implements it; a server database (PostgreSQL with
``SERIALIZABLE`` transactions, say) is the path for many machines. A SQLite file on a network file system is
not one: its locks are not reliable there.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import json
import math
import os
import re
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence

import attr
import dp_accounting
import numpy as np

from tfdpbnn._validation import check_choice, check_open_unit, check_positive
from tfdpbnn.privacy.budget import NEIGHBORING
from tfdpbnn.record import store as record_store

#: Version of the ledger file's layout, kept in it (table ``ledger_meta``, key ``schema_version``). Version 3
#: keeps the twin keys of rows named by ids (``content_twins``) in a table of their own (``ledger_twins``) and
#: the content hash naming its records in ``ledger_meta`` (key ``content_key_version``). Versions 1 and 2 kept
#: twin keys among the records and the content of rows named by ids in ``ledger_named``, and named records by
#: the version-1 and version-2 hash; such a file is brought to version 3 when opened (its twin keys moved, its
#: records keeping their keys), and a tfdpbnn that reads only versions 1 and 2 then refuses it.
SCHEMA_VERSION = 3
#: The versions this tfdpbnn reads, each with the content-hash version naming its records
#: (``tfdpbnn.record.records.content_keys``), or None where the file says which (version 3).
READABLE_VERSIONS = {1: 1, 2: 2, 3: None}
#: The content hash naming the records of a new ledger file.
CONTENT_KEY_VERSION = 2
#: What a release can be.
RELEASE_KINDS = ("training", "preprocessing", "calibration", "search", "other")


class BudgetExceededError(ValueError):
    """A reservation that would take some record over the ledger's budget (nothing was written)."""


class RecordNamingError(ValueError):
    """A release naming records one way (``record_ids`` or content) that earlier releases named the other way.

    One record under two keys would have two histories, neither holding the other's spending (nothing was
    written).
    """


class SchemaVersionError(RuntimeError):
    """The ledger file was written by a version of tfdpbnn whose ledger layout this one cannot read."""


# ------------------------------------------------------------------------------ DpEvent <-> JSON
def event_to_config(event: dp_accounting.DpEvent) -> dict:
    """``{"name": class name, field: value, ...}`` of a dp-accounting ``DpEvent``, nested events as dicts.

    JSON-safe; ``event_from_config`` rebuilds the event.
    """
    if not isinstance(event, dp_accounting.DpEvent):
        raise ValueError(f"event must be a dp_accounting DpEvent, got {type(event).__name__}")
    config = {"name": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_accounting.DpEvent):
            value = event_to_config(value)
        elif isinstance(value, list | tuple):
            value = [event_to_config(v) if isinstance(v, dp_accounting.DpEvent) else v for v in value]
        elif isinstance(value, np.generic):
            value = value.item()
        config[field.name] = value
    return config


def event_from_config(config: dict) -> dp_accounting.DpEvent:
    """The ``DpEvent`` of ``event_to_config``'s dict."""
    config = dict(config)
    cls = getattr(dp_accounting, config.pop("name"))
    for key, value in config.items():
        if isinstance(value, dict) and "name" in value:
            config[key] = event_from_config(value)
        elif isinstance(value, list):
            config[key] = [event_from_config(v) if isinstance(v, dict) and "name" in v else v for v in value]
    return cls(**config)


# ---------------------------------------------------------------------------------- the records
@dataclasses.dataclass(frozen=True)
class Release:
    """One DP release as the ledger holds it.

    Attributes:
      release_id: the ledger's id (0 before it is written).
      kind: one of ``RELEASE_KINDS``.
      neighboring: "add_or_remove" or "replace_one" (the event is in units of that relation's sensitivity).
      planned: the planned event's config (``event_to_config``).
      spent: the spent event's config, or None while the release is reserved (then ``planned`` counts).
      phase_id: the training phase whose version (cumulative over the fits that extend it) the event is,
        else None; a history composes only the largest version of each phase.
      phase_ids: every ledger phase the release's event covers (how a model finds its records).
      description: one line for people.
    """

    release_id: int
    kind: str
    neighboring: str
    planned: dict
    spent: dict | None = None
    phase_id: int | None = None
    description: str = ""
    phase_ids: tuple = ()

    @property
    def committed(self) -> bool:
        """Whether what the release spent was written (else its planned event counts)."""
        return self.spent is not None

    @property
    def token(self) -> str | None:
        """The release's token (``new_release_token``), read from its description; None if written without."""
        found = _TOKEN_PATTERN.search(self.description)
        return found.group(1) if found else None

    @property
    def samplers(self) -> tuple[tuple[str, str], ...]:
        """The ``(key digest, stream)`` pairs of the user-keyed samplers the release's steps drew from.

        Read from its description (``RecordLedger.reserve(sampler=...)`` writes them so): a training release
        on ``poisson_batches(secret_seed=...)`` batches holds its own; a training phase's version holds those
        of the versions it superseded too (``_fold_composable``).
        """
        return tuple(_SAMPLER_PATTERN.findall(self.description))

    def event(self) -> dp_accounting.DpEvent:
        """What counts: the spent event, or the planned one while reserved."""
        return self.counted[0]

    @functools.cached_property
    def counted(self) -> tuple[dp_accounting.DpEvent, float]:
        """``(event(), its size)`` (``_event_size``), decoded once.

        A release object never changes (a commit is read back as a new object), and a history composes
        each of its releases at every reservation under a budget.
        """
        event = event_from_config(self.spent if self.spent is not None else self.planned)
        return event, _event_size(event)


#: A release token's digits (``new_release_token``), and the token as a release's description holds it
#: (``RecordLedger.reserve(token=...)`` writes it so, ``Release.token`` reads it).
_TOKEN_DIGITS = re.compile(r"[0-9a-f]{32}")
_TOKEN_PATTERN = re.compile(r"\[release (" + _TOKEN_DIGITS.pattern + r")\]")
#: A user-keyed sampler as a training release's description holds it: the digest of the ``secret_seed`` its
#: batches were drawn from (``tfdpbnn.data.poisson.secret_seed_digest``) and the dataset object's stream.
_SAMPLER_PATTERN = re.compile(r"\[sampler ([0-9a-f]{32}) ([0-9a-f]{32})\]")


def new_release_token() -> str:
    """A fresh random name for one release: 128 bits from the operating system's entropy, as 32 hex digits.

    Written in the release's ledger description (``RecordLedger.record(token=...)``) and kept with the
    release on its model's optimizer, it tells which histories hold that very release (``Release.token``):
    a ledger id names a row of one file only, and two files (another store, a fresh one for a rerun of the
    same script) number their releases alike.
    """
    return os.urandom(16).hex()


@dataclasses.dataclass(frozen=True)
class History:
    """A set of releases and how many records have exactly that set."""

    history_id: int
    records: int
    releases: tuple[Release, ...]
    #: When ``releases`` holds only the releases that compose (read for a reservation's check: one per
    #: phase id, the largest, and every release without one): the neighboring relations of all of them.
    relations: frozenset | None = None

    def composed(self, extra: Sequence[Release] = ()) -> list[dp_accounting.DpEvent]:
        """The events that compose for a record of this history (plus ``extra``), one per phase id."""
        return _composable(list(self.releases) + list(extra))


def _event_size(event) -> float:
    """A size of a training phase's event (count x sample rate / sigma^2), to pick its largest version."""
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return float(event.count) * _event_size(event.event)
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        return float(event.sampling_probability) * _event_size(event.event)
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1.0 / float(event.noise_multiplier) ** 2
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return sum(_event_size(e) for e in event.events)
    return math.inf


def _fold_composable(plain: tuple, by_phase: dict, release: Release) -> tuple[tuple, dict]:
    """``(plain, by_phase)`` with ``release`` folded in (new objects; the given ones are not changed).

    ``plain``: the releases without a phase id (each composes); ``by_phase``: {phase id: (its largest
    release, that release's size)}, the first of equal sizes kept (a phase's count is cumulative over the
    fits that extend it, so only its largest version composes).
    """
    if release.phase_id is None:
        return plain + (release,), by_phase
    held = by_phase.get(release.phase_id)
    size = release.counted[1]
    if held is None:
        return plain, {**by_phase, release.phase_id: (release, size)}
    if size > held[1]:
        return plain, {**by_phase, release.phase_id: (_with_samplers(release, held[0]), size)}
    kept = _with_samplers(held[0], release)
    return (plain, by_phase) if kept is held[0] else (plain, {**by_phase, release.phase_id: (kept, held[1])})


def _with_samplers(kept: Release, other: Release) -> Release:
    """``kept`` holding ``other``'s samplers too (``Release.samplers``); ``kept`` itself if it holds them.

    A phase's version counts the steps of the versions it supersedes, and so the user-keyed batches they
    drew, which a later run from the same key would draw again (``RecordLedger.reserve(sampler=...)``).
    """
    missing = [pair for pair in other.samplers if pair not in kept.samplers]
    if not missing:
        return kept
    tags = " ".join(f"[sampler {digest} {stream}]" for digest, stream in missing)
    return dataclasses.replace(kept, description=f"{kept.description} {tags}")


def _composable_releases(plain: tuple, by_phase: dict) -> tuple[Release, ...]:
    """The releases that compose, of a ``_fold_composable`` state."""
    return plain + tuple(release for release, _ in by_phase.values())


def _composable(releases: Sequence[Release]) -> list[dp_accounting.DpEvent]:
    """The events that compose for a record with ``releases`` (``_fold_composable``), oldest first."""
    plain: tuple = ()
    by_phase: dict = {}
    for release in releases:
        plain, by_phase = _fold_composable(plain, by_phase, release)
    return [release.counted[0] for release in _composable_releases(plain, by_phase)]


def _check_accountant(accountant: str) -> None:
    from tfdpbnn.privacy.registry import sound_accountants

    if accountant not in sound_accountants():
        raise ValueError(f"accountant must be one of the sound accountants {sound_accountants()}, got "
                         f"{accountant!r}")


def composed_epsilon(events: Sequence[dp_accounting.DpEvent], delta: float, accountant: str,
                     neighboring: str) -> float:
    """Epsilon at ``delta`` of ``events`` composed, by a sound accountant (0 for none; inf if non-private)."""
    from tfdpbnn.record.ledger import _epsilon_of

    _check_accountant(accountant)
    return _epsilon_of(dp_accounting.ComposedDpEvent(list(events)), delta, accountant, neighboring)


# ------------------------------------------------------------------------------------- backends
class LedgerBackend(abc.ABC):
    """Where the ledger lives. A backend keeps, atomically, records -> history -> releases (see the module).

    ``reserve`` must run ``check`` and its writes in one serializable transaction, so that two reservations
    over common records never both pass a check that only one of them could pass.
    """

    @abc.abstractmethod
    def reserve(self, keys: np.ndarray, release: Release,
                check: Callable[[Callable[[], list[History]], dict | None, Callable[[], set]], None],
                named: np.ndarray | None = None, pairs: tuple | None = None) -> int:
        """Check the histories of ``keys`` and write ``release`` against them, in one transaction.

        ``check(histories, budget, neighborings)`` raises to refuse (nothing written): ``budget`` as
        ``budget()`` reads it, ``histories()`` the records' histories (at least the releases of each that
        compose, with ``History.relations`` set when only those) and ``neighborings()`` the set of the
        neighboring relations of every release on the records, each read in the same transaction when
        called (a check without a budget needs only the relations, which do not grow with the histories'
        length). ``keys`` are distinct int64. Returns the release's id.

        ``named``: when ``keys`` are keys of user-given ids whose rows' content is known, the content keys
        of those rows (distinct int64, ascending); the release is then written on their twin keys
        (``content_twins``) too, kept apart from the records' keys (``twin_count`` counts them), so it is
        written on the rows' content as well. The same transaction refuses
        (``RecordNamingError``, nothing written) a release with ``named`` any of whose content keys has a
        history (records named by content before), and a release without it any of whose keys is the
        content of twin keys written by earlier releases (records named by ids before).

        ``pairs``: with ``named``, the (id keys, content keys) of the release's rows, row by row. A key new
        to the backend whose pair has a history joins it: a new id whose row's twin key has one (the same
        row named by other ids before), a new twin key whose ids share one (ids named without their rows
        before), so both keys of a row hold the row's releases.
        """

    @abc.abstractmethod
    def commit(self, release_id: int, spent: dict, phase_id: int | None, phase_ids: Sequence[int]) -> None:
        """Write what release ``release_id`` spent (an ``event_to_config`` dict) and the phases it covers."""

    @abc.abstractmethod
    def histories(self, keys: np.ndarray | None = None, twins: np.ndarray | None = None) -> list[History]:
        """The distinct histories of ``keys`` (of every record when None), with their record counts.

        ``twins``: twin keys (``content_twins``, distinct) whose histories are read too (with ``keys``).
        """

    @abc.abstractmethod
    def set_budget(self, epsilon: float, delta: float, accountant: str) -> None:
        """Set the per-record budget (the latest one set holds)."""

    @abc.abstractmethod
    def budget(self) -> dict | None:
        """The per-record budget ``{"epsilon", "delta", "accountant"}``, or None."""

    @abc.abstractmethod
    def releases(self, exclude_kind: str | None = None) -> list[Release]:
        """Every release, oldest first (``exclude_kind``: all but the releases of that kind)."""

    @abc.abstractmethod
    def keys(self, history_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(record keys, twin keys) (int64) of the records whose current history is one of ``history_ids``."""

    @abc.abstractmethod
    def twin_count(self, history_ids: Sequence[int]) -> int:
        """How many keys in ``history_ids`` are twins (``content_twins``) of content named by ids."""

    @property
    def content_key_version(self) -> int:
        """Which content hash names the backend's records (``tfdpbnn.record.records.content_keys``).

        A backend whose records were written with the version-1 hash says 1, so that its records keep
        their keys; a new backend uses the current one.
        """
        return CONTENT_KEY_VERSION


_TABLES = """
CREATE TABLE IF NOT EXISTS ledger_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_releases (
    release INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, neighboring TEXT NOT NULL,
    phase_id INTEGER, phase_ids TEXT NOT NULL, planned TEXT NOT NULL, spent TEXT,
    description TEXT NOT NULL, created REAL NOT NULL, committed REAL, host TEXT NOT NULL,
    pid INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_histories (
    history INTEGER PRIMARY KEY AUTOINCREMENT, parent INTEGER, release INTEGER NOT NULL,
    records INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS ledger_histories_parent ON ledger_histories(parent);
CREATE INDEX IF NOT EXISTS ledger_releases_kind ON ledger_releases(kind, release);
CREATE TABLE IF NOT EXISTS ledger_records (record INTEGER PRIMARY KEY, history INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_twins (record INTEGER PRIMARY KEY, history INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_named (content INTEGER NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS ledger_budget (
    set_at REAL NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, accountant TEXT NOT NULL);
"""


#: Ledger files whose tables this process has made or checked: (path, device, inode) -> (the file's version,
#: its content-hash version).
_CHECKED: dict[tuple, tuple[int, int]] = {}
#: Committed releases decoded from each ledger file: file identity -> {release id: (created, Release)}.
_DECODED: dict[tuple, dict] = {}
#: The most releases kept decoded per file (then the file's are dropped and decoded again as needed).
_DECODED_MAX = 100_000
#: The history chains read from each ledger file: file identity -> {(the chain's last history row's parent,
#: release, the release's ``created`` time): (the parent chain's key or None, frozenset of the chain's
#: releases' neighboring relations)} (``SQLiteLedger._chains``).
_CHAINS: dict[tuple, dict] = {}
#: The most chains kept per file (then the file's are dropped and read again as needed).
_CHAINS_MAX = 200_000
#: The composable releases of each committed chain: file identity -> {chain key (``_CHAINS``'s): its
#: ``_fold_composable`` state} (``SQLiteLedger._composable_histories``).
_COMPOSABLE: dict[tuple, dict] = {}
#: Where this process's last reservation on each ledger file left its records: file identity ->
#: (the keys, distinct int64 (a copy); the release's id; its ``created`` time; {history: records}).
_PLACED: dict[tuple, tuple] = {}
#: The content keys of records named by ids that this process last wrote (or found) in each ledger file:
#: file identity -> distinct int64 (``SQLiteLedger._check_naming``).
_NAMED: dict[tuple, np.ndarray] = {}
#: Keys (records named by content) this process last found clear of records named by ids in each ledger file:
#: file identity -> ((``ledger_meta``'s ``twins_written``, ``ledger_named``'s largest rowid) when they were
#: found so, the distinct keys) (``SQLiteLedger._check_naming``).
_CLEAR_OF_NAMED: dict[tuple, tuple] = {}
#: The last keys made distinct (``_distinct``): [(the keys as given, int64, a copy; their distinct keys)].
_DISTINCT: list[tuple] = []


def _distinct(keys) -> np.ndarray:
    """``np.unique(np.asarray(keys, np.int64))`` (read-only), reused when ``keys`` equal the last call's.

    The answer depends on the keys' values alone, and they are compared in full (one ``array_equal``, a
    fraction of the sort): a ``fit`` on the same arrays as the last reservation (the keys are
    ``tfdpbnn.record.records.input_keys``, the same for the same bytes) sorts them once.
    """
    keys = np.asarray(keys, dtype=np.int64)
    held = _DISTINCT[0] if _DISTINCT else None
    if held is not None and held[0].shape == keys.shape and np.array_equal(held[0], keys):
        return held[1]
    distinct = np.unique(keys)
    distinct.setflags(write=False)
    _DISTINCT[:] = [(np.array(keys, copy=True), distinct)]
    return distinct


class TrainingKeys(np.ndarray):
    """Record keys read from the ledger (``RecordLedger.training_keys``), with their twin keys.

    ``twins`` (int64): the twin keys (``content_twins``) the same releases were written on; a release
    reserved on these keys is written on both.
    """

    twins: np.ndarray

    def __array_finalize__(self, obj) -> None:
        self.twins = np.zeros([0], np.int64)


def content_twins(content: np.ndarray) -> np.ndarray:
    """The twin keys (``~content``, int64) under which the content of rows named by ids is written.

    A release naming records by ids whose rows are known is written on each row's content too, under this
    key (a bijection of the content key, apart from the keys of records named by content, which are never
    written for rows named by ids: ``RecordNamingError``). The same rows named by other ids in another
    release (renamed, or ``7`` and ``"7.0"``) then share the twin's history, and a bound over either
    release composes both. Two people whose rows have equal features share it too: an over-count.
    """
    return np.invert(np.asarray(content, np.int64))


def _named_content(keys) -> np.ndarray | None:
    """The distinct content keys (read-only) of ``IdKeys`` rows; empty without content; None if not ids.

    ``IdKeys`` name records by ids (their rows' content is known or not); other keys name them by content.
    """
    if not hasattr(keys, "content"):   # ``IdKeys`` always have it (None without content); arrays do not
        return None
    named = np.unique(np.asarray(keys.content if keys.content is not None else (), np.int64))
    named.setflags(write=False)
    return named


class SQLiteLedger(LedgerBackend):
    """``LedgerBackend`` in one SQLite file (write-ahead log), shared by the processes of one machine.

    Its tables (``ledger_*``) can live in the privacy record store's file. The file's ledger layout version
    is checked on opening: a file without ledger tables gets them; a file of another version raises
    ``SchemaVersionError`` saying what to do. Each process (and thread) keeps its connection
    open (``tfdpbnn.record.store.kept_connection``).

    Args:
      path: the SQLite file (created with its directory if missing).
      timeout: seconds to wait for another process's write lock.
    """

    def __init__(self, path, timeout: float = 60.0):
        self.path = record_store.checked_file(path, "the record ledger")
        self._timeout = float(timeout)
        # Tables made or checked by this process: only the version is read (one statement; the whole check
        # again if its table is gone or its version changed).
        identity = record_store.file_identity(self.path)
        checked = _CHECKED.get(identity)
        if checked:
            with self._transaction("DEFERRED") as conn:
                try:
                    if self._check_version(conn) == checked[0]:
                        self.schema_version, self._content_key_version = checked
                        return
                except sqlite3.OperationalError:  # no ledger_meta table: the whole check below
                    pass
        with self._transaction() as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "ledger_meta" not in tables and tables & {"ledger_releases", "ledger_records",
                                                          "ledger_histories"}:
                raise SchemaVersionError(
                    f"{self.path}: it has record-ledger tables but no schema version; it was not written by "
                    "tfdpbnn's ledger. Point TFDPBNN_PRIVACY_STORE at another file.")
            version = self._check_version(conn) if "ledger_meta" in tables else None
            for statement in _TABLES.strip().split(";"):
                if statement.strip():
                    conn.execute(statement)
            if version is None:  # a new ledger
                conn.executemany("INSERT INTO ledger_meta VALUES (?, ?)", [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("content_key_version", str(CONTENT_KEY_VERSION))])
            elif version != SCHEMA_VERSION:
                self._upgrade(conn, version)
            self.schema_version = self._check_version(conn)
            (content,) = conn.execute(
                "SELECT value FROM ledger_meta WHERE key = 'content_key_version'").fetchone()
            self._content_key_version = int(content)
        # A file replaced at the path is checked again.
        _CHECKED[record_store.file_identity(self.path)] = (self.schema_version, self._content_key_version)

    @staticmethod
    def _upgrade(conn, version: int) -> None:
        """Bring a version-1 or version-2 ledger to this layout (``SCHEMA_VERSION``), in the open transaction.

        Its twin keys (``content_twins`` of the content in ``ledger_named``) move from ``ledger_records`` to
        ``ledger_twins`` with their histories; ``ledger_named`` stays, for the content of rows named by ids
        in releases written before twin keys were (``_check_naming`` reads it). Its records keep their
        content hash (``READABLE_VERSIONS``); a file with no release yet names no record and takes
        ``CONTENT_KEY_VERSION``.
        """
        empty = conn.execute("SELECT 1 FROM ledger_releases LIMIT 1").fetchone() is None
        content = CONTENT_KEY_VERSION if empty else READABLE_VERSIONS[version]
        twins = "~record IN (SELECT content FROM ledger_named)"
        conn.execute(f"INSERT INTO ledger_twins (record, history) SELECT record, history FROM ledger_records "
                     f"WHERE {twins}")
        conn.execute(f"DELETE FROM ledger_records WHERE {twins}")
        conn.executemany("INSERT OR REPLACE INTO ledger_meta VALUES (?, ?)", [
            ("schema_version", str(SCHEMA_VERSION)), ("content_key_version", str(content))])

    @property
    def content_key_version(self) -> int:
        """The content hash naming this file's records (``ledger_meta``'s ``content_key_version``)."""
        return self._content_key_version

    def _check_version(self, conn) -> int:
        """The file's ledger version; ``SchemaVersionError`` unless it is one of ``READABLE_VERSIONS``.

        ``sqlite3.OperationalError`` when the file has no ``ledger_meta`` table.
        """
        row = conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()
        version = None if row is None else row[0]
        if version not in {str(v) for v in READABLE_VERSIONS}:
            raise SchemaVersionError(
                f"{self.path}: its record ledger has schema version {version}, this tfdpbnn reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}. Open it with the tfdpbnn version that "
                "wrote it (a newer one reads older files), or point TFDPBNN_PRIVACY_STORE at a new file; "
                "never delete the file: the privacy it records was spent.")
        return int(version)

    def _transaction(self, mode: str = "IMMEDIATE", durable: bool = True):
        """``tfdpbnn.record.store.transaction`` on this file (joins one already open in this thread)."""
        return record_store.transaction(self.path, self._timeout, mode, durable)

    # ------------------------------------------------------------------------------------- reading
    _RELEASE_COLUMNS = "release, kind, neighboring, phase_id, planned, spent, description, phase_ids, created"

    def _decode(self, rows) -> list[Release]:
        """``Release`` objects of ``ledger_releases`` rows (``_RELEASE_COLUMNS``).

        A committed release's row never changes, so it is decoded once per process and file (kept with its
        ``created`` time, which a row must match to reuse it: a file replaced at the same path is not
        mistaken for this one).
        """
        cache = _DECODED.setdefault(record_store.file_identity(self.path), {})
        out = []
        for row in rows:
            held = cache.get(row[0])
            if held is not None and held[0] == row[8]:
                out.append(held[1])
                continue
            release = Release(release_id=row[0], kind=row[1], neighboring=row[2], phase_id=row[3],
                              planned=json.loads(row[4]),
                              spent=None if row[5] is None else json.loads(row[5]),
                              description=row[6], phase_ids=tuple(json.loads(row[7])))
            if release.committed:
                if len(cache) >= _DECODED_MAX:
                    cache.clear()
                cache[row[0]] = (row[8], release)
            out.append(release)
        return out

    def _chains(self, conn, ids: list[int], identity: tuple) -> tuple[dict[int, tuple], dict] | None:
        """``({history: the key of its chain}, the chains kept)`` for the histories ``ids``, read and kept.

        A history's chain is its parent's chain and its own release. A history row changes only when the
        history takes a new release (its former parent and release move to a new row, to which its children
        are pointed) or when its parent's row moves: a (parent, release) pair names one chain for good, as
        long as the release is the same (its ``created`` time, against a rolled-back release's id taken
        again). So each chain read is kept by that triple, with its parent chain's triple and the relations
        of its releases (``_CHAINS``, only from a transaction that has written nothing: committed rows), and
        a history that took one release since is found from its parent's row: two rows read per history,
        not its whole chain (which grows by one release per fit on its records). Chains not kept are walked
        in one statement. ``identity``: the file's (``file_identity``). None when nothing can be kept here
        (a transaction that has written).
        """
        if not record_store.unwritten(conn):
            return None
        nodes = _CHAINS.setdefault(identity, {})
        found: dict[int, tuple] = {}
        unknown: list[int] = []
        for history, parent, release, created, relation, grand, above, above_created in conn.execute(
                "SELECT h.history, h.parent, h.release, r.created, r.neighboring, p.parent, p.release, "
                "pr.created FROM ledger_histories h JOIN ledger_releases r ON r.release = h.release "
                "LEFT JOIN ledger_histories p ON p.history = h.parent "
                "LEFT JOIN ledger_releases pr ON pr.release = p.release "
                "WHERE h.history IN (SELECT value FROM json_each(?))", (json.dumps(ids),)):
            key = (parent, release, created)
            if key not in nodes:
                above_key = (grand, above, above_created)
                if parent is None:
                    nodes[key] = (None, frozenset({relation}))
                elif above_key in nodes:
                    nodes[key] = (above_key, nodes[above_key][1] | {relation})
                else:
                    unknown.append(history)
                    continue
            found[history] = key
        if unknown:  # every ancestor of these histories, with its parent and its release (one statement)
            rows = {history: (parent, release, created, relation)
                    for history, parent, release, created, relation in conn.execute(
                        "WITH RECURSIVE up(h) AS (SELECT value FROM json_each(?) UNION "
                        "SELECT p.parent FROM ledger_histories p JOIN up ON p.history = up.h "
                        "WHERE p.parent IS NOT NULL) "
                        "SELECT l.history, l.parent, l.release, r.created, r.neighboring "
                        "FROM ledger_histories l JOIN ledger_releases r ON r.release = l.release "
                        "WHERE l.history IN (SELECT h FROM up)", (json.dumps(unknown),))}

            def kept(history):  # the key of ``history``'s chain, kept with its ancestors' (no recursion)
                path, cursor = [], history
                while cursor is not None:
                    parent, release, created, relation = rows[cursor]
                    key = (parent, release, created)
                    if key in nodes:
                        break
                    path.append((key, relation, parent))
                    cursor = parent
                for key, relation, parent in reversed(path):
                    above_key = None if parent is None else rows[parent][:3]
                    below = frozenset() if above_key is None else nodes[above_key][1]
                    nodes[key] = (above_key, below | {relation})
                return rows[history][:3]

            for history in unknown:
                found[history] = kept(history)
        if len(nodes) > _CHAINS_MAX:
            _CHAINS.pop(identity, None)
        return found, nodes

    @staticmethod
    def _releases_of(key, nodes) -> list[tuple]:
        """The (release, created) of the chain ``key`` names in ``nodes``, oldest first."""
        chain = []
        while key is not None:
            chain.append(key[1:])
            key = nodes[key][0]
        return chain[::-1]

    def _histories(self, conn, counts: dict, composable_only: bool = False) -> list[History]:
        """``History`` objects for ``{history id (or None: no history yet): record count}``.

        The chains from ``_chains`` (kept); each release from the releases decoded already
        (``_decode``'s, committed, with the same ``created`` time) or read in one statement.
        ``composable_only``: each history with only the releases that compose, and the relations of all
        (``History.relations``; ``_composable_histories``): what a reservation's check reads.
        """
        ids = [h for h in counts if h is not None]
        chains: dict[int, list] = {}
        releases: dict[int, Release] = {}
        identity = record_store.file_identity(self.path)
        kept = self._chains(conn, ids, identity) if ids else ({}, {})
        if kept is None:  # nothing kept: the whole chains, read as they are
            return self._histories_read(conn, counts)
        found, nodes = kept
        decoded = _DECODED.get(identity, {})
        if composable_only:
            return self._composable_histories(conn, counts, found, nodes, identity, decoded)
        missing = set()
        for history, key in found.items():
            chain = self._releases_of(key, nodes)
            chains[history] = [release for release, _ in chain]
            for release, created in chain:
                held = decoded.get(release)
                if held is not None and held[0] == created:
                    releases[release] = held[1]
                else:
                    missing.add(release)
        if missing:
            releases.update((r.release_id, r) for r in self._decode(conn.execute(
                f"SELECT {self._RELEASE_COLUMNS} FROM ledger_releases WHERE release IN "
                "(SELECT value FROM json_each(?))", (json.dumps(sorted(missing)),)).fetchall()))
        return [History(history_id=0 if h is None else h, records=int(count),
                        releases=tuple(releases[r] for r in chains.get(h, [])))
                for h, count in counts.items()]

    def _composable_histories(self, conn, counts: dict, found: dict, nodes: dict, identity: tuple,
                              decoded: dict) -> list[History]:
        """``_histories`` with only the releases that compose (``_composable``'s), folded along each chain.

        A chain's composable releases are its parent chain's with its own release folded in
        (``_fold_composable``), so they are kept
        per chain key (``_COMPOSABLE``) where every release of the chain is committed (a planned event
        changes when committed): a history that took one release since folds one release, not its chain
        (which grows by one release per fit on its records).
        """
        memo = _COMPOSABLE.setdefault(identity, {})
        walks: dict[int, tuple[list, tuple | None]] = {}
        missing = set()
        for history, key in found.items():
            path, cursor = [], key
            while cursor is not None and cursor not in memo:
                path.append(cursor)
                cursor = nodes[cursor][0]
            walks[history] = (path, cursor)
            for _, release, created in path:
                held = decoded.get(release)
                if held is None or held[0] != created:
                    missing.add(release)
        read = {}
        if missing:
            read = {r.release_id: r for r in self._decode(conn.execute(
                f"SELECT {self._RELEASE_COLUMNS} FROM ledger_releases WHERE release IN "
                "(SELECT value FROM json_each(?))", (json.dumps(sorted(missing)),)).fetchall())}
        out = []
        for history, count in counts.items():
            if history is None:
                out.append(History(history_id=0, records=int(count), releases=(), relations=frozenset()))
                continue
            path, base = walks[history]
            plain, by_phase = memo[base] if base is not None else ((), {})
            clean = True   # every release folded so far is committed (a memoized base is)
            for key in reversed(path):
                _, release_id, created = key
                held = decoded.get(release_id)
                release = held[1] if held is not None and held[0] == created else read[release_id]
                plain, by_phase = _fold_composable(plain, by_phase, release)
                clean = clean and release.committed
                if clean:
                    memo[key] = (plain, by_phase)
            out.append(History(history_id=history, records=int(count),
                               releases=_composable_releases(plain, by_phase),
                               relations=nodes[found[history]][1]))
        if len(memo) > _CHAINS_MAX:
            _COMPOSABLE.pop(identity, None)
        return out

    def _histories_read(self, conn, counts: dict) -> list[History]:
        """``_histories`` from a read of every chain (in a transaction that has written: nothing kept)."""
        chains: dict[int, list[int]] = {}
        ids = [h for h in counts if h is not None]
        releases = {}
        if ids:
            # Every ancestor of the wanted histories, each with its parent and its release's row (one
            # statement).
            columns = ", ".join(f"r.{c.strip()}" for c in self._RELEASE_COLUMNS.split(","))
            rows = conn.execute(
                "WITH RECURSIVE up(h) AS (SELECT value FROM json_each(?) UNION "
                "SELECT p.parent FROM ledger_histories p JOIN up ON p.history = up.h "
                "WHERE p.parent IS NOT NULL) "
                f"SELECT l.history, l.parent, {columns} FROM ledger_histories l "
                "JOIN ledger_releases r ON r.release = l.release WHERE l.history IN (SELECT h FROM up) "
                "ORDER BY r.release", (json.dumps(ids),)).fetchall()
            link = {row[0]: (row[1], row[2]) for row in rows}
            for h in ids:
                chain, cursor = [], h
                while cursor is not None:
                    parent, release = link[cursor]
                    chain.append(release)
                    cursor = parent
                chains[h] = chain[::-1]
            distinct = {row[2]: row[2:] for row in rows}  # each release once (on several rows, maybe)
            releases = {r.release_id: r for r in self._decode(distinct.values())}
        return [History(history_id=0 if h is None else h, records=int(count),
                        releases=tuple(releases[r] for r in chains.get(h, [])))
                for h, count in counts.items()]

    def _neighborings(self, conn, counts: dict) -> set[str]:
        """The neighboring relations of every release on the histories ``counts`` names (their chains).

        From the chains ``_chains`` keeps (each with its releases' relations): two rows read per history,
        not its whole chain; in a transaction that has written, from the histories read in full.
        """
        ids = [h for h in counts if h is not None]
        if not ids:
            return set()
        kept = self._chains(conn, ids, record_store.file_identity(self.path))
        if kept is None:
            return {r.neighboring for h in self._histories_read(conn, counts) for r in h.releases}
        found, nodes = kept
        return set().union(*(nodes[key][1] for key in found.values()))

    @staticmethod
    def _placed_counts(conn, identity: tuple, keys: np.ndarray, twins: np.ndarray) -> dict | None:
        """{history: record count} of ``keys`` and ``twins`` without reading their rows, or None (read them).

        Known when this process's last reservation on the file was for the same keys and no release since
        moved any of them. After a reservation, its release is on every history its records are in, and
        those histories hold no other record; a later release moving some of them leaves fewer records in
        the history, and one moving all of them puts itself in the history's row (``reserve``); records
        never join a history that exists. So the same (release, records) in every such history means the
        same records are there. The release's row (its ``created`` time and process) must be this
        reservation's own: one rolled back with its transaction may leave its ids to another.
        """
        placed = _PLACED.get(identity)
        if placed is None or any(a.shape != b.shape or not np.array_equal(a, b)
                                 for a, b in zip(placed[0], (keys, twins), strict=True)):
            return None
        _, release_id, created, where = placed
        # The release's row and the histories' rows, in one statement.
        row = conn.execute(
            "SELECT r.created, r.pid, (SELECT json_group_array(json_array(h.history, h.release, h.records)) "
            "FROM ledger_histories h WHERE h.history IN (SELECT value FROM json_each(?))) "
            "FROM ledger_releases r WHERE r.release = ?", (json.dumps(list(where)), release_id)).fetchone()
        if row is None or row[0] != created or row[1] != os.getpid():
            return None
        now = {h: n for h, release, n in json.loads(row[2]) if release == release_id}
        return dict(where) if now == where else None

    @staticmethod
    def _key_counts(conn, keys: np.ndarray, text: str | None = None, twins: np.ndarray | None = None,
                    twins_text: str | None = None) -> tuple[dict, str]:
        """{history (None: records new to the ledger): record count} of ``keys`` (distinct), in one statement.

        With the twin keys ``twins`` (distinct; ``twins_text``, their JSON array), theirs counted in too.
        Also returns the keys as the JSON array the statement read (str of a list of ints is one, parsed by
        SQLite's ``json_each`` in C), for a statement that writes their rows. Only the records the ledger
        holds are grouped (SQLite sorts the rows it groups); the new ones are the rest of ``keys``.
        """
        text = str(np.asarray(keys, dtype=np.int64).tolist()) if text is None else text
        held_in = ("SELECT r.history, COUNT(*) FROM json_each(?) j JOIN ledger_records r "
                   "ON r.record = j.value GROUP BY r.history")
        if twins is None or not len(twins):
            held = conn.execute(held_in, (text,)).fetchall()
        else:
            held = conn.execute(
                f"SELECT history, SUM(n) FROM ({held_in.replace('COUNT(*)', 'COUNT(*) AS n')} UNION ALL "
                "SELECT t.history, COUNT(*) FROM json_each(?) j JOIN ledger_twins t ON t.record = j.value "
                "GROUP BY t.history) GROUP BY history", (text, twins_text)).fetchall()
        new = len(keys) + (0 if twins is None else len(twins)) - sum(count for _, count in held)
        return ({None: new} if new else {}) | dict(held), text

    def histories(self, keys=None, twins=None) -> list[History]:
        """The distinct histories of ``keys`` (of every record when None), with their record counts.

        ``twins``: twin keys (``content_twins``, distinct) whose histories are read too (with ``keys``).
        """
        with self._transaction("DEFERRED") as conn:
            if keys is None and twins is None:
                counts = dict(conn.execute("SELECT history, records FROM ledger_histories WHERE records > 0"))
            elif twins is None or not len(twins):
                counts, _ = self._key_counts(conn, keys)
            else:
                keys = np.zeros([0], np.int64) if keys is None else keys
                counts, _ = self._key_counts(conn, keys, twins=twins,
                                             twins_text=str(np.asarray(twins, np.int64).tolist()))
            return self._histories(conn, counts)

    def releases(self, exclude_kind: str | None = None) -> list[Release]:
        """Every release, oldest first (``exclude_kind``: all but the releases of that kind)."""
        with self._transaction("DEFERRED") as conn:
            if exclude_kind is None:
                return self._decode(conn.execute(
                    f"SELECT {self._RELEASE_COLUMNS} FROM ledger_releases ORDER BY release"))
            # "kind != ?" as two ranges, which the index on kind reads without visiting the excluded kind's
            # rows (one training release per fit: their number grows); ordered here, so SQLite keeps the
            # index (an ORDER BY would make it scan the table in release order).
            rows = conn.execute(f"SELECT {self._RELEASE_COLUMNS} FROM ledger_releases "
                                "WHERE (kind < ? OR kind > ?)", (exclude_kind, exclude_kind)).fetchall()
            return self._decode(sorted(rows, key=lambda row: row[0]))

    def keys(self, history_ids) -> tuple[np.ndarray, np.ndarray]:
        """(record keys, twin keys) of the records whose current history is one of ``history_ids``."""
        wanted = json.dumps([int(h) for h in history_ids])

        def held(conn, table) -> np.ndarray:
            return np.asarray([r[0] for r in conn.execute(
                f"SELECT record FROM {table} WHERE history IN (SELECT value FROM json_each(?))", (wanted,))],
                dtype=np.int64)

        with self._transaction("DEFERRED") as conn:
            return held(conn, "ledger_records"), held(conn, "ledger_twins")

    def twin_count(self, history_ids) -> int:
        """How many twin keys (``ledger_twins``) have their current history in ``history_ids``."""
        with self._transaction("DEFERRED") as conn:
            (count,) = conn.execute("SELECT COUNT(*) FROM ledger_twins WHERE history IN (SELECT value FROM "
                                    "json_each(?))", (json.dumps([int(h) for h in history_ids]),)).fetchone()
        return int(count)

    def budget(self) -> dict | None:
        """The per-record budget ``{"epsilon", "delta", "accountant"}``, or None."""
        with self._transaction("DEFERRED") as conn:
            return self._budget(conn)

    @staticmethod
    def _budget(conn) -> dict | None:
        row = conn.execute("SELECT epsilon, delta, accountant FROM ledger_budget "
                           "ORDER BY set_at DESC, rowid DESC LIMIT 1").fetchone()
        return None if row is None else {"epsilon": row[0], "delta": row[1], "accountant": row[2]}

    # ------------------------------------------------------------------------------------- writing
    def set_budget(self, epsilon: float, delta: float, accountant: str) -> None:
        """Set the per-record budget (the latest one set holds; earlier ones stay in the file)."""
        with self._transaction() as conn:
            conn.execute("INSERT INTO ledger_budget VALUES (?, ?, ?, ?)",
                         (time.time(), float(epsilon), float(delta), accountant))

    def reserve(self, keys, release: Release, check, named=None, pairs=None) -> int:
        """One ``BEGIN IMMEDIATE`` transaction: check the records' histories, then write the release.

        The release is written on ``keys`` (``ledger_records``) and on the twin keys of ``named``
        (``ledger_twins``, ``content_twins``); with ``pairs``, a key new to the ledger joins the history of
        its pair (``_joiners``).
        """
        identity = record_store.file_identity(self.path)
        twins = content_twins(named)[::-1] if named is not None else np.zeros([0], np.int64)
        if len(twins) > 1 and not np.all(twins[1:] > twins[:-1]):   # ``named`` ascending: ``twins`` are
            twins = np.unique(twins)
        twins_text = str(twins.tolist()) if len(twins) else None
        with self._transaction() as conn:
            text = self._check_naming(conn, identity, keys, named)
            counts = self._placed_counts(conn, identity, keys, twins)
            # Placed by this process's last reservation: each history holds just these records (its size is
            # their count, as ``_placed_counts`` read it).
            sizes = None if counts is None else dict(counts)
            joiners: dict = {}   # {history: (id keys, twin keys) new to the ledger that join it}
            if counts is None:
                counts, text = self._key_counts(conn, keys, text, twins, twins_text)
                if pairs is not None and len(counts) > 1 and counts.get(None):
                    joiners = self._joiners(conn, text, twins_text, pairs)
                    for history, (ids, twin_keys) in joiners.items():
                        joined = len(ids) + len(twin_keys)
                        counts[None] -= joined
                        counts[history] = counts.get(history, 0) + joined
                    if not counts.get(None, 1):
                        del counts[None]
            check(lambda: self._histories(conn, counts, composable_only=True), self._budget(conn),
                  lambda: self._neighborings(conn, counts))
            created = time.time()
            release_id = conn.execute(
                "INSERT INTO ledger_releases (kind, neighboring, phase_id, phase_ids, planned, spent, "
                "description, created, host, pid) VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
                (release.kind, release.neighboring, release.phase_id,
                 json.dumps([int(p) for p in release.phase_ids]), json.dumps(release.planned),
                 release.description, created, socket.gethostname(), os.getpid())).lastrowid
            if sizes is None:
                sizes = dict(conn.execute("SELECT history, records FROM ledger_histories WHERE history IN "
                                          "(SELECT value FROM json_each(?))",
                                          (json.dumps([h for h in counts if h is not None]),)))
            moves = []  # (old history or -1 for new records, new history) of the records that change rows
            placed = {}  # the histories the records are in afterwards: {history: records}
            new_of = {}  # old history -> the history its records of this release are in afterwards
            for old, count in counts.items():
                if old is not None and old not in joiners and sizes[old] == count:
                    # Every record of ``old`` moves: ``old``'s row becomes the new history (its chain moves
                    # to a new row, and the histories that pointed at it point there): no record row changes.
                    moved = conn.execute("INSERT INTO ledger_histories (parent, release, records) "
                                         "SELECT parent, release, 0 FROM ledger_histories WHERE history = ?",
                                         (old,)).lastrowid
                    conn.execute("UPDATE ledger_histories SET parent = ? WHERE parent = ?", (moved, old))
                    conn.execute("UPDATE ledger_histories SET parent = ?, release = ? WHERE history = ?",
                                 (moved, release_id, old))
                    placed[old], new_of[old] = count, old
                    continue
                new = conn.execute("INSERT INTO ledger_histories (parent, release, records) VALUES (?, ?, ?)",
                                   (old, release_id, count)).lastrowid
                placed[new], new_of[old] = count, new
                moves.append((-1 if old is None else old, new))
                if old is not None:   # the records that leave it (those joining it were in no history)
                    conn.execute("UPDATE ledger_histories SET records = records - ? WHERE history = ?",
                                 (count - sum(map(len, joiners.get(old, ((), ())))), old))
            for table, listed in (("ledger_records", text), ("ledger_twins", twins_text)):
                if listed is None or not moves:
                    continue
                if list(counts) == [None]:  # every record is new to the ledger
                    conn.execute(f"INSERT INTO {table} (record, history) SELECT value, ? FROM json_each(?)",
                                 (moves[0][1], listed))
                else:  # records new to the ledger, or leaving a history that keeps others: one statement
                    conn.execute(
                        f"INSERT INTO {table} (record, history) "
                        "SELECT j.value, json_extract(m.value, '$[1]') FROM json_each(?) j "
                        f"LEFT JOIN {table} r ON r.record = j.value "
                        "JOIN json_each(?) m ON json_extract(m.value, '$[0]') = COALESCE(r.history, -1) "
                        "WHERE true ON CONFLICT(record) DO UPDATE SET history = excluded.history",
                        (listed, json.dumps(moves)))
            for history, (ids, twin_keys) in joiners.items():   # new keys, in their pair's new history
                for table, joining in (("ledger_records", ids), ("ledger_twins", twin_keys)):
                    if len(joining):
                        conn.execute(f"INSERT INTO {table} (record, history) SELECT value, ? "
                                     "FROM json_each(?) WHERE true ON CONFLICT(record) "
                                     "DO UPDATE SET history = excluded.history",
                                     (new_of[history], str(joining.tolist())))
            if twins_text is not None:  # the version of the twin keys read by ``_check_naming``
                conn.execute("INSERT INTO ledger_meta VALUES ('twins_written', '1') ON CONFLICT(key) "
                             "DO UPDATE SET value = CAST(value AS INTEGER) + 1")
            _PLACED[identity] = ((np.array(keys, dtype=np.int64), twins), int(release_id), created, placed)
        if twins_text is not None:   # written: their content never gets a history of its own now
            _NAMED[identity] = named
        return int(release_id)

    @staticmethod
    def _joiners(conn, text: str, twins_text: str | None, pairs) -> dict:
        """{history: (id keys, twin keys)}: keys new to the ledger that join the history of their pair.

        ``pairs``: (id keys, content keys) of the release's rows, row by row. A row's id key and its twin
        key (``content_twins``) stand for one record: a new id key whose row's twin key has a history (the
        same rows named by other ids before) joins that history, so a later release naming the id without
        its rows composes the row's earlier releases; a new twin key whose ids all have one history (rows
        named by these ids without their rows before) joins it. ``text``, ``twins_text``: the release's
        distinct keys and twin keys as JSON arrays.
        """
        ids, content = (np.asarray(a, np.int64) for a in pairs)
        if not len(ids):
            return {}
        twin_rows = content_twins(content)

        def histories(table, listed, wanted):   # each of ``wanted``'s current history in ``table``, or -1
            if listed is None:
                return np.full(len(wanted), -1, np.int64)
            rows = np.array(conn.execute(f"SELECT r.record, r.history FROM json_each(?) j JOIN {table} r "
                                         "ON r.record = j.value", (listed,)).fetchall(), np.int64)
            rows = rows.reshape(-1, 2)
            rows = rows[np.argsort(rows[:, 0])]
            at = np.minimum(np.searchsorted(rows[:, 0], wanted), max(len(rows) - 1, 0))
            found = np.zeros(len(wanted), bool) if not len(rows) else rows[at, 0] == wanted
            return np.where(found, rows[at, 1] if len(rows) else -1, -1)

        of_ids = histories("ledger_records", text, ids)
        of_twins = histories("ledger_twins", twins_text, twin_rows)
        joiners: dict = {}
        new_ids = (of_ids < 0) & (of_twins >= 0)
        for history in np.unique(of_twins[new_ids]):
            joiners[int(history)] = (np.unique(ids[new_ids & (of_twins == history)]), np.zeros(0, np.int64))
        # A new twin key joins the history its ids share (all of them: equal rows of two people may differ).
        order = np.argsort(twin_rows, kind="stable")
        by_twin, id_history, twin_history = twin_rows[order], of_ids[order], of_twins[order]
        starts = np.flatnonzero(np.r_[True, by_twin[1:] != by_twin[:-1]])
        low, high = np.minimum.reduceat(id_history, starts), np.maximum.reduceat(id_history, starts)
        joining = (twin_history[starts] < 0) & (low >= 0) & (low == high)
        for history in np.unique(low[joining]):
            held = joiners.get(int(history), (np.zeros(0, np.int64), None))[0]
            joiners[int(history)] = (held, by_twin[starts][joining & (low == history)])
        return joiners

    def _check_naming(self, conn, identity: tuple, keys: np.ndarray, named: np.ndarray | None) -> str | None:
        """Refuse (``RecordNamingError``) records named by ids now and by content before, or the reverse.

        Returns ``keys`` as the JSON array a statement read (for the next one), or None if none did.

        Records named by ids with their rows' content (``named``) are refused where that content has a
        history of its own (``ledger_records``: named by content before). Records named by content are
        refused where their twin key (``content_twins``) has a history (``ledger_twins``: named by ids
        before), or where their content is in ``ledger_named`` (named by ids in a version-1 or version-2
        file, before twin keys were written). Content written with twin keys never gets a history of its own
        (refused here), so the content this process wrote needs no check again (``_NAMED``), and keys found
        clear stay clear until twin keys are written again (``ledger_meta``'s ``twins_written``).
        """
        if named is not None:   # named by ids
            if not len(named):
                return None   # their content is unknown here: nothing to check or keep
            held = _NAMED.get(identity)
            if held is not None and held.shape == named.shape and np.array_equal(held, named):
                return None
            (count,) = conn.execute("SELECT COUNT(*) FROM json_each(?) j JOIN ledger_records r "
                                    "ON r.record = j.value", (str(named.tolist()),)).fetchone()
            if count:
                raise RecordNamingError(
                    f"record_ids: {count} of these {len(keys)} records were named by their content (without "
                    f"record_ids) in earlier releases in {self.path}; named by ids now, each would get a "
                    "second history without the first one's spending. Name them as before (no record_ids), "
                    "or give every release on them the same record_ids from a new store file. Nothing was "
                    "run or written.")
            return None
        version = conn.execute("SELECT (SELECT value FROM ledger_meta WHERE key = 'twins_written'), "
                               "(SELECT MAX(rowid) FROM ledger_named)").fetchone()
        if version == (None, None):
            return None   # no records were ever named by ids with their content
        clear = _CLEAR_OF_NAMED.get(identity)
        keys = np.asarray(keys, np.int64)
        if clear is not None and clear[0] == version and clear[1].shape == keys.shape and \
                np.array_equal(clear[1], keys):
            return None
        text = str(keys.tolist())
        if version[1] is None:
            (count,) = conn.execute("SELECT COUNT(*) FROM json_each(?) j JOIN ledger_twins t "
                                    "ON t.record = ~j.value", (text,)).fetchone()
        else:   # and the content kept in a version-1 or version-2 file
            (count,) = conn.execute(
                "SELECT COUNT(*) FROM json_each(?) j WHERE EXISTS (SELECT 1 FROM ledger_twins t "
                "WHERE t.record = ~j.value) OR EXISTS (SELECT 1 FROM ledger_named n "
                "WHERE n.content = j.value)",
                (text,)).fetchone()
        if count:
            raise RecordNamingError(
                f"record_ids: {count} of these {len(keys)} records were named by record_ids in earlier "
                f"releases in {self.path}; named by their content now, each would get a second history "
                "without the first one's spending. Pass the same record_ids as before. Nothing was run or "
                "written.")
        _CLEAR_OF_NAMED[identity] = (version, keys)
        return text

    def commit(self, release_id: int, spent: dict, phase_id: int | None, phase_ids: Sequence[int]) -> None:
        """Write what the release spent (once; a second commit of the same release is refused).

        The commit does not wait for the disk (``synchronous=NORMAL``): one lost at a power cut leaves the
        release's planned event, which is larger.
        """
        with self._transaction(durable=False) as conn:
            done = conn.execute("UPDATE ledger_releases SET spent = ?, committed = ?, phase_id = ?, "
                                "phase_ids = ? WHERE release = ? AND spent IS NULL",
                                (json.dumps(spent), time.time(), phase_id,
                                 json.dumps([int(p) for p in phase_ids]), int(release_id))).rowcount
        if done != 1:
            raise ValueError(f"release_id: release {release_id} is not a reserved release of {self.path} "
                             "(unknown, or already committed)")


# ---------------------------------------------------------------------------------- the front
class Reservation:
    """A release written with its planned event; ``commit`` writes what it really spent."""

    def __init__(self, ledger: RecordLedger, release_id: int, records: int, phase_id: int | None):
        self.ledger = ledger
        self.release_id = release_id
        self.records = records
        self.phase_id = phase_id
        self.committed = False

    def commit(self, spent: dp_accounting.DpEvent, phase_ids: Sequence[int] | None = None) -> None:
        """Write what the release spent (less than planned when it stopped early).

        ``phase_ids``: the training phases ``spent`` covers, when they are not just the reserved phase (a
        restore during the run opened others): the release then composes in full with every other release.
        """
        single = phase_ids is None or list(phase_ids) == [self.phase_id]
        ids = [self.phase_id] if phase_ids is None and self.phase_id is not None else list(phase_ids or [])
        self.ledger.backend.commit(self.release_id, event_to_config(spent),
                                   self.phase_id if single else None, ids)
        self.committed = True


class RecordLedger:
    """The per-record ledger (see the module) over a ``LedgerBackend``.

    Args:
      backend: a ``LedgerBackend``, or a path (``SQLiteLedger`` of that file).
    """

    def __init__(self, backend):
        self.backend = backend if isinstance(backend, LedgerBackend) else SQLiteLedger(backend)

    @property
    def content_key_version(self) -> int:
        """Which content hash names this ledger's records (``tfdpbnn.record.records.content_keys``)."""
        return self.backend.content_key_version

    def set_budget(self, epsilon: float, delta: float, accountant: str = "rdp") -> None:
        """Set the per-record budget: no reservation may take any record's composed epsilon above it."""
        from tfdpbnn.privacy.registry import sound_accountants

        epsilon = check_positive("epsilon", epsilon)
        delta = check_open_unit("delta", delta)
        if accountant not in sound_accountants():
            raise ValueError(f"accountant must be one of the sound accountants {sound_accountants()}, got "
                             f"{accountant!r}")
        self.backend.set_budget(epsilon, delta, accountant)

    def budget(self) -> dict | None:
        """The per-record budget, or None."""
        return self.backend.budget()

    def reserve(self, keys, planned: dp_accounting.DpEvent, kind: str = "training",
                neighboring: str = "add_or_remove", phase_id: int | None = None,
                description: str = "", token: str | None = None, extra=(),
                sampler: tuple[str, str] | None = None) -> Reservation:
        """Write a release with its ``planned`` event against the records ``keys`` (one transaction).

        Raises ``BudgetExceededError`` (nothing written) when a budget is set and some record's composed
        epsilon with ``planned`` would exceed it, and ``ValueError`` when a record's history was accounted
        under the other neighboring relation. ``token``: ``new_release_token()``, written in the
        description, by which a model that carries the release finds the histories holding it
        (``bound_for``). ``extra``: ``(event, token)`` pairs of releases the run's model carries, composed
        in the budget check for every history that does not hold that token (as ``bound_for`` composes
        them), not written.

        ``sampler``: for a training release on batches drawn from a user's key
        (``poisson_batches(secret_seed=...)``), ``(key digest, stream)`` (``SamplingSpec.sampler``), written
        in the description. Raises ``ValueError`` naming ``secret_seed`` (nothing written) when a history of
        the records holds a training release from the same key and another stream: the two runs draw the
        same batches, so they are not independent, and composing them as independent would understate
        epsilon. The same stream (the same dataset object trained on again: fresh draws) is accepted.
        """
        check_choice("kind", kind, RELEASE_KINDS)
        check_choice("neighboring", neighboring, tuple(NEIGHBORING))
        if token is not None:
            if not isinstance(token, str) or not _TOKEN_DIGITS.fullmatch(token):
                raise ValueError(f"token: a release token is 32 lowercase hex digits (new_release_token()), "
                                 f"got {token!r}")
            description = f"{description} [release {token}]"
        if sampler is not None:
            tag = f"[sampler {sampler[0]} {sampler[1]}]" if isinstance(sampler, tuple | list) \
                and len(sampler) == 2 else ""
            if kind != "training" or not _SAMPLER_PATTERN.fullmatch(tag):
                raise ValueError(f"sampler: a training release's (key digest, stream), each 32 lowercase hex "
                                 f"digits; got {sampler!r} for a {kind!r} release")
            description = f"{description} {tag}"
        # Rows named by ids whose content is known: the release is written on their content too (under its
        # twin key), so the same rows named by other ids in another release share that history.
        pairs = None
        named: np.ndarray | None
        if isinstance(keys, TrainingKeys):   # read from the ledger: the twin keys the records were written on
            named = np.unique(content_twins(keys.twins))
        else:
            named = _named_content(keys)
            if named is not None and len(named):   # the rows' id and content keys, row by row
                pairs = (np.asarray(keys, np.int64), np.asarray(keys.content, np.int64))
        keys = _distinct(keys)
        records = len(keys)
        twins = 0 if named is None else len(named)
        phase_id = None if phase_id is None else int(phase_id)
        release = Release(0, kind, neighboring, event_to_config(planned), None, phase_id, description,
                          () if phase_id is None else (phase_id,))

        carried = [(t, Release(0, "preprocessing", neighboring, event_to_config(event), None, None,
                               f"carried by the run's model [release {t}]", ())) for event, t in extra]

        def check(read_histories, budget: dict | None, neighborings) -> None:
            if budget is None and sampler is None and neighborings() <= {neighboring}:
                return  # no budget to compose against, and every release on the records is of this relation
            histories = read_histories()
            if sampler is not None:
                _check_sampler(histories, (sampler[0], sampler[1]), records, twins)
            for history in histories:
                relations = history.relations if history.relations is not None else {
                    r.neighboring for r in history.releases}
                other = set(relations) - {neighboring}
                if other:
                    raise ValueError(
                        f"neighboring: {history.records} of these records have releases accounted under "
                        f"{sorted(other)}; a release under {neighboring!r} cannot be composed with them. "
                        "Keep one neighboring relation for every release on these records.")
            if budget is None:
                return
            worst, count = 0.0, 0
            for history in histories:
                tokens = {r.token for r in history.releases} - {None}
                more = [r for t, r in carried if t not in tokens]
                value = composed_epsilon(history.composed([release, *more]), budget["delta"],
                                         budget["accountant"], neighboring)
                if value > budget["epsilon"] * (1 + 1e-9):
                    count += history.records
                    worst = max(worst, value)
            if count:
                where = f"{count} of these {records} records" if not twins else (
                    f"{count} of the {records + twins} keys of these {records} records (each named by its id "
                    "and by its rows' content)")
                raise BudgetExceededError(
                    f"record budget: {where} would reach epsilon {worst:.4g} "
                    f"(delta {budget['delta']:g}, {budget['accountant']}) with this {kind} release, over "
                    f"their budget {budget['epsilon']:g} per record (releases recorded and reserved in "
                    f"{getattr(self.backend, 'path', self.backend)}). Nothing was run or written. Spend "
                    "less (fewer steps, more noise), leave those records out, or raise the budget with "
                    "RecordLedger.set_budget.")

        release_id = self.backend.reserve(keys, release, check, named=named, pairs=pairs)
        return Reservation(self, release_id, records, phase_id)

    def record(self, keys, spent: dp_accounting.DpEvent, kind: str, neighboring: str = "add_or_remove",
               description: str = "", phase_ids: Sequence[int] = (), token: str | None = None) -> int:
        """Write a release that already happened (reserve and commit at once); returns its id.

        ``phase_ids``: for a release that is not training, the training phases of the model it belongs to
        (a private temperature of that model): every later optimizer of weights from those phases finds it
        (``linked_releases``). ``token``: as ``reserve``'s.
        """
        if phase_ids and kind == "training":
            raise ValueError("phase_ids: only for releases that are not training (a training release names "
                             "its phases when committed)")
        reservation = self.reserve(keys, spent, kind=kind, neighboring=neighboring, description=description,
                                   token=token)
        reservation.commit(spent, phase_ids=[int(p) for p in phase_ids])
        return reservation.release_id

    def training_keys(self, phase_ids) -> np.ndarray:
        """The keys of every record that a training release covering one of ``phase_ids`` touched.

        Where some of them are twin keys (``content_twins``), ``TrainingKeys`` carrying them: a release
        reserved on them is written on those twin keys again.
        """
        wanted = {int(p) for p in phase_ids}
        ids = [h.history_id for h in self.histories() if any(
            r.kind == "training" and wanted.intersection(r.phase_ids) for r in h.releases)]
        if not ids:
            return np.zeros([0], np.int64)
        keys, twins = self.backend.keys(ids)
        if not len(twins):
            return keys
        held = keys.view(TrainingKeys)
        held.twins = twins
        return held

    def linked_releases(self, phase_ids) -> list[Release]:
        """The releases other than training that name one of the training ``phase_ids`` (``record``)."""
        wanted = {int(p) for p in phase_ids}
        return [r for r in self.backend.releases(exclude_kind="training")
                if r.kind != "training" and wanted.intersection(r.phase_ids)]

    def histories(self, keys=None, twins=None) -> list[History]:
        """The distinct histories of ``keys`` (every record's when None).

        ``twins``: twin keys (``content_twins``) whose histories are read too: the histories of rows that
        releases named by ids with their rows (a content key's twin), beside those of ``keys``.
        """
        if twins is None:
            return self.backend.histories(None if keys is None else np.unique(np.asarray(keys, np.int64)))
        return self.backend.histories(np.unique(np.asarray([] if keys is None else keys, np.int64)),
                                      twins=np.unique(np.asarray(twins, np.int64)))

    def record_epsilons(self, keys, delta: float, accountant: str = "rdp") -> list[tuple[int, float]]:
        """(record count, composed epsilon) per distinct history of ``keys``."""
        return [(h.records, composed_epsilon(h.composed(), delta, accountant, _neighboring(h)))
                for h in self.histories(keys)]

    def max_epsilon(self, keys, delta: float, accountant: str = "rdp", extra=()) -> float:
        """The largest composed epsilon over the records ``keys`` (each history with ``extra`` events).

        Each history's epsilon is the smaller of ``accountant``'s and RDP's (both upper bounds;
        ``tfdpbnn.record.ledger.largest_epsilon``, which runs the accountant only where it can matter).
        """
        from tfdpbnn.record.ledger import largest_epsilon

        _check_accountant(accountant)
        histories = self.histories(keys)
        worst = largest_epsilon([h.composed() + list(extra) for h in histories], delta, accountant,
                                lambda i: _neighboring(histories[i]))
        return 0.0 if worst is None else worst

    def overlap(self, keys, phase_ids) -> tuple[int, bool]:
        """How many of the records ``keys`` a release covering one of ``phase_ids`` touched.

        Returns (overlapping records, whether any release in the ledger covers one of ``phase_ids``): the
        second is False when the ledger cannot tell (those phases' records were never written to it).
        """
        wanted = {int(p) for p in phase_ids}
        known = any(r.kind == "training" and wanted.intersection(r.phase_ids)
                    for r in self.backend.releases())
        touched = sum(h.records for h in self.histories(keys)
                      if any(r.kind == "training" and wanted.intersection(r.phase_ids) for r in h.releases))
        return int(touched), known

    def bound_for(self, phases, delta: float, accountant: str = "rdp", extra=(),
                  exclude=()) -> tuple[float | None, int]:
        """The ledger bound of a model trained in ``phases`` (``tfdpbnn.record.ledger.Phase`` objects).

        The largest composed epsilon over every record that a release covering one of those phases touched:
        a training release, or a private search's scores on its validation records (``kind="search"``,
        linked to the selected model's phases). Each such history is composed with every phase of the model
        (the larger of its version and the ledger's, per phase: steps the ledger did not see, e.g. on
        unknown records, count too) and with ``extra`` (the model's other releases: DP preprocessing, private
        calibration), so the bound is never below the model's own epsilon. ``extra``: ``DpEvent`` objects,
        or ``(event, token)`` pairs for releases the ledger may hold too (``record(token=...)``): a history
        that holds the release with that token composes it once, from its own releases; every other history
        composes it as an extra (the release's records are not known to be others than that history's).
        ``exclude``: ids of reservations left out (an open custom loop's of this process, reserved for steps
        not taken yet: ``tfdpbnn.record.run_record.settle_open_loops``).
        Returns (bound, records); (None, 0) when no release covers any of the phases.
        """
        own = [Release(0, "training", p.neighboring, event_to_config(p.event()), None, int(p.phase_id), "",
                       (int(p.phase_id),)) for p in phases if p.released]
        wanted = {r.phase_id for r in own}
        histories = self.histories()
        if exclude:
            left_out = {int(i) for i in exclude}
            histories = [dataclasses.replace(h, releases=tuple(r for r in h.releases
                                                               if r.release_id not in left_out))
                         for h in histories]
        held = [h for h in histories if any(
            r.kind in ("training", "search") and wanted.intersection(r.phase_ids) for r in h.releases)]
        extra = [(e, None) if isinstance(e, dp_accounting.DpEvent) else (e[0], e[1]) for e in extra]
        from tfdpbnn.record.ledger import largest_epsilon

        def composed(history):
            tokens = {r.token for r in history.releases} - {None}
            return history.composed(own) + [e for e, token in extra if token is None or token not in tokens]

        _check_accountant(accountant)
        worst = largest_epsilon([composed(h) for h in held], delta, accountant,
                                lambda i: _neighboring(held[i]))
        records = sum(h.records for h in held)
        if held:  # the twin keys of rows named by ids (``content_twins``) are no records of their own
            records -= self.backend.twin_count([h.history_id for h in held])
        return worst, records


def _check_sampler(histories: Sequence[History], sampler: tuple[str, str], records: int, twins: int) -> None:
    """Refuse a training release from a user's key on records trained on from that key by another stream.

    ``histories``: the records' (the releases that compose; a phase's version holds the samplers of those
    it supersedes). A release committed as non-private is passed over: nothing composed with it understates.
    """
    digest, stream = sampler
    count = sum(h.records for h in histories if any(
        r.kind == "training" and not (r.committed and isinstance(r.event(), dp_accounting.NonPrivateDpEvent))
        and any(d == digest and s != stream for d, s in r.samplers) for r in h.releases))
    if not count:
        return
    where = f"{count} of these {records} records" if not twins else (
        f"{count} of the {records + twins} keys of these {records} records (each named by its id and by its "
        "rows' content)")
    raise ValueError(
        f"secret_seed: {where} were trained on by an earlier DP run whose batches came from "
        "tfdpbnn.data.poisson_batches with the same secret_seed, from another dataset object (or process). "
        "Every dataset made from one key draws the same batches, so the two runs would not be independent "
        "(a step of each on the same batch is one Poisson-sampled release of two noised sums, not two "
        "independent ones), and composing them as independent runs would understate epsilon. Nothing was "
        "run or written. Use a new secret key for a new run, or secret_seed=None (the sampler's own key, "
        "drawn from OS entropy for every dataset); to train on more batches of the earlier run, fit the "
        "dataset object it trained on (its next draws are fresh).")


def _neighboring(history: History) -> str:
    return history.releases[0].neighboring if history.releases else "add_or_remove"


def content_key_version() -> int:
    """The content-hash version naming the records of the default ledger (``default_ledger``).

    The current version when the record is off or the file does not exist yet (it will be made at the
    current version); read from the file (once per process and file) otherwise.
    """
    path = record_store.default_path()
    if path is None or not os.path.exists(path):
        return CONTENT_KEY_VERSION
    checked = _CHECKED.get(record_store.file_identity(path))
    return checked[1] if checked is not None else SQLiteLedger(path).content_key_version


def default_ledger() -> RecordLedger | None:
    """The ledger in the privacy record store's file (``tfdpbnn.record.store.default_path``); None if off."""
    path = record_store.default_path()
    return None if path is None else RecordLedger(path)


__all__ = ["CONTENT_KEY_VERSION", "READABLE_VERSIONS", "RELEASE_KINDS", "SCHEMA_VERSION",
           "BudgetExceededError", "History", "LedgerBackend", "RecordLedger", "RecordNamingError", "Release",
           "Reservation", "SQLiteLedger", "SchemaVersionError", "TrainingKeys", "composed_epsilon",
           "content_key_version", "default_ledger", "event_from_config", "event_to_config",
           "new_release_token"]
