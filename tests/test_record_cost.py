"""What the record costs is bounded by its shape, not measured by a clock.

The per-record ledger's reserve and commit run a fixed number of SQL statements whatever the number of
records (the records travel in bulk statements); the content keys of ``fit``'s arrays are reused only for
the very same bytes (an array changed in place gets new keys); fingerprints skip hashing only bytes equal
to those hashed last; one DP ``fit`` runs a fixed set of transactions, the same for more records and one
more snapshot per epoch; the write check's key reuses the weights' fingerprint; the fast variable reads equal
``numpy()`` and a block that reads the ledger once sees every write the ledger makes.
"""

from __future__ import annotations

import dataclasses
import re

import dp_accounting
import numpy as np
from _small_runs import DELTA, LOSS, small_data, small_model
from test_weights_identity import reference_identity

import tfdpbnn
from tfdpbnn.record import record_ledger, records, store


def _compiled_small(n=16, seed=0):
    """``small_data(n, seed)`` and a new small model compiled with DP-SGD (noise 1, batch 8) for them."""
    x, y = small_data(n, seed=seed)
    model = small_model()
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=n, batch_size=8, delta=DELTA,
                                                   allow_exceeding_budget=True), loss=LOSS)
    return x, y, model


def _statements(path, work) -> list[str]:
    """The SQL statements ``work()`` runs on the kept connection to ``path``."""
    conn = store.kept_connection(path, 60.0)
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        work()
    finally:
        conn.set_trace_callback(None)
    return seen


def test_reserve_and_commit_run_as_many_statements_for_ten_thousand_records_as_for_ten(tmp_path):
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 3)
    counts = {}
    for records_count in (10, 10_000):
        path = str(tmp_path / f"ledger_{records_count}.sqlite")
        ledger = record_ledger.RecordLedger(path)
        keys = np.arange(records_count, dtype=np.int64) * 7919 - 5000
        # New records; the same records again (this process placed them last: their rows are not read);
        # the same records again as another process sees them (their rows read in one statement).
        for phase_id, travels in ((1, 2), (2, 0), (3, 1)):
            if phase_id == 3:
                record_ledger._PLACED.clear()

            def run(ledger=ledger, keys=keys, phase_id=phase_id):
                ledger.reserve(keys, event, phase_id=phase_id).commit(event)
            statements = _statements(path, run)
            counts[(records_count, phase_id)] = len(statements)
            # The keys travel as one JSON array: read once, and written once for records new to the ledger.
            # Records that all move together keep their rows: the history's row becomes the new history.
            # (The key as an element of a JSON array: its digits may also occur inside a bound timestamp.)
            element = re.compile(r"[\[,]\s*" + str(int(keys[-1])) + r"\s*[\],]")
            assert sum(bool(element.search(s)) for s in statements) == travels
            assert any("INSERT INTO ledger_records" in s for s in statements) == (phase_id == 1)
        (history,) = ledger.histories(keys)
        assert history.records == records_count and len(history.releases) == 3
    for phase_id in (1, 2, 3):
        assert counts[(10, phase_id)] == counts[(10_000, phase_id)]
    assert max(counts.values()) < 40


def test_records_placed_by_this_process_are_read_again_once_another_release_moved_some(tmp_path):
    """The placement this process remembers is used only while no other release moved any of its records."""
    from tfdpbnn.record import store as record_store

    path = str(tmp_path / "ledger.sqlite")
    ledger = record_ledger.RecordLedger(path)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 2)
    keys = np.arange(50, dtype=np.int64)
    ledger.record(keys, event, kind="other")
    remembered = dict(record_ledger._PLACED)
    for moved in (keys[:7], keys):  # another process's release on some, then on all, of these records
        ledger.record(moved, event, kind="other")
        record_ledger._PLACED.clear()
        record_ledger._PLACED.update(remembered)  # as if that release was written by another process
        statements = _statements(path, lambda: ledger.record(keys, event, kind="other"))
        assert sum("json_each" in s and "ledger_records" in s for s in statements) == 1  # read again
        remembered = dict(record_ledger._PLACED)
    by_size = sorted((h.records, len(h.releases)) for h in ledger.histories(keys))
    assert by_size == [(7, 5), (43, 4)]  # 1 + 2 + 2 releases on the first 7, 1 + 1 + 2 on the others
    # A reservation rolled back with its transaction is not remembered as placing anything.
    with np.testing.assert_raises(RuntimeError), record_store.transaction(path):
        ledger.record(keys, event, kind="other")
        raise RuntimeError("rolled back")
    ledger.record(keys, event, kind="other")
    assert sorted((h.records, len(h.releases)) for h in ledger.histories(keys)) == [(7, 6), (43, 5)]


def test_committed_releases_are_decoded_once_and_a_commit_is_seen(tmp_path, monkeypatch):
    """A history's chain grows with every fit on its records; its committed releases are not decoded again."""
    path = str(tmp_path / "ledger.sqlite")
    ledger = record_ledger.RecordLedger(path)
    keys = np.arange(20, dtype=np.int64)
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0 + i), 2) for i in range(6)]
    for event in events[:5]:
        ledger.record(keys, event, kind="other")
    reservation = ledger.reserve(keys, events[5], kind="other")  # reserved: its spent event may still come
    ledger.histories(keys)  # decodes the committed releases once
    decoded = []
    original = record_ledger.json.loads
    monkeypatch.setattr(record_ledger.json, "loads", lambda text: decoded.append(text) or original(text))
    (history,) = ledger.histories(keys)
    assert [r.committed for r in history.releases] == [True] * 5 + [False]
    assert len(decoded) == 2  # the reserved release's planned event and phase ids: the others were kept
    reservation.commit(events[4])  # spent less than planned
    (history,) = ledger.histories(keys)
    assert history.releases[-1].committed and history.releases[-1].event() == events[4]
    assert [r.event() for r in history.releases[:5]] == events[:5]
    truth = record_ledger.composed_epsilon(events[:5] + [events[4]], 1e-5, "rdp", "add_or_remove")
    assert abs(ledger.max_epsilon(keys, 1e-5) - truth) <= 1e-9 * truth


def test_histories_stay_right_when_whole_histories_move_in_place(tmp_path):
    """Whole moves (a history's row reused) mixed with partial ones: each record keeps its own releases."""
    ledger = record_ledger.RecordLedger(str(tmp_path / "ledger.sqlite"))
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0 + i), 1 + i)
              for i in range(5)]
    a, b, c = np.arange(0, 40), np.arange(40, 100), np.arange(100, 130)
    plan = [np.concatenate([a, b]), a, b, np.concatenate([b, c]), np.concatenate([a, b, c])]
    expected = {int(k): [] for k in np.concatenate([a, b, c])}
    ids = []
    for event, keys in zip(events, plan, strict=True):
        release = ledger.record(keys, event, kind="other")
        ids.append(release)
        for k in keys:
            expected[int(k)].append(release)
        # Every record's history is exactly the releases written against it, in order, after each write.
        for group in (a, b, c):
            for history in ledger.histories(group):
                held = [r.release_id for r in history.releases]
                members = [k for k in group if expected[int(k)] == held]
                assert len(members) == history.records, (held, history.records)
    assert sum(h.records for h in ledger.histories()) == 130
    # The composed epsilon of a record equals that of its own releases composed (dp-accounting directly).
    (history_a,) = ledger.histories(a)
    truth = record_ledger.composed_epsilon([events[0], events[1], events[4]], 1e-5, "rdp", "add_or_remove")
    assert abs(ledger.max_epsilon(a, 1e-5) - truth) <= 1e-9 * truth
    assert [r.release_id for r in history_a.releases] == [ids[0], ids[1], ids[4]]


