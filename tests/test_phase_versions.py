"""The weights' record reads each phase's runs once per process, then only the rows added since.

``tfdpbnn.record.phase_versions``: the largest version of each phase over the store's runs, read
incrementally, must equal what a full read of the same file gives, after every kind of write (a run begun,
an epoch's snapshot, a final snapshot smaller than planned, a second final snapshot, a run of another
process), in a transaction that has written rows (read in full), and for a file replaced at the same path.
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np

from tfdpbnn.record import phase_versions, store
from tfdpbnn.record.ledger import Phase, PrivacyLedger


def _phase(phase_id: int, steps: int) -> Phase:
    return Phase("participations", 1.0, "add_or_remove", steps=steps, participations=steps,
                 examples=8 * steps, num_examples=64, phase_id=phase_id)


def _read_in_full(work):
    """``work()`` with every run of the phases or data set read (nothing kept, nothing used)."""
    held, original = dict(phase_versions._READ), phase_versions._read_now
    phase_versions._read_now = lambda *args: None  # the whole read, as outside a clean transaction
    try:
        return work()
    finally:
        phase_versions._read_now = original
        phase_versions._READ.clear()
        phase_versions._READ.update(held)


def _fresh(run_store, weights, exclude_run=None):
    """The weights' record from a read of every run of its phases."""
    return _read_in_full(lambda: run_store.weights_record(weights, exclude_run=exclude_run))


def _fresh_dataset(run_store, dataset):
    """What a data set has spent, from a read of every run on it."""
    return _read_in_full(lambda: run_store.dataset_phases(dataset))


def _close_connections():
    """Close this process's kept connections: each file's write-ahead log goes into it (as at exit)."""
    for connection, _ in store._KEPT.values():
        connection.close()
    store._KEPT.clear()


def _key(phases):
    return sorted((p.phase_id, p.steps, p.participations, p.examples) for p in phases)


def test_incremental_reads_equal_full_reads_after_every_kind_of_write(tmp_path):
    """Random runs over three phases and two data sets: after each write, the weights' record and each
    data set's spending read incrementally equal a full read's."""
    rng = np.random.default_rng(0)
    run_store = store.RunStore(str(tmp_path / "record.sqlite"))
    phases = [101, 202, 303]
    steps = {p: 0 for p in phases}
    open_runs: list[tuple[str, int]] = []
    weights = "weights:v3:start"
    run_store.snapshot(run_store.begin_run("data:d", weights, _phase(101, 1)), weights, _phase(101, 1),
                       PrivacyLedger([_phase(p, 1) for p in phases]), final=True)
    checked = 0
    for step in range(60):
        action = rng.integers(0, 4)
        if action == 0 or not open_runs:  # a run begins (planned: more steps than it may take)
            p = int(rng.choice(phases))
            planned = steps[p] + int(rng.integers(1, 5))
            dataset = ("data:a", "data:b")[int(rng.integers(2))]
            open_runs.append((run_store.begin_run(dataset, weights, _phase(p, planned)), p))
        elif action == 1:  # an epoch's snapshot of an open run
            run_id, p = open_runs[int(rng.integers(len(open_runs)))]
            steps[p] += 1
            run_store.snapshot(run_id, f"weights:v3:{step}", _phase(p, steps[p]), PrivacyLedger([]))
        elif action == 2:  # a run ends, maybe below its plan; sometimes a second final snapshot follows
            run_id, p = open_runs.pop(int(rng.integers(len(open_runs))))
            steps[p] += int(rng.integers(0, 2))
            own = p if rng.random() < 0.85 else p + 1  # a restore may leave the run in another phase
            run_store.snapshot(run_id, weights, _phase(own, steps[p]), PrivacyLedger([_phase(p, steps[p])]),
                               final=True)
            if rng.random() < 0.3:
                run_store.snapshot(run_id, weights, _phase(p, steps[p] + 1), PrivacyLedger([]), final=True)
        else:  # a run begins and ends at once (a one-step fit)
            p = int(rng.choice(phases))
            steps[p] += 1
            run_id = run_store.begin_run("data:a", weights, _phase(p, steps[p]))
            run_store.snapshot(run_id, weights, _phase(p, steps[p]), PrivacyLedger([]), final=True)
        for dataset in ("data:a", "data:b"):  # what each data set has spent (its budget's check)
            assert _key(run_store.dataset_phases(dataset)) == _key(_fresh_dataset(run_store, dataset)), step
        # The weights' record, as a run start reads it (one open run excluded, sometimes)
        runs = [r["run_id"] for r in run_store.runs()]
        exclude = runs[int(rng.integers(len(runs)))] if rng.random() < 0.5 else None
        got = run_store.weights_record(weights, exclude_run=exclude)
        assert _key(got) == _key(_fresh(run_store, weights, exclude)), step
        checked += len(got)
    assert checked >= 150  # three phases at each of the 60 reads
    assert _key(run_store.weights_record(weights)) == _key(_fresh(run_store, weights))


