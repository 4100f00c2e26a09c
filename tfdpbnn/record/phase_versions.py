"""The largest version of each training phase over a privacy record store's runs, read incrementally.

A phase is extended by every run that continues it (one ``fit`` after another with the same optimizer, or
a saved optimizer loaded elsewhere). Each run's own version of its phase is its last final snapshot's phase,
else its planned one (an upper bound while it runs, or for a run that was killed); the weights' record
counts each phase at the largest version any run reached (``RunStore.weights_record``: loading older
weights does not erase what was spent after them), and a data set's spending is the largest version of
each phase over the runs on it (``RunStore.dataset_phases``, checked against its budget at every run's
start). Reading every run of a phase or data set at each run's start costs time linear in the runs:
thousands of one-step fits in a loop would pay for all earlier ones at every fit.

The store's rows are only ever inserted, so this module keeps, per store file, the versions read so far
(``(rowid, own phase id, size)`` per run, by phase and by data set) and reads only what was added since:
runs after the last ``runs`` rowid read, and runs with a final snapshot after the last ``snapshots`` id
read. It does so only in a transaction that has written nothing yet, where every row it sees is committed
(a rolled-back insert may leave its rowid to another row: one seen only inside its own transaction is never
taken as read); elsewhere, and when the file is not the one read before (the run at the last rowid read is
another, or gone), every run of the phases or the data set is read again.
"""

from __future__ import annotations

import json

from tfdpbnn.record.ledger import Phase

#: Each run's own version of its phase: its last final snapshot's phase (unless "null"), else its planned one.
_OWN = ("COALESCE(NULLIF((SELECT s.phase FROM snapshots s WHERE s.run_id = r.run_id AND s.final = 1 "
        "ORDER BY s.snapshot DESC LIMIT 1), 'null'), r.planned_phase)")
#: Runs kept per store file at most (beyond, the file's entry is dropped and read again in full).
_MAX_RUNS = 200_000


class _Group:
    """The runs of one group (a phase, or a data set) read so far, and the largest version of each phase.

    ``runs``: run -> (rowid, own phase id, size). ``best``: own phase id -> the run holding its largest
    version (the earliest such run on equal sizes), or None when a run's version shrank or moved (a final
    snapshot below the plan): found again from ``runs`` when next asked.
    """

    def __init__(self):
        self.runs: dict[str, tuple] = {}
        self.best: dict[int, str] | None = {}

    def put(self, run_id: str, version: tuple) -> None:
        """Hold ``run_id``'s version ``(rowid, own phase id, size)`` (new, or its final snapshot's)."""
        before = self.runs.get(run_id)
        self.runs[run_id] = version
        if self.best is None:
            return
        if before is not None and self.best.get(before[1]) == run_id and (
                version[1] != before[1] or version[2] < before[2]):
            self.best = None  # the largest shrank or moved: found again when asked
            return
        held = self.best.get(version[1])
        if held is None or _better(version, self.runs[held]):
            self.best[version[1]] = run_id

    def largest(self, exclude_run: str | None) -> dict[int, str]:
        """Own phase id -> the run holding its largest version, ``exclude_run`` left out."""
        if self.best is None or exclude_run in self.best.values():
            best: dict[int, str] = {}
            for run_id, version in self.runs.items():
                if run_id != exclude_run and (version[1] not in best
                                              or _better(version, self.runs[best[version[1]]])):
                    best[version[1]] = run_id
            if exclude_run not in self.runs:  # the largest of all the runs: kept
                self.best = best
            return best
        return self.best


def _better(a: tuple, b: tuple) -> bool:
    """Whether version ``a`` (rowid, own id, size) beats ``b``: larger, or as large and an earlier run's."""
    return a[2] > b[2] or (a[2] == b[2] and a[0] < b[0])


class _Read:
    """What was read of one store file: the last rowid and snapshot id, the run there, each group's runs."""

    def __init__(self):
        self.runs = 0
        self.snapshots = 0
        self.last_run = None
        self.groups: dict[tuple, _Group] = {}  # ("phase_id", runs.phase_id) or ("dataset", runs.dataset)


#: Store file identity (``tfdpbnn.record.store.file_identity``) -> ``_Read``.
_READ: dict[tuple, _Read] = {}


def _versions(conn, where: str, args) -> list:
    """Each run ``where`` picks: its groups, run id, (rowid, own phase's id, size), own phase's JSON.

    Its groups: ``(("phase_id", runs.phase_id), ("dataset", runs.dataset))``. The size is (steps,
    participations, examples). In rowid order.
    """
    return [((("phase_id", phase_id), ("dataset", dataset)), run_id,
             (rowid, own_id, (steps, participations, examples)), text)
            for rowid, phase_id, dataset, run_id, own_id, steps, participations, examples, text
            in conn.execute(
                "SELECT id, phase_id, dataset, run_id, json_extract(own, '$.phase_id'), "
                "json_extract(own, '$.steps'), COALESCE(json_extract(own, '$.participations'), 0), "
                "json_extract(own, '$.examples'), own FROM (SELECT r.rowid AS id, r.phase_id AS phase_id, "
                f"r.dataset AS dataset, r.run_id AS run_id, {_OWN} AS own FROM runs r WHERE {where}) "
                "ORDER BY id", args)]