def test_a_reservations_check_composes_the_same_as_every_release_of_the_history(tmp_path):
    """The check reads each history's composable releases folded along its chain (kept per committed chain):
    the same composition and relations as its full list of releases, after every reservation, with phase
    versions growing and shrinking, releases without a phase, a planned release not committed yet and
    partial moves of records between histories."""
    ledger = record_ledger.RecordLedger(str(tmp_path / "ledger.sqlite"))
    backend = ledger.backend
    rng = np.random.default_rng(11)
    groups = [np.arange(0, 30), np.arange(30, 50), np.arange(50, 80)]
    pending, spent = None, None
    for step in range(40):
        keys = np.concatenate([groups[i] for i in sorted(rng.choice(3, size=rng.integers(1, 4),
                                                                    replace=False))])
        phase = int(rng.integers(1, 4)) if rng.random() < 0.8 else None
        sigma, count = float(rng.uniform(0.8, 3.0)), int(rng.integers(3, 8))
        event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count)
        reservation = ledger.reserve(keys, event, kind="training", phase_id=phase)
        if pending is not None:
            pending.commit(spent)
        # The newest stays planned until the next one, then commits less than it planned (an early stop).
        pending = reservation
        spent = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count - 2)
        with backend._transaction("DEFERRED") as conn:
            counts, _ = backend._key_counts(conn, np.unique(np.concatenate(groups)))
            full = {h.history_id: h for h in backend._histories(conn, counts)}
            folded = backend._histories(conn, counts, composable_only=True)
        for history in folded:
            whole = full[history.history_id]
            assert history.records == whole.records
            assert history.relations == {r.neighboring for r in whole.releases}
            truth = record_ledger.composed_epsilon(whole.composed(), DELTA, "rdp", "add_or_remove")
            got = record_ledger.composed_epsilon(history.composed(), DELTA, "rdp", "add_or_remove")
            assert abs(got - truth) <= 1e-9 * max(truth, 1.0), (step, history.history_id)
            assert len(history.releases) <= len(whole.releases)
    assert record_ledger._COMPOSABLE   # committed chains were kept


def test_content_keys_are_reused_for_the_same_bytes_only():
    x, y = small_data(32)
    fingerprint = store.data_fingerprint(x, y)
    first = records.input_keys(x, y, fingerprint=fingerprint)
    assert np.array_equal(first, records.content_keys(x, y))
    assert records.input_keys(x.copy(), y.copy(), fingerprint=store.data_fingerprint(x, y)) is first
    x[5, 2] += 1.0  # changed in place: same object, new bytes
    changed = records.input_keys(x, y, fingerprint=store.data_fingerprint(x, y))
    assert np.array_equal(changed, records.content_keys(x, y))
    assert changed[5] != first[5] and np.array_equal(np.delete(changed, 5), np.delete(first, 5))
    # The same bytes under other names: computed again (the same features, so the same records).
    named = records.input_keys({"a": x}, y, fingerprint=store.data_fingerprint({"a": x}, y))
    assert named is not changed and np.array_equal(named, changed)
    # The keys of the ledger's content-hash version: a version-1 file's are not the version-2 keys reused.
    assert np.array_equal(records.content_keys(x, y, version=2), changed)
    # A fingerprint that does not belong to the arrays is the caller's bug; without one, nothing is reused.
    assert records.input_keys(x, y) is not changed


def test_a_row_changed_in_place_between_fits_is_a_new_record_in_the_ledger():
    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    before = records.content_keys(x, y)
    x[3] = 0.5  # the same array object, edited in place
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = records.content_keys(x, y)
    ledger = record_ledger.default_ledger()
    by_key = {h.records: len(h.releases) for h in ledger.histories(after)}
    assert by_key == {1: 1, 15: 2}  # the edited row: only the second fit; the others: both
    (old_row,) = ledger.histories(before[3:4])
    assert len(old_row.releases) == 1  # the row as it was: only the first fit


def test_one_dp_fit_runs_a_fixed_set_of_transactions_on_the_record_file():
    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # tables made, model checked
    path = store.default_path()
    statements = _statements(path, lambda: model.fit(x, y, batch_size=8, epochs=2, verbose=0))
    begins = [s for s in statements if s.startswith("BEGIN")]
    # Write transactions: the run's start (the weights' record and linked releases read under the write
    # lock, the ledger's layout version, the budgets, the reservation, the run's row); the first epoch's
    # snapshot; the final snapshot with the ledger commit (the last epoch's snapshot: no callback but
    # tfdpbnn's can see the weights in between). No read transaction of its own.
    assert begins == ["BEGIN IMMEDIATE"] * 3, statements
    assert statements.count("COMMIT") == len(begins)
    snapshots = [s for s in statements if s.startswith("INSERT INTO snapshots")]
    assert [", 1, 'weights:" in s for s in snapshots] == [False, True]  # the epoch's, then the final one


def test_a_fits_statements_grow_by_one_snapshot_per_epoch_and_not_with_the_records():
    """Statements per DP ``fit``: the same for 16 and 64 records; 4 more (one snapshot) per added epoch.

    A snapshot is its row and its variables' keys (one statement each), in one transaction.
    """
    counts = {}
    for n, epochs in ((16, 1), (64, 1), (16, 3), (64, 3)):
        x, y, model = _compiled_small(n, seed=n)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the records placed, the model checked
        counts[(n, epochs)] = len(_statements(
            store.default_path(), lambda: model.fit(x, y, batch_size=8, epochs=epochs, verbose=0)))  # noqa: B023
    assert counts[(16, 1)] == counts[(64, 1)], counts
    assert counts[(16, 3)] == counts[(64, 3)] == counts[(16, 1)] + 2 * 4, counts


def test_the_last_epochs_snapshot_is_the_final_one_only_when_no_other_callback_runs():
    """The final snapshot holds the last epoch's weights and ledger: the store knows the weights after fit.

    With a callback of the user's (it could save the weights at the epoch's end), every epoch end writes
    its own snapshot before that callback runs.
    """
    import tensorflow as tf

    from tfdpbnn.record import attributes

    x, y, model = _compiled_small()
    run = attributes.run_record(model.optimizer)
    for callbacks, expected in (([], [1]), ([tf.keras.callbacks.Callback()], [0, 1])):
        fingerprints = []

        class Seen(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                fingerprints.append(store.weights_fingerprint(self.model))  # noqa: B023

        statements = _statements(store.default_path(), lambda: model.fit(  # noqa: B023
            x, y, batch_size=8, epochs=1, verbose=0, callbacks=callbacks))  # noqa: B023
        snapshots = [s for s in statements if s.startswith("INSERT INTO snapshots")]
        assert [int(", 1, 'weights:" in s) for s in snapshots] == expected, statements
        assert run.recognises_weights()
        ledger = store.default_store().weights_ledger(store.weights_fingerprint(model))
        assert ledger is not None and sum(p.steps for p in ledger) == model.optimizer.ledger.steps
    # A user's callback that reads the weights at the epoch's end finds them in the store then.
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[Seen()])
    assert len(fingerprints) == 2
    assert all(store.default_store().weights_ledger(f) is not None for f in fingerprints)