def test_a_run_start_reads_only_the_rows_added_since(tmp_path, monkeypatch):
    """After the first read of a phase, a read finds the rows added since: one new run, not all of them."""
    run_store = store.RunStore(str(tmp_path / "record.sqlite"))
    weights = "weights:v3:w"
    for k in range(1, 41):  # 40 one-step runs of one phase, each ending with the same weights
        run_id = run_store.begin_run("data:d", weights, _phase(7, k))
        run_store.snapshot(run_id, weights, _phase(7, k), PrivacyLedger([_phase(7, k)]), final=True)
    read = []
    original = phase_versions._versions

    def counted(conn, where, args):
        rows = original(conn, where, args)
        read.append(len(rows))
        return rows

    monkeypatch.setattr(phase_versions, "_versions", counted)
    assert _key(run_store.weights_record(weights)) == [(7, 40, 40, 320)]
    assert read == [40]  # the phase's runs, read once
    run_id = run_store.begin_run("data:d", weights, _phase(7, 45))
    assert _key(run_store.weights_record(weights, exclude_run=run_id)) == [(7, 40, 40, 320)]
    assert _key(run_store.weights_record(weights)) == [(7, 45, 45, 360)]  # its plan while it runs
    run_store.snapshot(run_id, weights, _phase(7, 41), PrivacyLedger([_phase(7, 41)]), final=True)
    assert _key(run_store.weights_record(weights)) == [(7, 41, 41, 328)]  # what it took, once it ended
    assert read == [40, 1, 1]  # the new run; the run whose final snapshot is new (no new row in between)


def test_a_transaction_that_wrote_reads_in_full_and_a_replaced_file_is_read_again(tmp_path):
    """Rows a transaction wrote are read, never remembered; a file copied over the path is read anew."""
    path = str(tmp_path / "record.sqlite")
    run_store = store.RunStore(path)
    weights = "weights:v3:w"
    first = run_store.begin_run("data:d", weights, _phase(9, 3))
    run_store.snapshot(first, weights, _phase(9, 3), PrivacyLedger([_phase(9, 3)]), final=True)
    _close_connections()
    shutil.copy(path, str(tmp_path / "copy.sqlite"))  # the file with one run
    assert _key(run_store.weights_record(weights)) == [(9, 3, 3, 24)]
    try:
        with store.transaction(path):
            run_store.begin_run("data:d", weights, _phase(9, 50))  # written, then rolled back
            assert _key(run_store.weights_record(weights)) == [(9, 50, 50, 400)]  # seen, read in full
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert _key(run_store.weights_record(weights)) == [(9, 3, 3, 24)]
    second = run_store.begin_run("data:d", weights, _phase(9, 5))  # may take the rolled-back rowid
    run_store.snapshot(second, weights, _phase(9, 5), PrivacyLedger([]), final=True)
    assert _key(run_store.weights_record(weights)) == [(9, 5, 5, 40)]
    # The one-run copy put back at the path (the same file system entry, other contents): read anew.
    _close_connections()
    with open(str(tmp_path / "copy.sqlite"), "rb") as source, open(path, "r+b") as target:
        target.write(source.read())
        target.truncate()
    assert _key(run_store.weights_record(weights)) == _key(_fresh(run_store, weights))


def test_equal_sizes_settle_on_the_first_run_as_a_full_read_does(tmp_path):
    """Two runs with equal sizes and different descriptions: the earlier run's version, either way."""
    run_store = store.RunStore(str(tmp_path / "record.sqlite"))
    weights = "weights:v3:w"
    for sampling in ("first", "second"):
        phase = dataclasses.replace(_phase(11, 4), sampling=sampling)
        run_id = run_store.begin_run("data:d", weights, phase)
        run_store.snapshot(run_id, weights, phase, PrivacyLedger([phase]), final=True)
    assert [p.sampling for p in run_store.weights_record(weights)] == ["first"]
    assert [p.sampling for p in _fresh(run_store, weights)] == ["first"]


def _largest(path, phase_ids, incremental):
    with store.transaction(path) as conn:
        return [(p.phase_id, p.steps, p.sampling) for p in phase_versions.largest_versions(
            conn, store.file_identity(path), phase_ids, None, incremental=incremental)]


def test_a_runs_final_version_that_ties_or_moves_is_held_as_a_full_read_holds_it(tmp_path):
    """After the phase was read: an earlier run's final version as large as the largest wins the tie, and
    a run whose final snapshot is in another phase (a restore) leaves its first phase's largest to others."""
    path = str(tmp_path / "record.sqlite")
    run_store = store.RunStore(path)
    weights = "weights:v3:w"
    first = run_store.begin_run("data:d", weights, dataclasses.replace(_phase(13, 2), sampling="first"))
    second = run_store.begin_run("data:d", weights, dataclasses.replace(_phase(13, 4), sampling="second"))
    assert _largest(path, [13], True) == [(13, 4, "second")]  # the phase read
    run_store.snapshot(first, weights, dataclasses.replace(_phase(13, 4), sampling="first"),
                       PrivacyLedger([]), final=True)
    assert _largest(path, [13], True) == _largest(path, [13], False) == [(13, 4, "first")]  # earlier
    third = run_store.begin_run("data:d", weights, _phase(13, 6))
    assert _largest(path, [13], True) == [(13, 6, "")]  # its plan is the largest
    run_store.snapshot(third, weights, _phase(14, 9), PrivacyLedger([]), final=True)  # ended in phase 14
    expected = [(13, 4, "first"), (14, 9, "")]
    assert sorted(_largest(path, [13], True)) == sorted(_largest(path, [13], False)) == expected
    run_store.snapshot(second, weights, _phase(13, 3), PrivacyLedger([]), final=True)  # below its plan
    assert sorted(_largest(path, [13], True)) == sorted(_largest(path, [13], False)) == expected