def _members(column: str) -> str:
    """The runs whose ``column`` ("phase_id" or "dataset") is one of a JSON array's values."""
    return f"r.{column} IN (SELECT value FROM json_each(?))"


#: The runs added after a rowid, and those with a final snapshot added after a snapshot id.
_ADDED = "r.rowid > ? OR r.run_id IN (SELECT run_id FROM snapshots WHERE snapshot > ? AND final = 1)"


def _read_now(conn, identity: tuple, column: str, values: list, texts: dict) -> list[_Group] | None:
    """The ``_Group`` of the runs of each of ``values`` of ``column``, from what was read and what is new.

    ``texts`` receives the own phase's JSON of each run read in this call. None when the file's entry
    cannot serve (too many runs): the caller reads in full.
    """
    read = _READ.get(identity)
    runs, snapshots, at_last, last = conn.execute(
        "SELECT (SELECT MAX(rowid) FROM runs), (SELECT MAX(snapshot) FROM snapshots), "
        "(SELECT run_id FROM runs WHERE rowid = ?), "
        "(SELECT run_id FROM runs WHERE rowid = (SELECT MAX(rowid) FROM runs))",
        (0 if read is None else read.runs,)).fetchone()
    if read is None or (read.last_run is not None and at_last != read.last_run):
        read = _READ[identity] = _Read()  # new, or not the file read before (replaced, or an old copy)
    runs, snapshots = runs or 0, snapshots or 0
    missing = [v for v in values if (column, v) not in read.groups]
    clauses: list[str] = []
    args: list[int | str] = []
    if read.groups and (runs > read.runs or snapshots > read.snapshots):
        clauses.append(_ADDED)
        args += [read.runs, read.snapshots]
    if missing:
        clauses.append(_members(column))
        args.append(json.dumps(missing))
        for v in missing:
            read.groups[(column, v)] = _Group()
    if clauses:
        for groups, run_id, version, text in _versions(conn, " OR ".join(f"({c})" for c in clauses),
                                                       tuple(args)):
            for group in groups:
                held = read.groups.get(group)
                if held is not None:
                    held.put(run_id, version)
                    texts[run_id] = text
    read.runs, read.snapshots, read.last_run = runs, snapshots, last
    if sum(len(held.runs) for held in read.groups.values()) > _MAX_RUNS:
        del _READ[identity]
        return None
    return [read.groups[(column, v)] for v in values]


def _largest(conn, identity: tuple, column: str, values: list, exclude_run: str | None,
             incremental: bool) -> list:
    """The largest version of each own phase over the runs of ``values`` of ``column``, as ``Phase``s."""
    texts: dict[str, str] = {}
    held = _read_now(conn, identity, column, values, texts) if incremental else None
    if held is None:
        whole = _Group()
        for _, run_id, version, text in _versions(conn, _members(column), (json.dumps(values),)):
            whole.put(run_id, version)
            texts[run_id] = text
        held = [whole]
    largest: dict[int, tuple] = {}  # own phase id -> (version, run)
    for group in held:
        for own_id, run_id in group.largest(exclude_run).items():
            version = group.runs[run_id]
            if own_id not in largest or _better(version, largest[own_id][0]):
                largest[own_id] = (version, run_id)
    winners = [run_id for _, run_id in largest.values()]
    unread = [run_id for run_id in winners if run_id not in texts]
    if unread:  # runs read in an earlier call: their own phase's JSON, in one statement
        texts.update(conn.execute(f"SELECT r.run_id, {_OWN} FROM runs r WHERE r.run_id IN "
                                  "(SELECT value FROM json_each(?))", (json.dumps(unread),)))
    return [Phase(**json.loads(texts[run_id])) for run_id in winners]


def largest_versions(conn, identity: tuple, phase_ids, exclude_run: str | None, incremental: bool) -> list:
    """The largest version of each phase the runs of ``phase_ids`` hold, as ``Phase`` objects.

    Largest by (steps, participations, examples) (``tfdpbnn.record.store._size``), the earliest run's on
    equal sizes; ``exclude_run``'s own version left out. ``identity``: the store file's
    (``file_identity``); ``incremental``: the caller's transaction has written nothing yet (see the
    module), so what was read before serves and only rows added since are read.
    """
    phase_ids = sorted({int(p) for p in phase_ids})
    if not phase_ids:
        return []
    return _largest(conn, identity, "phase_id", phase_ids, exclude_run, incremental)


def dataset_versions(conn, identity: tuple, dataset: str, incremental: bool) -> list:
    """The largest version of each phase over the runs on ``dataset`` (what the data set has spent).

    As ``largest_versions``, for the runs whose data set is ``dataset`` (a data set's budget is checked
    at every run's start: ``RunStore.dataset_phases``).
    """
    return _largest(conn, identity, "dataset", [dataset], None, incremental)


__all__ = ["dataset_versions", "largest_versions"]