def test_the_write_checks_key_reuses_the_weights_fingerprint_and_every_bit_counts():
    """The end-of-fit write check: exact (a sign of zero, one ulp); its key is the weights' identity.

    At an epoch's end the key of the last DP write's copies is the identity the privacy record uses for
    the same bytes (a model whose weights are all trainable), and a write after the epoch's end, before
    the end of ``fit``, is still refused: its bytes are not the epoch end's.
    """
    import pytest
    import tensorflow as tf

    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    watch = model.optimizer._dp_write_watch
    key = watch.last_written_state()
    assert "weights:" + key == store.weights_fingerprint(model) == reference_identity(model.get_weights())
    assert watch.state() == key and watch.changed_since_write(model.optimizer.iterations) == []
    bias = model.weights[1]
    for value in (np.float32(-0.0), np.nextafter(np.float32(0), np.float32(1))):  # bias starts at +0.0
        saved = bias.numpy()
        bias.assign(np.where(np.arange(3) == 1, value, saved).astype(np.float32))
        if not np.array_equal(saved.view(np.int32), bias.numpy().view(np.int32)):
            assert watch.changed_since_write(model.optimizer.iterations) == [bias.name]
            assert watch.state() != key
        bias.assign(saved)
    assert watch.changed_since_write(model.optimizer.iterations) == []

    class WriteAfterEpochEnd(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # after tfdpbnn's epoch-end snapshot and key
            kernel = self.model.weights[0]
            kernel.assign(tf.reverse(kernel, axis=[0]))  # the same values, rows swapped

    with pytest.raises(ValueError, match="changed after the last DP step of fit"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[WriteAfterEpochEnd()])


def test_the_restore_check_runs_only_when_another_callback_could_have_restored(monkeypatch):
    """No callback but tfdpbnn's: two weight fingerprints per one-epoch fit (start, end); else four.

    With another callback: the start, the restore check, the epoch end's snapshot and the final one.
    """
    import tensorflow as tf

    from tfdpbnn.record import run_record

    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    calls = []
    original = run_record.record_store.weights_identity
    monkeypatch.setattr(run_record.record_store, "weights_identity",
                        lambda m: calls.append(1) or original(m))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert len(calls) == 2
    calls.clear()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[tf.keras.callbacks.Callback()])
    assert len(calls) == 4


def test_fingerprints_skip_hashing_only_bytes_equal_to_those_hashed_last(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    y = rng.integers(0, 3, 300)
    hashed = []
    original = store._hash_arrays
    monkeypatch.setattr(store, "_hash_arrays", lambda arrays: hashed.append(1) or original(arrays))
    expected = "data:" + original([x, y])
    # Hashed the first time, then checked by its quick digests.
    assert [store.data_fingerprint(x, y) for _ in range(4)] == [expected] * 4
    assert len(hashed) == 1
    for edit in ((299, 4), (0, 0), (150, 2)):  # a byte changed anywhere: hashed again, a new fingerprint
        x[edit] = np.nextafter(x[edit], np.float32(np.inf))
        changed = store.data_fingerprint(x, y)
        assert changed == "data:" + original([x, y]) != expected
        expected = changed
    assert store.data_fingerprint(x.astype(np.float64), y) == "data:" + original([x.astype(np.float64), y])
    assert store.data_fingerprint(x.reshape(150, 10), y) == "data:" + original([x.reshape(150, 10), y])
    # Weights: a weight changed in place by one ulp is hashed again.
    identified = []
    identify = store._identity_and_keys
    monkeypatch.setattr(store, "_identity_and_keys", lambda *a: identified.append(1) or identify(*a))
    monkeypatch.setattr(store, "_HELD_WEIGHTS", {})  # none held from other tests' equal weights
    model = small_model()
    first = store.weights_fingerprint(model)
    assert store.weights_fingerprint(model) == first and len(identified) == 1
    kernel = model.weights[0]
    kernel.assign(kernel + np.float32(1e-3) * np.eye(*kernel.shape, dtype=np.float32))
    assert store.weights_fingerprint(model) == reference_identity(model.get_weights()) != first
    assert len(identified) == 2
    # Nothing of the data is held but its digests.
    z = rng.normal(size=(50, 2)).astype(np.float32)
    for _ in range(3):
        store.data_fingerprint(z)
    quick, digest = store._HELD["data"]
    assert digest == original([z])
    assert all(not isinstance(part, np.ndarray) for entry in quick for part in entry)


def test_large_arrays_are_compared_in_two_halves_and_every_byte_counts():
    import multiprocessing

    size = store._SPLIT_BYTES // 4 + 3  # float32 values: past the split size, an odd number of values
    a = np.random.default_rng(4).normal(size=size).astype(np.float32)
    assert a.nbytes >= store._SPLIT_BYTES
    assert store.same_bytes(a, a.copy())
    half = a.nbytes // 2
    for byte in (0, half - 1, half, half + 1, a.nbytes - 1):  # each half's ends, both halves' first byte
        b = a.copy()
        b.view(np.uint8)[byte] ^= 1
        assert not store.same_bytes(a, b) and not store.same_bytes(b, a), byte
    negative, zero = a.copy(), a.copy()
    negative[-1], zero[-1] = np.float32(-0.0), np.float32(0.0)
    assert not store.same_bytes(negative, zero)  # -0.0 is not 0.0 (in the second half)
    assert not store.same_bytes(a, a.reshape(-1, 1)) and not store.same_bytes(a, a.view(np.int32))
    # A forked child compares with a worker of its own (the parent's thread does not cross the fork).
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply(_compare_in_child, (a,)) == (True, False)


def test_the_quick_digest_of_the_data_counts_every_bit_dtype_and_shape():
    a = np.random.default_rng(5).normal(size=(1000, 7)).astype(np.float32)
    first = store._quick_digests([a])
    assert store._quick_digests([a.copy()]) == first
    for byte in (0, 1, a.nbytes // 2, a.nbytes - 1):
        b = a.copy()
        b.view(np.uint8).reshape(-1)[byte] ^= 1
        assert store._quick_digests([b]) != first, byte
    negative, zero = a.copy(), a.copy()
    negative[-1, -1], zero[-1, -1] = np.float32(-0.0), np.float32(0.0)
    assert store._quick_digests([negative]) != store._quick_digests([zero])
    assert store._quick_digests([a.reshape(-1)]) != first
    assert store._quick_digests([a.view(np.int32)]) != first
    # Rows swapped, or moved from one array to the next, are other bytes of each array.
    assert store._quick_digests([a[::-1].copy()]) != first
    assert store._quick_digests([a[:500], a[500:]]) != store._quick_digests([a[:499], a[499:]])


def test_data_digests_started_before_the_checks_serve_only_the_arrays_they_read():
    import tensorflow as tf

    x, y = small_data(40)
    started = store.DataDigests(x, y)
    assert started.of([x, y]) == store._quick_digests([x, y])
    assert started.of([x.copy(), y]) is None and started.of([x]) is None  # other arrays: digested again
    fingerprint = store.input_fingerprint(x, y, started)
    assert fingerprint == "data:" + store._hash_arrays([x, y]) == store.data_fingerprint(x, y)
    # A pipeline carries its tag; arrays in a list are not held: nothing is started for them.
    assert store.DataDigests(tf.data.Dataset.from_tensor_slices((x, y))).of([x, y]) is None
    assert store.DataDigests(x.tolist(), y).of([x.tolist(), y]) is None
    # Started on arrays later edited in place: the digests are of the bytes read, so the fingerprint that
    # reuses them is the SHA-256 of those bytes, never another array's.
    edited = store.DataDigests(x, y)
    quick = edited.of([x, y])
    x[0, 0] += 1.0
    assert quick != store._quick_digests([x, y])
    assert store.data_fingerprint(x, y) == "data:" + store._hash_arrays([x, y]) != fingerprint


def test_a_runs_reservation_is_on_the_disk_before_a_callback_can_save_what_it_trained(monkeypatch):
    import os

    import pytest
    import tensorflow as tf

    synced, seen = [], []
    sync = store._sync_log
    monkeypatch.setattr(store, "_sync_log", lambda path: sync(path) or synced.append(path))

    class Saver(tf.keras.callbacks.Callback):  # where a ModelCheckpoint would save the weights
        def on_train_batch_end(self, batch, logs=None):
            seen.append((len(store._SYNCING), list(synced)))

    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Saver()])
    path = os.path.abspath(store.default_path())
    assert os.path.exists(path + "-wal")  # the write-ahead log _sync_log waits for
    # The run's start committed its reservation and waited for the disk beside the first step: done before
    # the first batch's end reached any other callback, and before fit returned.
    assert [pending for pending, _ in seen] == [0, 0] and seen[0][1] == [path]
    assert store._SYNCING == [] and synced == [path]
    # A wait for the disk that fails fails the fit, at the first batch's end.
    monkeypatch.setattr(store, "_sync_log", lambda path: (_ for _ in ()).throw(OSError("the disk is gone")))
    seen.clear()
    with pytest.raises(OSError, match="the disk is gone"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[Saver()])
    assert seen == [] and store._SYNCING == []


def _compare_in_child(a):
    b = a.copy()
    equal = store.same_bytes(a, b)
    b[-1] += 1.0
    return equal, store.same_bytes(a, b)


def test_the_model_walk_finds_every_module_tf_module_finds_in_its_order():
    import tensorflow as tf

    from tfdpbnn import _private_api

    layers = tf.keras.layers

    class Wrapped(tf.keras.Model):  # layers in lists, dicts, a plain tf.Module and a shared layer
        def __init__(self):
            super().__init__()
            self.first = layers.Dense(3)
            self.blocks = [layers.Dense(2), {"norm": layers.Normalization(), "again": self.first}, (1, None)]
            self.holder = tf.Module()
            self.holder.inner = [layers.Dense(4)]

        def call(self, x):
            return self.first(x)

    wrapped = Wrapped()
    wrapped(tf.zeros((1, 5)))
    inputs = tf.keras.Input((5,))
    functional = tf.keras.Model(inputs, layers.Dense(2)(layers.Normalization()(inputs)))
    functional.extra = layers.Dense(7)
    recurrent = tf.keras.Sequential([tf.keras.Input((3, 4)), layers.TimeDistributed(layers.Dense(2)),
                                     layers.Bidirectional(layers.LSTM(2)), layers.Dense(1)])
    nested = tf.keras.Sequential([tf.keras.Input((5,)), functional, layers.Dense(1)])
    for model in (wrapped, functional, recurrent, nested, small_model()):
        if not isinstance(model, tf.Module):  # Keras 3: its own layer walk
            continue
        expected = tf.Module.submodules.fget(model)
        assert [id(m) for m in _private_api.submodules(model)] == [id(m) for m in expected]
        assert len(expected) >= 2


def test_fast_variable_reads_equal_numpy_and_reads_once_forget_every_write():
    import tensorflow as tf

    from tfdpbnn import _private_api
    from tfdpbnn.record import attributes

    table = tf.Variable(np.arange(12, dtype=np.float64).reshape(3, 4) / 7)
    fast = _private_api.read_numpy(table)
    np.testing.assert_allclose(fast, table.numpy(), rtol=1e-15, atol=0)  # the same op reads it
    fast[0, 0] = -1.0  # a copy of its own, as numpy() gives
    np.testing.assert_allclose(table.numpy()[0, 0], 0.0, atol=1e-12)

    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=64, batch_size=8,
                                       delta=DELTA)
    state = attributes.ledger_state(optimizer)
    with state.reading_once():
        assert state.open_description() is None  # read, and kept, inside the block
        state.open_phase(kind="participations", noise_multiplier=1.0, neighboring="add_or_remove",
                         sample_rate=None, num_examples=64, source="train_on_batch", batch_size=8)
        described = state.open_description()  # the write forgot the kept read
        assert described is not None and described["num_examples"] == 64
    optimizer.iterations.assign_add(3)  # three steps, outside any block
    with state.reading_once():
        assert state.open_steps() == 3
        assert state.closed_phases() == []  # kept: the table and its count
        state.close_open_phase()  # appends the phase: both written
        assert state.open_description() is None
        assert [p.steps for p in state.closed_phases()] == [3]

    # The ledger's variables, the step counter and the DP settings are read together at a block's first
    # read: each value as read_numpy gives it (a scalar as a numpy scalar), kept until read_anew or a write.
    variables = [state.table, state.count, state.open_desc, state.open_start, optimizer.iterations,
                 optimizer._dp_noise_multiplier, optimizer._dp_batch_size]
    with state.reading_once():
        for v in variables:
            got, want = state.read(v), _private_api.read_numpy(v)
            assert type(got) is type(want) and np.shape(got) == np.shape(want)
            np.testing.assert_array_equal(got, want)
        optimizer.iterations.assign_add(2)  # code outside the record (a model's own, run by the checks)
        assert int(state.read(optimizer.iterations)) == 3  # kept: read once per block
        state.read_anew()
        assert int(state.read(optimizer.iterations)) == 5
        assert float(state.read(optimizer._dp_batch_size)) == 8.0


def test_rdp_to_epsilon_on_arrays_equals_dp_accounting():
    """The ledger's RDP-to-epsilon conversion is dp-accounting's ``compute_epsilon``, case by case."""
    import pytest
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    from tfdpbnn.privacy._rdp_conversion import rdp_epsilon

    orders = np.asarray(DEFAULT_RDP_ORDERS, dtype=np.float64)
    rng = np.random.default_rng(7)
    curves = []
    for sigma, q, steps in ((0.6, 0.01, 1000), (1.0, 0.04, 23), (5.0, 1.0, 3), (50.0, 0.001, 10)):
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
        curves.append((orders, dp_accounting.rdp.RdpAccountant().compose(event).rdp))
    curves.append((orders, np.full(orders.shape, 1e-12)))  # the KL case: epsilon 0
    curves.append((orders, np.where(orders > 40, np.inf, 0.3 * orders)))  # infinite at high orders
    odd = np.asarray([1.0, 1.005, 1.01, 1.5, 2.0, 64.0])  # orders at and near 1
    curves.append((odd, rng.uniform(0, 3, odd.size)))
    curves.append((orders, np.full(orders.shape, np.inf)))
    for delta in (1e-10, 1e-5, 0.01, 0.5):
        for o, r in curves:
            want = dp_accounting.rdp.compute_epsilon(o, r, delta)[0]
            got = rdp_epsilon(o, r, delta)
            if np.isinf(want):
                assert np.isinf(got)
            else:
                assert abs(got - want) <= 1e-12 * max(1.0, abs(want)), (delta, got, want)
    assert np.isinf(rdp_epsilon(orders, curves[0][1], 0.0))  # delta 0: dp-accounting's answer, infinite
    # Inputs dp-accounting refuses or treats apart (its versions differ on a negative divergence) go to it.
    negative = -np.ones(orders.shape)
    try:
        want = dp_accounting.rdp.compute_epsilon(orders, negative, 1e-5)[0]
    except ValueError:
        with pytest.raises(ValueError):
            rdp_epsilon(orders, negative, 1e-5)
    else:
        assert abs(rdp_epsilon(orders, negative, 1e-5) - want) <= 1e-12


def test_the_end_of_fit_comparison_is_skipped_only_when_nothing_could_have_written(monkeypatch):
    """Skipped: no callback but tfdpbnn's, and the final snapshot fingerprinted the epoch end's DP write.

    Run: with a callback of the user's (it could write in ``on_train_end``); for a model with a
    non-trainable weight (the final fingerprint covers more than the write check's key).
    """
    import tensorflow as tf

    from tfdpbnn.optimizers import state_checks

    compared = []
    original = state_checks.WriteWatch.changed_since_write
    monkeypatch.setattr(state_checks.WriteWatch, "changed_since_write",
                        lambda self, it: compared.append(1) or original(self, it))
    x, y = small_data(16)
    plain = small_model()
    frozen = tf.keras.Sequential([tf.keras.Input((x.shape[1],)), tf.keras.layers.Dense(4),
                                  tf.keras.layers.Dense(3)])
    frozen.layers[0].trainable = False  # its weights: the model's, not the write check's
    # Each count has one more call: the check at the run's start (weights written since the optimizer's last
    # run); a new optimizer's watch holds no write yet, so that call compares nothing. The second fit of
    # ``plain`` has one more: its new optimizer imports the first one's training, and with it whatever was
    # written since that one's last run (``_inherit_unguaranteed``, once per imported optimizer).
    for model, callbacks, expected in ((plain, [], 1), (plain, [tf.keras.callbacks.Callback()], 3),
                                       (frozen, [], 2)):
        model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=16, batch_size=8,
                                                       delta=DELTA, allow_exceeding_budget=True), loss=LOSS)
        compared.clear()
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
        assert len(compared) == expected, (model.name, callbacks)


def test_held_weights_are_not_aliased_by_in_graph_updates():
    """The arrays held for the digests (read from variables) keep their bytes when a DP step writes.

    A held array sharing the variable's buffer would follow the step's in-place update and make the next
    comparison find "the same bytes" with a stale digest; each key equals the identity of a fresh copy.
    """
    x, y, model = _compiled_small()
    watch = model.optimizer._dp_write_watch
    keys, fingerprints = [], []
    for _ in range(3):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        copies = [np.array(c.numpy(), copy=True) for c in watch._copies]
        keys.append(watch.last_written_state())
        assert "weights:" + keys[-1] == reference_identity(copies)
        fingerprints.append(store.weights_fingerprint(model))
        assert fingerprints[-1] == reference_identity([w.copy() for w in model.get_weights()])
    assert len(set(keys)) == len(set(fingerprints)) == 3


def _phases_cases():
    """Ledgers of one and several phases (Poisson, passes, full batch; two noise levels), both relations."""
    from tfdpbnn.record.ledger import Phase

    poisson = dict(kind="poisson", noise_multiplier=1.1, neighboring="add_or_remove", steps=900,
                   sample_rate=0.01)
    passes = dict(kind="participations", noise_multiplier=3.0, neighboring="add_or_remove", steps=70,
                  participations=7)
    full = dict(kind="gaussian", noise_multiplier=20.0, neighboring="add_or_remove", steps=1)
    return [[Phase(**poisson)],
            [Phase(**poisson), Phase(**passes), Phase(**full)],
            [Phase(**poisson), Phase(**{**poisson, "noise_multiplier": 2.0, "steps": 50}), Phase(**poisson)],
            [Phase(**{**passes, "neighboring": "replace_one"}),
             Phase(**{**full, "neighboring": "replace_one"})]]


def _independent_rdp(ledger, delta):
    """dp-accounting's ``RdpAccountant`` on the ledger's event, composed from scratch."""
    relation = {"add_or_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
                "replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE}[ledger.neighboring]
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation).compose(ledger.event()).get_epsilon(
        delta)


def test_the_cached_rdp_epsilon_equals_dp_accounting_and_sees_every_change_of_its_key():
    """The RDP epsilon is cached by (leaf events with counts, delta, relation); each lookup is exact.

    Equal to dp-accounting's ``RdpAccountant`` on the same event (relative 1e-9) for one- and many-phase
    ledgers, on a miss and on a hit; one more step, another delta, noise level or relation is a new key
    whose epsilon is computed again (and differs).
    """
    import pytest

    from tfdpbnn.record import ledger as ledger_module
    from tfdpbnn.record.ledger import Phase, PrivacyLedger

    cache = ledger_module._rdp_epsilon_of_leaves
    for phases in _phases_cases():
        ledger = PrivacyLedger(phases)
        for delta in (1e-5, 1e-7):
            expected = _independent_rdp(ledger, delta)
            hits = cache.cache_info().hits
            first = ledger.epsilon(delta, "rdp")
            again = PrivacyLedger(list(phases)).epsilon(delta, "rdp")  # the same phases: a hit
            assert cache.cache_info().hits == hits + 1
            assert first == pytest.approx(expected, rel=1e-9) and again == first
    base = _phases_cases()[1]
    before = PrivacyLedger(base).epsilon(1e-5, "rdp")
    changed = {
        "one more step": [dataclasses.replace(base[0], steps=901)] + base[1:],
        "one more pass": base[:1] + [dataclasses.replace(base[1], participations=8)] + base[2:],
        "another noise level": base[:2] + [dataclasses.replace(base[2], noise_multiplier=19.0)],
        "another sample rate": [dataclasses.replace(base[0], sample_rate=0.011)] + base[1:],
        "a phase more": base + [Phase(kind="gaussian", noise_multiplier=20.0, neighboring="add_or_remove",
                                      steps=1)],
        "the replace-one relation": [dataclasses.replace(base[2], neighboring="replace_one", steps=3)],
    }
    for what, phases in changed.items():
        ledger = PrivacyLedger(phases)
        misses = cache.cache_info().misses
        value = ledger.epsilon(1e-5, "rdp")
        assert cache.cache_info().misses == misses + 1, what
        assert value == pytest.approx(_independent_rdp(ledger, 1e-5), rel=1e-9), what
        assert abs(value - before) > 1e-6, what
    misses = cache.cache_info().misses
    assert PrivacyLedger(base).epsilon(2e-5, "rdp") < before  # another delta: a miss, a smaller epsilon
    assert cache.cache_info().misses == misses + 1


def test_other_accountants_keep_their_own_composition():
    """PLD and zCDP epsilons of a many-phase ledger are their accountants' own on its event, not RDP's."""
    import pytest

    from tfdpbnn.privacy.registry import get_accountant
    from tfdpbnn.record.ledger import PrivacyLedger

    ledger = PrivacyLedger(_phases_cases()[2])
    rdp = ledger.epsilon(1e-5, "rdp")
    for accountant in ("pld", "zcdp"):
        expected = get_accountant(accountant).compose(ledger.event()).get_epsilon(1e-5)
        value = ledger.epsilon(1e-5, accountant)
        # the same events composed in another order: PLD's discretized convolutions round apart (~1e-9)
        assert value == pytest.approx(expected, rel=1e-6), accountant
    assert abs(ledger.epsilon(1e-5, "pld") - rdp) > 1e-2 * rdp  # PLD is not RDP's answer


def test_the_epoch_end_epsilon_is_dp_accountings_over_several_fits():
    """The epsilon logged at each epoch end of a second fit (two phases) is dp-accounting's RDP epsilon."""
    import pytest

    x, y = small_data(32)
    model = small_model()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.1, num_examples=32, batch_size=8, delta=DELTA,
                                       allow_exceeding_budget=True)
    model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 2.0, num_examples=32, batch_size=8, delta=DELTA,
                                       allow_exceeding_budget=True)  # takes the first one's phase over
    model.compile(optimizer=optimizer, loss=LOSS)
    logged = model.fit(x, y, batch_size=8, epochs=2, verbose=0).history["epsilon"]
    assert [p.noise_multiplier for p in optimizer.ledger.phases] == [1.1, 2.0]
    expected = _independent_rdp(optimizer.ledger, DELTA)
    assert logged[-1] == pytest.approx(expected, rel=1e-6)  # logs are float32-rounded by Keras
    assert logged[0] < logged[-1]


def test_the_ledger_layout_is_checked_at_every_open_in_one_statement(tmp_path):
    """A ledger file this process checked is checked again at each open: one statement, and a changed
    version is refused; a file whose version table is gone gets the whole check again."""
    import pytest

    path = str(tmp_path / "ledger.sqlite")
    record_ledger.RecordLedger(path)  # tables made
    statements = _statements(path, lambda: record_ledger.RecordLedger(path))
    assert [s for s in statements if "ledger_meta" in s or "sqlite_master" in s] == [
        "SELECT value FROM ledger_meta WHERE key = 'schema_version'"], statements
    with store.transaction(path) as conn:
        conn.execute("UPDATE ledger_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(record_ledger.SchemaVersionError, match="schema version 99"):
        record_ledger.RecordLedger(path)
    with store.transaction(path) as conn:
        conn.execute("DROP TABLE ledger_meta")
    with pytest.raises(record_ledger.SchemaVersionError, match="no schema version"):
        record_ledger.RecordLedger(path)


def test_a_fits_start_opens_the_ledger_once():
    """One DP fit's start reads the ledger's layout version once (it was read twice)."""
    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    statements = _statements(store.default_path(), lambda: model.fit(x, y, batch_size=8, epochs=1, verbose=0))
    assert sum("schema_version" in s for s in statements) == 1, statements
    assert not any("sqlite_master" in s for s in statements), statements


def test_assign_now_writes_what_assign_writes():
    """``assign_now`` is ``assign`` (plain eager variables by one op, anything else through ``assign``)."""
    import pytest
    import tensorflow as tf

    from tfdpbnn import _private_api

    key = tf.Variable(np.zeros(2, np.int64), trainable=False)
    _private_api.assign_now(key, np.array([3, -4], np.int64))
    assert key.numpy().tolist() == [3, -4]
    flag = tf.Variable(True, trainable=False)
    _private_api.assign_now(flag, np.bool_(False))
    assert not bool(flag.numpy())
    flags = tf.Variable(np.ones(3, np.float32))
    _private_api.assign_now(flags, np.zeros(3, np.float32))
    assert flags.numpy().tolist() == [0.0, 0.0, 0.0]
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):  # a wrong shape: assign's own error
        _private_api.assign_now(flags, np.zeros(4, np.float32))
    assert flags.numpy().tolist() == [0.0, 0.0, 0.0]


def test_batched_reads_equal_reads_of_each_variable_in_order(monkeypatch):
    """``read_tensors_and_views``: one ``_ReadVariablesOp`` of variables of several dtypes and shapes reads
    what a read of each does, in order (a variable in copy-on-read mode after a sparse update and a
    distributed one among them); so does its fallback, one read each; the views are read-only."""
    import pytest
    import tensorflow as tf

    from tfdpbnn import _private_api

    sparse = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2))
    sparse.scatter_update(tf.IndexedSlices(tf.constant([[7.0, 8.0]]), tf.constant([1])))  # copy-on-read now
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = tf.Variable(np.array([1.5, -2.5], np.float32))
    variables = [tf.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)), sparse,
                 tf.Variable(np.array([0.1, -0.0, np.inf])), mirrored, tf.Variable(np.int64(-3)),
                 tf.Variable(np.array([True, False]))]
    expected = [v.numpy() for v in variables]
    for batched in (True, False):
        monkeypatch.setattr(_private_api, "_batched_reads", [batched])
        reads = _private_api.read_tensors_and_views(variables)
        assert _private_api._batched_reads == [batched]  # the batched operation ran without failing
        assert len(reads) == len(variables)
        for (tensor, view), want in zip(reads, expected, strict=True):
            assert view.dtype == want.dtype and view.shape == want.shape
            assert view.tobytes() == want.tobytes()  # every bit (-0.0 too)
            assert np.asarray(tensor).tobytes() == want.tobytes()
        with pytest.raises(ValueError):
            reads[0][1][0, 0] = 5.0  # read-only


def test_the_releases_other_than_training_are_read_by_index_in_order(tmp_path):
    """A fit's start reads the releases that are not training (``linked_releases``) through the kind index,
    so the training releases (one per fit) are not visited; the same releases as a full read, oldest first.
    A file made before the index gets it when a process first opens it."""
    path = str(tmp_path / "ledger.sqlite")
    ledger = record_ledger.RecordLedger(path)
    event = dp_accounting.GaussianDpEvent(1.0)
    kinds = ["training", "calibration", "training", "other", "training", "search", "training"]
    for i, kind in enumerate(kinds):
        ledger.record(np.arange(4) + i, event, kind=kind, phase_ids=[] if kind == "training" else [7])
    everything = ledger.backend.releases()
    statements = _statements(path, lambda: ledger.backend.releases(exclude_kind="training"))
    found = ledger.backend.releases(exclude_kind="training")
    assert [r.release_id for r in found] == [r.release_id for r in everything if r.kind != "training"]
    assert [r.kind for r in found] == ["calibration", "other", "search"]
    assert [r.kind for r in ledger.linked_releases([7])] == ["calibration", "other", "search"]
    selects = [s for s in statements if s.startswith("SELECT")]
    assert len(selects) == 1, statements
    select = selects[0]
    conn = store.kept_connection(path, 60.0)
    plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + select))
    assert "USING INDEX ledger_releases_kind" in plan and "SCAN" not in plan, plan
    with store.transaction(path) as conn:
        conn.execute("DROP INDEX ledger_releases_kind")
    record_ledger._CHECKED.clear()  # what a process that has not opened the file knows
    record_ledger.RecordLedger(path)
    names = [r[0] for r in store.kept_connection(path, 60.0).execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'")]
    assert "ledger_releases_kind" in names


def test_a_fits_statements_do_not_grow_with_earlier_fits():
    """The same statements (count and text, ids aside) in the 3rd and the 6th fit of one model.

    (The 2nd is the first to read the runs of the phase the 1st opened; later fits read only the rows added
    since: ``tfdpbnn.record.phase_versions``.)
    """
    import re

    x, y, model = _compiled_small()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = store.default_path()
    seen = []
    for _ in range(5):
        seen.append(_statements(path, lambda: model.fit(x, y, batch_size=8, epochs=1, verbose=0)))

    def shape(statements):  # the statements without their values
        return [re.sub(r"'[^']*'|\b\d+(\.\d+)?\b", "?", s) for s in statements]

    assert shape(seen[1]) == shape(seen[-1]), (seen[1], seen[-1])


def test_a_fits_start_accepts_an_epoch_ends_weights_by_the_identity_the_record_uses(monkeypatch):
    """The write check at a fit's start and the record's run start share one weights' identity.

    Weights that are an epoch end's (the last one, or an earlier one set back) are accepted by that identity,
    without comparing them with the last write's copies again; the identity the record's run start uses is
    the one computed afresh at that moment; weights written between fits to other values are still refused.
    """
    import pytest
    import tensorflow as tf

    from tfdpbnn.optimizers import state_checks
    from tfdpbnn.record import run_record

    x, y, model = _compiled_small()
    kept = []

    class KeepFirstEpoch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # reads only
            if epoch == 0:
                kept.append(self.model.get_weights())

    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[KeepFirstEpoch()])
    compared, used = [], []
    original_changed = state_checks.WriteWatch.changed_since_write
    monkeypatch.setattr(state_checks.WriteWatch, "changed_since_write",
                        lambda self, it: compared.append(1) or original_changed(self, it))
    original_begin = run_record.RunRecord._begin

    def begin(self, model, dataset, planned_steps, record_keys, identity=None, *rest):
        used.append((identity[1:], store.weights_identity(model)))
        return original_begin(self, model, dataset, planned_steps, record_keys, identity, *rest)

    monkeypatch.setattr(run_record.RunRecord, "_begin", begin)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # the last epoch end's weights
    model.set_weights(kept[0])  # an earlier epoch end's: post-processing
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert compared == []
    assert len(used) == 2 and all(given == fresh for given, fresh in used)
    assert used[1][1][0] != used[0][1][0]  # set back: other weights
    model.weights[0].assign(model.weights[0] * 1.5)
    with pytest.raises(ValueError, match="changed after the last DP write"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert compared == [1]


def test_the_conversion_terms_are_cached_by_relation_and_delta_and_convert_as_dp_accounting():
    """The RDP-to-epsilon conversion from cached terms is dp-accounting's ``compute_epsilon``.

    The terms of the orders and delta are cached by (relation, delta): another delta is a new entry whose
    epsilon differs, and each value equals dp-accounting's (relative 1e-12), the curves ``rdp_epsilon``
    hands to dp-accounting included (a NaN: it raises or answers as dp-accounting does).
    """
    import pytest

    from tfdpbnn.privacy._rdp_conversion import rdp_epsilon, rdp_epsilon_with
    from tfdpbnn.record import ledger as ledger_module

    orders = ledger_module._rdp_orders("add_or_remove")
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.04, dp_accounting.GaussianDpEvent(1.0)), 23)
    curve = dp_accounting.rdp.RdpAccountant().compose(event).rdp
    values = {}
    for delta in (1e-5, 1e-9, 0.2, 1e-5):
        terms = ledger_module._rdp_terms("add_or_remove", delta)
        assert ledger_module._rdp_terms("add_or_remove", delta) is terms  # cached
        values[delta] = rdp_epsilon_with(terms, orders, curve, delta)
        expected = dp_accounting.rdp.compute_epsilon(orders, curve, delta)[0]
        assert values[delta] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert values[1e-9] > values[1e-5] > values[0.2] >= 0.0  # each delta its own terms
    terms = ledger_module._rdp_terms
    assert terms("add_or_remove", 1e-5) is not terms("replace_one", 1e-5)  # each relation its own
    terms = ledger_module._rdp_terms("add_or_remove", 1e-5)
    for special in (np.zeros_like(curve), np.full(curve.shape, 1e-12), np.full(curve.shape, np.inf),
                    3.0 * curve):
        assert rdp_epsilon_with(terms, orders, special, 1e-5) == pytest.approx(
            dp_accounting.rdp.compute_epsilon(orders, special, 1e-5)[0], rel=1e-12, abs=1e-15)
    bad = curve.copy()
    bad[3] = np.nan
    try:
        expected = rdp_epsilon(orders, bad, 1e-5)
    except ValueError:
        with pytest.raises(ValueError):
            rdp_epsilon_with(terms, orders, bad, 1e-5)
    else:
        assert rdp_epsilon_with(terms, orders, bad, 1e-5) == pytest.approx(expected, rel=1e-12)


def test_the_distinct_keys_of_a_reservation_are_reused_only_for_equal_keys():
    """``_distinct`` is ``np.unique`` of the keys, reused only when every key equals the last call's."""
    rng = np.random.default_rng(3)
    keys = rng.integers(-2 ** 62, 2 ** 62, 500)
    keys[:40] = keys[40:80]  # repeated records
    first = record_ledger._distinct(keys)
    np.testing.assert_array_equal(first, np.unique(keys))
    assert not first.flags.writeable
    assert record_ledger._distinct(keys.copy()) is first  # equal keys, another array: reused
    changed = keys.copy()
    changed[7] += 1  # one key of the same shape changed
    again = record_ledger._distinct(changed)
    assert again is not first
    np.testing.assert_array_equal(again, np.unique(changed))
    keys[0] += 1  # the caller's array changed in place after it was made distinct
    np.testing.assert_array_equal(record_ledger._distinct(keys), np.unique(keys))
    shorter = record_ledger._distinct(keys[:-1])
    np.testing.assert_array_equal(shorter, np.unique(keys[:-1]))


def test_kept_reads_serve_only_the_next_resumed_block_and_every_write_drops_them():
    """``reading_once(keep=True)`` leaves its reads to a ``resume=True`` block; writes, blocks drop them."""
    from tfdpbnn.record import attributes

    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=64, batch_size=8,
                                       delta=DELTA)
    state = attributes.ledger_state(optimizer)
    state.open_phase(kind="participations", noise_multiplier=1.0, neighboring="add_or_remove",
                     sample_rate=None, num_examples=64, source="train_on_batch", batch_size=8)

    def kept_then(between, resume=True):
        with state.reading_once(keep=True):
            before = state.open_steps()
        between()
        with state.reading_once(resume=resume):
            return before, state.open_steps()

    def step():
        optimizer.iterations.assign_add(2)  # what a step does, not through the ledger's object

    before, after = kept_then(step)
    assert after == before  # resumed: the kept read (the caller vouched that nothing ran)

    def another_block():
        with state.reading_once():
            pass

    for drop in (state.drop_kept, lambda: state.extend_open_phase(1, 8.0), another_block):
        before, after = kept_then(lambda d=drop: (step(), d()))
        assert after > before  # dropped: read anew
    before, after = kept_then(step, resume=False)
    assert after == before + 2
    with state.reading_once(), state.reading_once(keep=True):  # nested: the outer's reads, nothing kept
        state.open_steps()
    step()
    with state.reading_once(resume=True):
        assert state.open_steps() == after + 2  # read anew: the nested block kept nothing
    # The closed phases, decoded once per block: each caller its own list; a write (a phase closed) is seen.
    with state.reading_once():
        first = state.closed_phases()
        first.append("not a phase")
        assert state.closed_phases() == []
        state.close_open_phase()
        assert len(state.closed_phases()) == 1 and state.closed_phases()[0].steps > 0
    state.open_phase(kind="participations", noise_multiplier=1.0, neighboring="add_or_remove",
                     sample_rate=None, num_examples=64, source="train_on_batch", batch_size=8)
    # The DP settings the record reads (noise multiplier, batch size): once per block, anew in the next.
    with state.reading_once():
        assert abs(optimizer.noise_multiplier - 1.0) < 1e-12 and optimizer.batch_size == 8
        optimizer._dp_noise_multiplier.assign(1.5)  # not through the ledger's object: not seen in the block
        assert abs(optimizer.noise_multiplier - 1.0) < 1e-12
    assert abs(optimizer.noise_multiplier - 1.5) < 1e-12  # outside a block: every call reads
    with state.reading_once():
        assert abs(optimizer.noise_multiplier - 1.5) < 1e-12


def test_a_fits_final_snapshot_reads_the_ledger_after_its_last_epoch():
    """Without callbacks of the user's, the final snapshot holds every epoch's steps (no epoch's reads)."""
    from tfdpbnn.record import attributes

    x, y, model = _compiled_small(n=16)
    run = attributes.run_record(model.optimizer)
    for epochs in (3, 1):
        model.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
        assert run.recognises_weights()
        ledger = store.default_store().weights_ledger(store.weights_fingerprint(model))
        assert ledger is not None
        assert sum(p.steps for p in ledger) == model.optimizer.ledger.steps == model.optimizer.steps


def test_a_reservation_without_a_budget_reads_the_relations_not_the_histories(tmp_path, monkeypatch):
    """Without a budget a reservation checks only the neighboring relations of the records' releases.

    One statement gives the distinct relations over every history's chain (which grows by one release per
    fit on the records); the histories themselves are read only under a budget, or to name the records of a
    refused relation.
    """
    ledger = record_ledger.RecordLedger(str(tmp_path / "ledger.sqlite"))
    keys = np.arange(30, dtype=np.int64)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 3)
    for _ in range(4):
        ledger.record(keys, event, kind="other")
    ledger.record(keys[:10], event, kind="other")  # two histories, chains of 4 and 5 releases
    original = record_ledger.SQLiteLedger._histories
    reads = []

    def counted(self, conn, counts, composable_only=False):
        reads.append(dict(counts))
        return original(self, conn, counts, composable_only)

    monkeypatch.setattr(record_ledger.SQLiteLedger, "_histories", counted)
    ledger.record(keys, event, kind="other")
    assert reads == []
    # Another relation on the same records is refused, naming the records' relation.
    with np.testing.assert_raises_regex(ValueError, r"(10|20) of these records have releases accounted "
                                                    r"under \['add_or_remove'\]"):
        ledger.record(keys, event, kind="other", neighboring="replace_one")
    assert len(reads) == 1
    assert sorted(h.records for h in ledger.histories(keys)) == [10, 20]  # nothing written by the refusal
    # Under a budget every history is read and composed: a budget the records' releases exceed is refused.
    ledger.set_budget(1.0, 1e-5)
    reads.clear()
    with np.testing.assert_raises(record_ledger.BudgetExceededError):
        ledger.record(keys, event, kind="other")
    assert len(reads) == 1
    truth = record_ledger.composed_epsilon([event] * 6, 1e-5, "rdp", "add_or_remove")
    assert abs(ledger.max_epsilon(keys, 1e-5) - truth) <= 1e-9 * truth


def _relations_walked(ledger, keys) -> set:
    """The relations on the releases of ``keys`` as a process that kept no chain finds them (all walked)."""
    held = dict(record_ledger._CHAINS)
    record_ledger._CHAINS.clear()
    try:
        with store.transaction(ledger.backend.path, mode="DEFERRED") as conn:
            counts, _ = ledger.backend._key_counts(conn, np.unique(np.asarray(keys, np.int64)))
            return ledger.backend._neighborings(conn, counts)
    finally:
        record_ledger._CHAINS.clear()
        record_ledger._CHAINS.update(held)


def test_the_chains_kept_equal_a_walk_of_every_chain(tmp_path):
    """Random reservations (whole and partial moves), two relations on separate records: the relations and
    histories a reservation finds from the chains it kept equal those of a walk of every chain, and a
    reservation under one relation over records that carry the other is refused, however they were kept."""
    rng = np.random.default_rng(1)
    path = str(tmp_path / "ledger.sqlite")
    ledger = record_ledger.RecordLedger(path)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), 2)
    groups = {"add_or_remove": (0, 60), "replace_one": (60, 100)}
    walks = 0
    for _ in range(40):
        neighboring = ("add_or_remove", "replace_one")[int(rng.integers(2))]
        start, stop = groups[neighboring]
        low = int(rng.integers(start, stop))
        keys = np.arange(low, min(stop, low + int(rng.integers(1, 30))))
        statements = _statements(path, lambda: ledger.record(  # noqa: B023
            keys, event, kind="other", neighboring=neighboring))  # noqa: B023
        walks += sum("WITH RECURSIVE" in s for s in statements)
        probe = np.arange(int(rng.integers(0, 100)), 100)[:int(rng.integers(1, 50))]
        with store.transaction(path, mode="DEFERRED") as conn:
            counts, _ = ledger.backend._key_counts(conn, np.unique(probe))
            assert ledger.backend._neighborings(conn, counts) == _relations_walked(ledger, probe)
            # The histories from the chains kept equal those read in full (release by release).
            kept = ledger.backend._histories(conn, counts)
            assert [(h.history_id, h.records, h.releases) for h in kept] == [
                (h.history_id, h.records, h.releases) for h in ledger.backend._histories_read(conn, counts)]
    assert walks <= 10  # the chains kept served most reservations (4 walked with this seed)
    for _ in range(10):  # records of both relations: refused under either, whatever the chains kept say
        keys = np.arange(int(rng.integers(0, 55)), int(rng.integers(62, 100)))
        for neighboring in groups:
            with np.testing.assert_raises_regex(ValueError, "cannot be composed with them"):
                ledger.record(keys, event, kind="other", neighboring=neighboring)


def test_a_ledger_file_replaced_at_its_path_is_read_anew(tmp_path):
    """Another ledger's bytes written over the file (same path and inode): its own releases and chains.

    The chains and releases kept for the file name each release with its ``created`` time, which the other
    file's releases of the same ids do not share.
    """
    keys = np.arange(12, dtype=np.int64)
    paths = [str(tmp_path / "ledger.sqlite"), str(tmp_path / "other.sqlite")]
    for path, sigma in zip(paths, (1.0, 5.0), strict=True):
        ledger = record_ledger.RecordLedger(path)
        for _ in range(3):
            ledger.record(keys, dp_accounting.GaussianDpEvent(sigma), kind="other")
    ledger = record_ledger.RecordLedger(paths[0])
    assert [r.event() for r in ledger.histories(keys)[0].releases] == [dp_accounting.GaussianDpEvent(1.0)] * 3
    for connection, _ in store._KEPT.values():  # closed: each file's log written into it (as at exit)
        connection.close()
    store._KEPT.clear()
    with open(paths[1], "rb") as source, open(paths[0], "r+b") as target:
        target.write(source.read())
        target.truncate()
    assert [r.event() for r in ledger.histories(keys)[0].releases] == [dp_accounting.GaussianDpEvent(5.0)] * 3
