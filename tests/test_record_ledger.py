"""The per-record privacy ledger: record identity, reserve/commit, per-record budgets, the ledger bound.

Every epsilon is compared (rel. 1%) with an independent dp-accounting computation of the releases that touch
the record.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, rdp_epsilon, small_data, small_model

import tfdpbnn
from tfdpbnn.cli import main
from tfdpbnn.record import record_ledger, records
from tfdpbnn.record.ledger import Phase
from tfdpbnn.record.private_release import PrivacyCost


def _gaussians(sigma, count):
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), count)


def _poisson(q, sigma, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


def _ledger():
    return record_ledger.default_ledger()


# ------------------------------------------------------------------------------------ record identity
def test_content_keys_ignore_order_dtype_and_signed_zero():
    x, y = small_data()
    keys = records.content_keys(x, y)
    order = np.random.default_rng(3).permutation(N)
    np.testing.assert_array_equal(records.content_keys(x[order].astype(np.float64), y[order].astype(float)),
                                  keys[order])
    assert len(np.unique(keys)) == N
    edited = x.copy()
    edited[5, 0] += 1e-3
    changed = records.content_keys(edited, y) != keys
    assert changed.tolist() == [i == 5 for i in range(N)]
    zeros = np.zeros((2, 3), np.float32)
    zeros[1, 1] = -0.0
    k = records.content_keys(zeros)
    assert k[0] == k[1]
    # Features are what name a record: an edited feature is a new one (above), an edited label is not.
    np.testing.assert_array_equal(records.content_keys(x, (y + 1) % 3), keys)


def test_bfloat16_inputs_have_content_keys_and_train():
    # TensorFlow's bfloat16 tensors give numpy arrays of ml_dtypes' bfloat16, whose dtype kind is "V" (as a
    # raw void's): their content hash refused them as objects ("x holds float objects ... pass record_ids"),
    # so a DP fit on bfloat16 inputs failed. They are numbers, rounded to float32 like any other.
    x, y = small_data()
    rounded = tf.cast(x, tf.bfloat16)
    np.testing.assert_array_equal(records.content_keys(rounded.numpy()),
                                  records.content_keys(rounded.numpy().astype(np.float32)))
    with pytest.raises(ValueError, match="object"):
        records.content_keys(np.array([[{}]] * 2, dtype=object))   # objects still have no content hash
    model, opt = _fit(rounded, y, epochs=1)
    statement = opt.privacy_statement()
    assert statement["guarantee"]
    assert statement["quote"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=1e-6)


def test_record_ids_as_bytes_are_their_text():
    # A string tensor's ids come as bytes (tf.constant(ids).numpy()): refused before ("got bytes").
    ids = [f"p{i}" for i in range(N)] + ["7"]
    as_bytes = tf.constant(ids).numpy()
    np.testing.assert_array_equal(records.id_keys(as_bytes), records.id_keys(ids))
    assert records.id_keys([b"7"])[0] == records.id_keys([7])[0]
    x, y = small_data()
    _, opt = _fit(x, y, epochs=1, record_ids=as_bytes[:N])
    assert opt.privacy_statement()["quote"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=1e-6)


def test_content_keys_name_the_features_whatever_their_layout_and_labels():
    x, y = small_data()
    keys = records.content_keys(x, y)
    same = {
        "reshaped": (x.reshape(N, 2, 2), y),
        "in a list": ([x], y[:, None]),
        "in a dict": ({"pixels": x.astype(np.float64)}, np.eye(3)[y]),
        "split into column blocks": ((x[:, :1], x[:, 1:]), None),
        "blocks in a dict's key order": ({"b": x[:, 3:], "a": x[:, :3]}, np.eye(3)[y]),
    }
    for form, (features, labels) in same.items():
        np.testing.assert_array_equal(records.content_keys(features, labels), keys, err_msg=form)
    # Blocks in another order are other values in sequence: other keys (a list keeps its order).
    assert not np.any(records.content_keys([x[:, 3:], x[:, :3]]) == keys)
    # Version 1 (files written before version 2) hashed the label and the layout with the features.
    v1 = records.content_keys(x, y, version=1)
    assert not np.any(v1 == keys)
    assert not np.any(records.content_keys(x, (y + 1) % 3, version=1) == v1)
    assert not np.any(records.content_keys(x.reshape(N, 2, 2), y, version=1) == v1)
    with pytest.raises(ValueError, match="x, y: every array must have the 64 records on axis 0"):
        records.content_keys(x, y[:10])
    with pytest.raises(ValueError, match="version must be 1 or 2"):
        records.content_keys(x, version=3)


def test_record_ids_are_integers_or_strings():
    np.testing.assert_array_equal(records.id_keys([7, "7", np.int64(7)]), np.repeat(records.id_keys([7]), 3))
    assert records.id_keys(["alice"])[0] != records.id_keys(["bob"])[0]
    with pytest.raises(ValueError, match="record_ids must be integers or strings"):
        records.id_keys([1.0, 2.0])
    x, _ = small_data()
    with pytest.raises(ValueError, match="record_ids: 3 ids for"):
        records.record_keys(x, record_ids=[1, 2, 3])
    text = records.content_keys(np.array([["a", "b"], ["a", "c"]]))
    np.testing.assert_array_equal(records.content_keys(np.array([[b"a", b"c"], [b"a", b"b"]], dtype=object)),
                                  text[::-1])
    assert text[0] != text[1]
    with pytest.raises(ValueError, match="pass record_ids"):
        records.content_keys(np.array([{"a": 1}, {"b": 2}], dtype=object))


# --------------------------------------------------------------------------------- the ledger itself
def test_shuffled_float64_subset_superset_share_one_history():
    x, y = small_data()
    extra_x, extra_y = small_data(n=16, seed=9)
    ledger = _ledger()
    order = np.random.default_rng(1).permutation(N)
    releases = {  # one release per way the same records come back
        "original": (records.record_keys(x, y), _gaussians(2.0, 3)),
        "shuffled float64": (records.record_keys(x[order].astype(np.float64), y[order]), _gaussians(3.0, 2)),
        "subset": (records.record_keys(x[:20], y[:20].astype(np.float32)), _poisson(0.1, 1.5, 20)),
        "superset": (records.record_keys(np.concatenate([x, extra_x]), np.concatenate([y, extra_y])),
                     _gaussians(4.0, 1)),
    }
    for keys, event in releases.values():
        ledger.record(keys, event, kind="training")
    by_count = dict((count, eps) for count, eps in ledger.record_epsilons(None, DELTA))
    events = [event for _, event in releases.values()]
    assert sorted(by_count) == [16, 20, N - 20]   # three distinct histories, however many records
    assert by_count[20] == pytest.approx(rdp_epsilon(dp_accounting.ComposedDpEvent(events)), rel=0.01)
    assert by_count[N - 20] == pytest.approx(
        rdp_epsilon(dp_accounting.ComposedDpEvent([events[0], events[1], events[3]])), rel=0.01)
    assert by_count[16] == pytest.approx(rdp_epsilon(events[3]), rel=0.01)


def test_early_stop_returns_the_unspent_reservation():
    x, y = small_data()
    keys = records.record_keys(x, y)
    ledger = _ledger()
    reservation = ledger.reserve(keys, _gaussians(1.0, 10), phase_id=17)
    assert ledger.max_epsilon(keys, DELTA) == pytest.approx(gaussians_epsilon(1.0, 10), rel=0.01)
    reservation.commit(_gaussians(1.0, 2))
    assert ledger.max_epsilon(keys, DELTA) == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)
    with pytest.raises(ValueError, match="already committed"):
        reservation.commit(_gaussians(1.0, 1))


def test_ledger_bound_counts_the_model_steps_the_ledger_did_not_see():
    x, y = small_data()
    keys = records.record_keys(x, y)
    ledger = _ledger()

    def phase(phase_id, passes):
        return Phase(kind="participations", noise_multiplier=1.0, neighboring="add_or_remove",
                     steps=8 * passes,
                     participations=passes, phase_id=phase_id)

    ledger.reserve(keys, phase(5, 1).event(), phase_id=5).commit(phase(5, 1).event())
    ledger.record(keys[:10], _gaussians(2.0, 4), kind="training")  # another model's run on some records
    # The model went on in phase 5 (a second pass) and in phase 6 on records the ledger never saw.
    bound, count = ledger.bound_for([phase(5, 2), phase(6, 1)], DELTA)
    assert count == N
    assert bound == pytest.approx(rdp_epsilon(dp_accounting.ComposedDpEvent(
        [_gaussians(1.0, 3), _gaussians(2.0, 4)])), rel=0.01)
    assert ledger.bound_for([phase(7, 1)], DELTA) == (None, 0)


def test_budget_refuses_before_writing_and_names_the_numbers():
    x, y = small_data()
    keys = records.record_keys(x, y)
    ledger = _ledger()
    ledger.set_budget(gaussians_epsilon(1.0, 3) * 1.001, DELTA)
    ledger.record(keys[:10], _gaussians(1.0, 2), kind="training")
    with pytest.raises(record_ledger.BudgetExceededError, match=r"10 of these 64 records would reach"):
        ledger.reserve(keys, _gaussians(1.0, 2))
    assert len(ledger.backend.releases()) == 1   # nothing written
    ledger.reserve(keys[10:], _gaussians(1.0, 3))   # the other records still have room
    with pytest.raises(ValueError, match="accountant must be one of the sound"):
        ledger.set_budget(1.0, DELTA, accountant="gdp")


def _reserve_one_pass(path, barrier, results):
    ledger = record_ledger.RecordLedger(path)
    barrier.wait()
    try:
        ledger.reserve(np.arange(1000, dtype=np.int64), dp_accounting.GaussianDpEvent(1.0))
        results.put("reserved")
    except record_ledger.BudgetExceededError:
        results.put("refused")


def test_two_processes_reserving_a_one_pass_budget_exactly_one_passes(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ledger = record_ledger.RecordLedger(path)
    ledger.set_budget(gaussians_epsilon(1.0, 1) * 1.001, DELTA)
    context = multiprocessing.get_context("fork")  # two OS processes, each with its own connection
    barrier, results = context.Barrier(2), context.Queue()
    procs = [context.Process(target=_reserve_one_pass, args=(path, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert outcomes == ["refused", "reserved"]
    assert ledger.max_epsilon(np.arange(1000, dtype=np.int64), DELTA) == pytest.approx(
        gaussians_epsilon(1.0, 1), rel=0.01)


def test_schema_version_is_checked(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    record_ledger.SQLiteLedger(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone()[0] == \
            str(record_ledger.SCHEMA_VERSION)
        conn.execute("UPDATE ledger_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(record_ledger.SchemaVersionError, match="schema version 99.*reads versions 1, 2"):
        record_ledger.SQLiteLedger(path)
    # A record store written before the ledger existed gets the ledger's tables and keeps its runs.
    old = str(tmp_path / "old_store.sqlite")
    tfdpbnn.record.store.RunStore(old).set_budget("data:x", 1.0, DELTA)
    record_ledger.SQLiteLedger(old)
    assert tfdpbnn.record.store.RunStore(old).budget("data:x")["epsilon"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------- wired into fit
def _fit(x, y, epochs, sigma=1.0, seed=0, **fit_kwargs):
    model = small_model(seed=seed)
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=len(x), batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, **fit_kwargs)
    return model, opt


@pytest.mark.parametrize("renamed", ["prefixed", "retyped"])
def test_the_same_rows_under_other_record_ids_compose_their_releases(renamed):
    # Each release by ids is written on its rows' content too: rows named anew (new ids for the same people,
    # 7 then "7.0") keep their earlier releases (4.73 was printed for each later fit alone).
    x, y = small_data()
    _fit(x[:48], y[:48], epochs=2, record_ids=np.arange(48))
    rows = np.arange(16, N)
    later = {"prefixed": [np.array([f"p{i}" for i in rows]), 10_000 + rows],
             "retyped": [np.array([f"{i}.0" for i in rows]), np.array([f"id{i}" for i in rows])]}[renamed]
    for passes, ids in zip((3, 4), later, strict=True):    # rows 16..47: 2 passes, then 1 more per fit
        _, opt = _fit(x[rows], y[rows], epochs=1, seed=passes, record_ids=ids)
        statement = opt.privacy_statement()
        assert statement["run_epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)
        assert statement["ledger_bound"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, passes), rel=0.01)
        assert statement["ledger_bound"]["records"] == len(rows)   # the rows, not their ids and content
        assert statement["quote"]["epsilon"] >= gaussians_epsilon(1.0, passes) * (1 - 1e-6)


@pytest.mark.parametrize("order", ["renamed, then without rows", "without rows, then with them"])
def test_both_keys_of_a_row_hold_its_releases_when_one_is_new(order):
    # Renamed with their rows, the new ids' keys began a history of their own: a release naming them
    # without their rows (an asserted pipeline) composed only the renamed release (ledger bound 7.08 where
    # 10.73 holds, passing a budget of 9.87). Ids named without their rows first, their rows' twin keys
    # began with the ids' rows: the same rows renamed lost the pipeline's pass. A key new to the ledger now
    # joins the history of its row's other key.
    x, y = small_data()
    pipeline = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N, seed=0).batch(8), "shuffle", N)
    if order == "renamed, then without rows":
        _fit(x, y, epochs=2, record_ids=[f"a{i}" for i in range(N)])
        _, renamed = _fit(x, y, epochs=1, seed=1, record_ids=np.arange(N))
        assert renamed.privacy_statement()["ledger_bound"]["epsilon"] == pytest.approx(
            gaussians_epsilon(1.0, 3), rel=0.01)
        _ledger().set_budget((gaussians_epsilon(1.0, 3) + gaussians_epsilon(1.0, 4)) / 2, DELTA)
        model = small_model(seed=2)
        optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
        model.compile(optimizer=optimizer, loss=LOSS)
        with pytest.raises(record_ledger.BudgetExceededError, match=r"would reach epsilon 10\.7"):
            model.fit(pipeline, epochs=1, verbose=0, record_ids=np.arange(N))
        assert optimizer.steps == 0
    else:
        model = small_model(seed=2)
        optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
        model.compile(optimizer=optimizer, loss=LOSS)
        model.fit(pipeline, epochs=1, verbose=0, record_ids=np.arange(N))   # 1 pass, ids alone
        _fit(x, y, epochs=1, seed=1, record_ids=np.arange(N))                # the same ids with their rows
        _, renamed = _fit(x, y, epochs=1, seed=3, record_ids=[f"p{i}" for i in range(N)])
        bound = renamed.privacy_statement()["ledger_bound"]
        assert bound["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)   # 4.73 alone before
        assert bound["records"] == N


def test_ledger_bound_after_two_runs_on_overlapping_records(tmp_path, capsys):
    x, y = small_data()
    _fit(x[:48], y[:48], epochs=2)
    order = np.random.default_rng(2).permutation(np.arange(16, N))
    model, opt = _fit(x[order].astype(np.float64), y[order], epochs=1, seed=1)
    statement = opt.privacy_statement()
    assert statement["run_epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)
    bound = statement["ledger_bound"]
    # Rows 16..47 took part in both runs: 2 + 1 passes of Gaussians at sigma 1.
    assert bound["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)
    assert bound["records"] == N - 16
    assert statement["quote"]["which"] == "ledger_bound"
    assert statement["quote"]["epsilon"] == pytest.approx(bound["epsilon"], rel=1e-9)
    # privacy.json and the CLI carry both numbers.
    path = tmp_path / "privacy.json"
    path.write_text(json.dumps(statement, allow_nan=False))
    assert main(["privacy", "--statement", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"run epsilon:  {statement['run_epsilon']:.4g}" in out
    assert f"ledger bound: {bound['epsilon']:.4g} over 48 records" in out
    assert f"quote: ledger_bound = {bound['epsilon']:.4g}" in out
    assert main(["privacy", "--ledger", os.environ["TFDPBNN_PRIVACY_STORE"], "--delta", str(DELTA)]) == 0
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \|$", capsys.readouterr().out, flags=re.M)
    assert sorted(int(c) for c, _ in rows) == [16, 16, 32]
    assert max(float(e) for _, e in rows) == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)
    assert main(["privacy", "--epochs", "2"]) == 2
    assert "--num-examples, --batch-size, --delta" in capsys.readouterr().err


def test_early_stopped_fit_commits_what_ran_and_record_ids_name_the_records():
    x, y = small_data()
    stop = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(model, "stop_training",
                                                                                        True))
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    ids = [f"patient-{i}" for i in range(N)]
    model.fit(x, y, batch_size=8, epochs=5, verbose=0, callbacks=[stop], record_ids=ids)
    ledger = _ledger()
    (release,) = ledger.backend.releases()
    assert release.committed and release.phase_id == opt.ledger.phases[0].phase_id
    # Planned 5 passes, ran 1: the record is charged 1.
    charged = ledger.max_epsilon(records.id_keys(ids), DELTA)
    assert charged == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)
    assert ledger.max_epsilon(records.content_keys(x, y), DELTA) == 0.0   # ids, not contents, name them


def test_per_record_budget_refuses_a_fit_on_shuffled_copies_before_its_first_step():
    x, y = small_data()
    _ledger().set_budget(gaussians_epsilon(1.0, 2) * 1.001, DELTA)
    _fit(x, y, epochs=1)
    order = np.random.default_rng(4).permutation(N)
    model = small_model(seed=2)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(record_ledger.BudgetExceededError, match="64 of these 64 records"):
        model.fit(x[order].astype(np.float64), y[order], batch_size=8, epochs=2, verbose=0)
    assert opt.steps == 0
    for w, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(w, b)


def test_the_same_records_reshaped_in_a_dict_with_one_hot_labels_are_counted():
    # Trained once as flat rows with integer labels; then as (2, 2) images in a dict with one-hot labels
    # and another loss: before, new content keys, so the per-record budget and the bound missed the first.
    x, y = small_data()
    _fit(x, y, epochs=1)
    tf.keras.utils.set_random_seed(3)
    inputs = tf.keras.Input((2, 2), name="pixels")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(inputs)))
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=tf.keras.losses.CategoricalCrossentropy(from_logits=True))
    features, labels = {"pixels": x.reshape(N, 2, 2).astype(np.float64)}, np.eye(3, dtype=np.float32)[y]
    model.fit(features, labels, batch_size=8, epochs=1, verbose=0)
    bound = opt.privacy_statement()["ledger_bound"]
    assert bound["records"] == N
    assert bound["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)
    # Under a budget of two passes, a third pass in yet another form is refused before its first step.
    _ledger().set_budget(gaussians_epsilon(1.0, 2) * 1.001, DELTA)
    again = small_model(seed=4)
    again.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    with pytest.raises(record_ledger.BudgetExceededError, match="64 of these 64 records"):
        again.fit([x], (y + 1) % 3, batch_size=8, epochs=1, verbose=0)
    assert again.optimizer.steps == 0


def test_records_named_by_content_then_by_ids_or_the_reverse_are_refused(tmp_path, monkeypatch):
    # One record under two keys has two histories: before, a second run naming the records the other way
    # printed a ledger bound of one pass (4.73) where two passes (7.08) hold.
    x, y = small_data()
    ids = [f"patient-{i}" for i in range(N)]
    order = np.random.default_rng(5).permutation(N)
    _fit(x, y, epochs=1)   # named by content
    model = small_model(seed=3)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(record_ledger.RecordNamingError,
                       match="record_ids: 64 of these 64 records were named by their content"):
        model.fit(x[order], y[order], batch_size=8, epochs=1, verbose=0,
                  record_ids=[ids[i] for i in order])
    assert opt.steps == 0
    for w, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(w, b)
    # The reverse, in another store: ids first (with the rows, so their content is kept with the ids).
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", str(tmp_path / "by_ids.sqlite"))
    _, first = _fit(x, y, epochs=1, record_ids=ids)
    _, again = _fit(x[order], y[order], epochs=1, seed=1, record_ids=[ids[i] for i in order])  # same ids
    assert again.privacy_statement()["ledger_bound"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2),
                                                                                 rel=0.01)
    for how, data in (("arrays", (x[:40].astype(np.float64), y[:40])),
                      ("poisson_batches", (tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125, seed=None),
                                           None))):
        model = small_model(seed=4)
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N if how != "arrays" else 40, batch_size=8,
                                     delta=DELTA, **({"sampling": "poisson"} if how != "arrays" else {}))
        model.compile(optimizer=opt, loss=LOSS)
        with pytest.raises(record_ledger.RecordNamingError, match="were named by record_ids"):
            if how == "arrays":
                model.fit(*data, batch_size=8, epochs=1, verbose=0)
            else:
                model.fit(data[0], epochs=1, verbose=0)
        assert opt.steps == 0, how
    # A "parallel" calibration named by content, on records trained under ids: refused, nothing recorded.
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(2.0, 5), epsilon=0.0, delta=DELTA)
    release = type("Release", (), {"privacy": cost})()
    with pytest.raises(record_ledger.RecordNamingError, match="Pass the same record_ids"):
        first.record_release(release, "parallel", x=x[:16], y=y[:16])
    assert first.privacy_statement()["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)
    first.record_release(release, "sequential", record_ids=ids[:16])   # named as in training: accepted
    assert len(_ledger().backend.releases()) == 3


def _copy(source, target):
    """A consistent copy of a SQLite file in write-ahead-log mode (the log's pages included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def _meta(path):
    """The ledger file's (schema version, content-key version)."""
    with sqlite3.connect(path) as conn:
        meta = dict(conn.execute("SELECT key, value FROM ledger_meta"))
    return meta["schema_version"], meta.get("content_key_version")


def test_a_version_1_ledger_keeps_its_records_keys_and_an_empty_one_takes_version_2(tmp_path, monkeypatch):
    x, y = small_data()
    written = tmp_path / "written.sqlite"
    ledger = record_ledger.RecordLedger(str(written))
    assert ledger.content_key_version == 2
    ledger.record(records.content_keys(x, y, version=1), _gaussians(1.0, 1), kind="training")
    with sqlite3.connect(written) as conn:   # as a tfdpbnn before version 2 left it
        conn.execute("UPDATE ledger_meta SET value = '1' WHERE key = 'schema_version'")
    old = tmp_path / "old.sqlite"
    _copy(written, old)   # another file: opened anew
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", str(old))
    assert record_ledger.content_key_version() == 1
    model, opt = _fit(x, y, epochs=1)   # the same records, found by their version-1 keys
    assert opt.privacy_statement()["ledger_bound"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2),
                                                                               rel=0.01)
    assert _meta(old) == ("3", "1")   # brought to this layout, its records keeping their version-1 keys
    # A version-1 file with no release yet names no record: it takes version 2.
    empty = tmp_path / "empty.sqlite"
    record_ledger.SQLiteLedger(str(empty))
    with sqlite3.connect(empty) as conn:
        conn.execute("UPDATE ledger_meta SET value = '1' WHERE key = 'schema_version'")
    fresh = tmp_path / "empty_copy.sqlite"
    _copy(empty, fresh)
    assert record_ledger.RecordLedger(str(fresh)).content_key_version == 2
    assert _meta(fresh) == ("3", "2")


def test_a_version_2_ledger_with_twin_keys_among_its_records_is_brought_to_version_3(tmp_path, monkeypatch):
    # As a tfdpbnn before version 3 left a file: the twin keys of rows named by ids among the records, their
    # content in ``ledger_named``. Opened, the twin keys move to ``ledger_twins`` with their histories, so
    # the same rows renamed still find their releases, and the records named by ids stay refused by content.
    x, y = small_data()
    written = tmp_path / "written.sqlite"
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", str(written))
    _fit(x[:48], y[:48], epochs=2, record_ids=np.arange(48))
    with sqlite3.connect(written) as conn:
        conn.execute("INSERT INTO ledger_named (content) SELECT ~record FROM ledger_twins")
        conn.execute("INSERT INTO ledger_records SELECT record, history FROM ledger_twins")
        conn.execute("DELETE FROM ledger_twins")
        conn.execute("UPDATE ledger_meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("DELETE FROM ledger_meta WHERE key IN ('content_key_version', 'twins_written')")
    old = tmp_path / "old.sqlite"
    _copy(written, old)   # another file: opened anew
    monkeypatch.setenv("TFDPBNN_PRIVACY_STORE", str(old))
    rows = np.arange(16, N)
    _, opt = _fit(x[rows], y[rows], epochs=1, seed=3, record_ids=10_000 + rows)
    bound = opt.privacy_statement()["ledger_bound"]
    assert bound["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)   # rows 16..47: 2 + 1
    assert bound["records"] == len(rows)
    assert _meta(old) == ("3", "2")
    with sqlite3.connect(old) as conn:
        assert conn.execute("SELECT COUNT(*) FROM ledger_twins").fetchone()[0] == N   # rows 0..63
        assert conn.execute("SELECT COUNT(*) FROM ledger_records").fetchone()[0] == 48 + len(rows)   # ids
    with pytest.raises(record_ledger.RecordNamingError,
                       match="64 of these 64 records were named by record_ids"):
        _fit(x, y, epochs=1, seed=4)   # rows 0..47 named by ids before the file was brought, 16..63 since


def test_a_release_on_the_training_records_reaches_the_same_rows_renamed_later():
    # A calibration on the records a model was trained on (asserted by name; their keys read from the ledger)
    # is written on their twin keys too, so a later fit on the same rows under new ids composes it.
    x, y = small_data()
    _, first = _fit(x, y, epochs=1, record_ids=np.arange(N))
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(2.0, 5), epsilon=0.0, delta=DELTA)
    first.record_release(type("Release", (), {"privacy": cost})(), "sequential",
                         asserted_training_records="fit on the training records")
    _, later = _fit(x, y, epochs=1, seed=1, record_ids=np.array([f"p{i}" for i in range(N)]))
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 2), _gaussians(2.0, 5)]))
    bound = later.privacy_statement()["ledger_bound"]
    assert bound["epsilon"] == pytest.approx(truth, rel=0.01)
    assert bound["epsilon"] > gaussians_epsilon(1.0, 2) * 1.05   # the calibration counts
    assert bound["records"] == N


def test_per_record_budget_refuses_a_fit_whose_records_are_unknown():
    # An asserted pipeline without record keys under a one-pass budget: accepted before, and the records'
    # second pass (7.08 against the budget 4.78) never reached the ledger.
    x, y = small_data()
    _ledger().set_budget(gaussians_epsilon(1.0, 1) * 1.01, DELTA)
    _fit(x, y, epochs=1)
    untagged = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N).batch(8), "shuffle", num_examples=N)
    model = small_model(seed=2)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    with pytest.raises(ValueError, match="record_ids: the record ledger has a per-record privacy budget, "
                                         "and the records of this input are unknown"):
        model.fit(untagged, epochs=1, verbose=0)
    assert opt.steps == 0
    tagged = records.tag_record_keys(untagged, records.content_keys(x, y))
    with pytest.raises(record_ledger.BudgetExceededError, match="64 of these 64 records"):
        model.fit(tagged, epochs=1, verbose=0)  # its records known: the budget refuses the second pass
    assert opt.steps == 0


def test_a_pipeline_tagged_with_fewer_keys_than_its_records_is_refused():
    # A pipeline over 64 records tagged with the keys of 10 of them: its pass was written against those 10,
    # so a later pass on rows 16..63 quoted 9.01 (their 2 passes and its own) where 10.73 holds (4 passes).
    x, y = small_data()
    _fit(x, y, epochs=2)
    pipeline = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(N).batch(8), "shuffle", num_examples=N)
    records.tag_record_keys(pipeline, records.content_keys(x[:10]))
    model = small_model(seed=2)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    with pytest.raises(ValueError, match="tag_record_keys: the pipeline is tagged with 10 record keys, but "
                                         "its sampling is accounted over num_examples=64"):
        model.fit(pipeline, epochs=1, verbose=0)
    assert opt.steps == 0
    records.tag_record_keys(pipeline, records.content_keys(x))   # one key per record: trained and counted
    model.fit(pipeline, epochs=1, verbose=0)
    _, later = _fit(x[16:], y[16:], epochs=1, seed=3)
    truth = gaussians_epsilon(1.0, 4)   # rows 16..63: 2 + 1 + 1 passes, one Gaussian at sigma 1 each
    assert later.privacy_statement()["quote"]["epsilon"] == pytest.approx(truth, rel=1e-6)
    assert truth > gaussians_epsilon(1.0, 3) * 1.1   # what was quoted with 10 keys


def test_poisson_batches_of_an_x_y_tuple_name_the_records_by_their_features():
    # poisson_batches((x, y), ...) yields (x_b, y_b), which Keras reads as features and labels; the records'
    # keys hashed the labels as features too, so the rows with a label other than 0 (whose zero word adds
    # nothing to the hash) were new records: a later pass on them quoted 9.01 where 9.57 holds.
    x, y = small_data()
    _fit(x, y, epochs=2)
    model = small_model(seed=2)
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, sampling="poisson")
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(tfdpbnn.data.poisson_batches((x, y), sample_rate=0.125), epochs=1, verbose=0)
    labelled = y != 0
    _, later = _fit(x[labelled], y[labelled], epochs=1, seed=3)
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 3), _poisson(0.125, 1.0, 8)]))
    assert later.privacy_statement()["quote"]["epsilon"] == pytest.approx(truth, rel=1e-6)
    assert truth > gaussians_epsilon(1.0, 3) * 1.05   # what was quoted


def test_a_pipelines_reservation_counts_its_batches_not_the_optimizers_batch_size():
    # A full-batch asserted pipeline (batch(64)) with an optimizer of batch_size 8: the reservation counted
    # 6 steps of 8 examples (one participation, 4.73) and a per-record budget of 5 admitted a run that spent
    # 6 participations (13.78).
    x, y = small_data()
    _ledger().set_budget(5.0, DELTA)
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    full = tfdpbnn.data.assert_sampling(tf.data.Dataset.from_tensor_slices((x, y)).batch(N), "shuffle",
                                        num_examples=N)
    truth = gaussians_epsilon(1.0, 6)
    assert truth > 13.0
    with pytest.raises(record_ledger.BudgetExceededError, match="would reach epsilon 13.78"):
        model.fit(full, epochs=6, verbose=0, record_ids=np.arange(N))
    assert opt.steps == 0
    model.fit(full, epochs=1, verbose=0, record_ids=np.arange(N))   # one pass fits: 4.73
    assert opt.privacy_statement()["quote"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=1e-6)
    # Passes that drop their last partial batch (56 of 60 records): each epoch is one participation, 15 of
    # them (the reservation of 15 x 56 examples counted 14).
    x60, y60 = small_data(n=60)
    _ledger().set_budget(gaussians_epsilon(1.0, 15) * 0.999, DELTA)
    dropped = tfdpbnn.data.assert_sampling(
        tf.data.Dataset.from_tensor_slices((x60, y60)).shuffle(60).batch(8, drop_remainder=True), "shuffle",
        num_examples=60)
    other = small_model(seed=4)
    other_opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=60, batch_size=8, delta=DELTA)
    other.compile(optimizer=other_opt, loss=LOSS)
    with pytest.raises(record_ledger.BudgetExceededError):
        other.fit(dropped, epochs=15, verbose=0, record_ids=np.arange(1000, 1060))
    assert other_opt.steps == 0


def test_calibration_release_counts_only_for_its_split():
    x, y = small_data()
    x_cal, y_cal = small_data(n=16, seed=7)
    model, opt = _fit(x, y, epochs=1)
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(2.0, 5), epsilon=0.0, delta=DELTA)
    opt.record_release(type("Release", (), {"privacy": cost})(), "parallel", x=x_cal, y=y_cal)
    ledger = _ledger()
    train = ledger.max_epsilon(records.content_keys(x, y), DELTA)
    cal = ledger.max_epsilon(records.content_keys(x_cal, y_cal), DELTA)
    assert train == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)
    assert cal == pytest.approx(gaussians_epsilon(2.0, 5), rel=0.01)
    # This model's bound composes the calibration with its training records' histories (an upper bound).
    bound = opt.privacy_statement()["ledger_bound"]
    assert bound["records"] == N
    assert bound["epsilon"] == pytest.approx(rdp_epsilon(dp_accounting.ComposedDpEvent(
        [_gaussians(1.0, 1), _gaussians(2.0, 5)])), rel=0.01)


def test_a_private_calibration_over_the_budget_is_refused_before_it_queries_its_data(monkeypatch):
    # A private temperature or threshold used to be computed before record_release could refuse it: over a
    # per-record budget the user held the released value, and the ledger held nothing.
    from tfdpbnn.uncertainty import conformal, temperature

    x, y = small_data()
    x_cal, y_cal = small_data(n=16, seed=7)
    model, opt = _fit(x, y, epochs=1)
    probs = tf.nn.softmax(model(x_cal)).numpy()
    queried = []
    derivatives, bisection = temperature.per_example_derivatives, conformal.noisy_bisection
    monkeypatch.setattr(temperature, "per_example_derivatives",
                        lambda *a: queried.append(1) or derivatives(*a))
    monkeypatch.setattr(conformal, "noisy_bisection",
                        lambda *a, **k: queried.append(1) or bisection(*a, **k))
    ledger = _ledger()
    held_out = records.content_keys(x_cal, y_cal)
    ledger.set_budget(0.5, DELTA, "rdp")
    record = {"optimizer": opt, "composition": "parallel", "x": x_cal, "y": y_cal}
    with pytest.raises(record_ledger.BudgetExceededError, match="16 of these 16 records"):
        tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, **record)
    with pytest.raises(record_ledger.BudgetExceededError, match="16 of these 16 records"):
        tfdpbnn.uncertainty.private_conformal_threshold(probs, y_cal, 0.1, epsilon=1.0, delta=DELTA,
                                                        allow_uninformative=True, **record)
    assert queried == [] and [r for r in ledger.backend.releases() if r.kind == "calibration"] == []
    assert opt.privacy_statement().get("releases") is None
    # A plan whose temperature fits the budget but whose threshold does not: neither runs, and the
    # temperature's reservation is given back (nothing spent on the held-out records).
    plan = tfdpbnn.uncertainty.CalibrationPlan(composition="parallel")
    eps_t, eps_c = plan.release_epsilons(2.0, DELTA)
    ledger.set_budget(1.02 * eps_t, DELTA, "rdp")
    with pytest.raises(record_ledger.BudgetExceededError, match="16 of these 16 records"):
        plan.fit(probs, y_cal, 2.0, DELTA, allow_uninformative=True, optimizer=opt, x=x_cal, y=y_cal)
    assert queried == [] and opt.privacy_statement().get("releases") is None
    assert ledger.max_epsilon(held_out, DELTA) == pytest.approx(0.0, abs=1e-9)
    # Within the budget: reserved, then recorded with what it spent, in the ledger and the statement.
    ledger.set_budget(10.0, DELTA, "rdp")
    scaling = tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, **record)
    assert queried
    assert [(r["temperature"], r["composition"]) for r in opt.privacy_statement()["releases"]] == [
        (pytest.approx(scaling.temperature), "parallel")]
    assert ledger.max_epsilon(held_out, DELTA) == pytest.approx(rdp_epsilon(scaling.privacy.dp_event),
                                                                rel=0.01)
    temperature_fit, threshold = plan.fit(probs, y_cal, 2.0, DELTA, allow_uninformative=True, optimizer=opt,
                                          x=x_cal, y=y_cal)
    assert len(opt.privacy_statement()["releases"]) == 3
    assert ledger.max_epsilon(held_out, DELTA) == pytest.approx(rdp_epsilon(dp_accounting.ComposedDpEvent(
        [scaling.privacy.dp_event, temperature_fit.privacy.dp_event, threshold.privacy.dp_event])), rel=0.01)
    # The record arguments need the optimizer; a split not shown disjoint is refused before anything runs.
    with pytest.raises(ValueError, match="x: says how the release is recorded, so it needs optimizer="):
        tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, x=x_cal, y=y_cal)
    queried.clear()
    with pytest.raises(ValueError, match="composition: 'parallel' needs the release's records"):
        tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, optimizer=opt,
                                                    composition="parallel")
    assert queried == []


def _held_out_calibration_setup():
    """One pass of a model on records A, and the predicted probabilities of 64 held-out records B."""
    x, y = small_data()
    x_b, y_b = small_data(seed=7)
    model, optimizer = _fit(x, y, epochs=1)
    return optimizer, tf.nn.softmax(model(x_b)).numpy(), x_b, y_b


def test_a_private_calibration_that_names_no_records_is_refused_before_it_reads_them(monkeypatch):
    # Given the optimizer and no records, a private calibration on held-out records B was written against the
    # optimizer's training records A: B's histories lacked it, and a later run of 2 passes on B quoted 7.08
    # where 8.54 holds (the passes and the calibration at epsilon 4, by dp-accounting).
    from tfdpbnn.uncertainty import conformal, temperature

    optimizer, probs_b, x_b, y_b = _held_out_calibration_setup()
    queried = []
    derivatives, bisection = temperature.per_example_derivatives, conformal.noisy_bisection
    monkeypatch.setattr(temperature, "per_example_derivatives",
                        lambda *a: queried.append(1) or derivatives(*a))
    monkeypatch.setattr(conformal, "noisy_bisection", lambda *a, **k: queried.append(1) or bisection(*a, **k))
    plan = tfdpbnn.uncertainty.CalibrationPlan(composition="sequential")
    released = plan.fit(probs_b, y_b, 2.0, DELTA, allow_uninformative=True, seeds=(0, 1))  # not recorded
    queried.clear()
    written = len(_ledger().backend.releases())
    unnamed = r"^x, y, record_ids: the release names none of the records it read .*asserted_training_records="
    fits = {
        "temperature": lambda **k: tfdpbnn.uncertainty.fit_temperature_private(
            probs_b, y_b, epsilon=4.0, delta=DELTA, optimizer=optimizer, **k),
        "conformal": lambda **k: tfdpbnn.uncertainty.private_conformal_threshold(
            probs_b, y_b, 0.1, epsilon=4.0, delta=DELTA, allow_uninformative=True, optimizer=optimizer, **k),
        "plan": lambda **k: plan.fit(probs_b, y_b, 2.0, DELTA, allow_uninformative=True, optimizer=optimizer,
                                     **k),
        "record_release": lambda **k: optimizer.record_release(released[0], **k)}
    for name, fit in fits.items():
        for named in ({}, {"y": y_b}):   # labels alone name no record either
            with pytest.raises(ValueError, match=unnamed):
                fit(**named)
            assert queried == [], name
    with pytest.raises(ValueError, match=unnamed):   # a parallel split asserted still names no records
        optimizer.record_release(released[0], "parallel", asserted_disjoint="held out by split_by_record")
    assert len(_ledger().backend.releases()) == written
    assert optimizer.privacy_statement().get("releases") is None
    # Without privacy cost (a fit on public data) nothing is to be charged: recorded as before.
    public = tfdpbnn.uncertainty.fit_temperature(probs_b, y_b)
    optimizer.record_release(public)
    assert [r["privacy"]["epsilon"] for r in optimizer.privacy_statement()["releases"]] == [0.0]


@pytest.mark.parametrize("named", ["x", "x and record_ids"])
def test_a_private_calibration_named_by_its_records_counts_for_a_later_run_on_them(named):
    # The hole's scenario (a calibration on B, then 2 passes on B: 7.08 quoted, 8.54 the truth): unnamed, the
    # calibration is refused; named, B's histories hold it and the later run on B quotes at least the truth.
    optimizer, probs_b, x_b, y_b = _held_out_calibration_setup()
    with pytest.raises(ValueError, match="^x, y, record_ids: "):
        tfdpbnn.uncertainty.fit_temperature_private(probs_b, y_b, epsilon=4.0, delta=DELTA,
                                                    optimizer=optimizer)
    ids = {"record_ids": np.array([f"b{i}" for i in range(N)])} if named != "x" else {}
    fit = tfdpbnn.uncertainty.fit_temperature_private(probs_b, y_b, epsilon=4.0, delta=DELTA,
                                                      optimizer=optimizer, x=x_b, y=y_b, **ids)
    _, later = _fit(x_b, y_b, epochs=2, seed=1, **ids)   # 2 passes on B
    truth = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent(
        [_gaussians(1.0, 2), fit.privacy.dp_event])).get_epsilon(DELTA)
    assert truth == pytest.approx(8.54, abs=0.01)
    statement = later.privacy_statement()
    assert statement["run_epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)   # 7.08: B's run
    for quoted in (statement["quote"]["epsilon"], statement["ledger_bound"]["epsilon"],
                   _ledger().max_epsilon(records.record_keys(x_b, y_b, ids.get("record_ids")), DELTA)):
        assert quoted >= truth * (1 - 1e-6)
        assert quoted == pytest.approx(truth, rel=0.01)


def test_a_private_calibration_named_by_other_records_than_it_read_is_refused():
    # x=probs_B (the probabilities, not the inputs) was accepted for a sequential release: the ledger charged
    # "records" no run reads, and a later 2 passes on B quoted 7.08 where 7.52 holds (calibration at
    # epsilon 2). A fit reading 128 rows (A+B) named by the 64 rows of B passed too, even as "parallel".
    optimizer, probs_b, x_b, y_b = _held_out_calibration_setup()
    y_a = small_data()[1]
    written = len(_ledger().backend.releases())
    plan = tfdpbnn.uncertainty.CalibrationPlan(composition="sequential")
    fits = {
        "temperature": lambda p, labels, **k: tfdpbnn.uncertainty.fit_temperature_private(
            p, labels, epsilon=2.0, delta=DELTA, optimizer=optimizer, **k),
        "conformal": lambda p, labels, **k: tfdpbnn.uncertainty.private_conformal_threshold(
            p, labels, 0.1, epsilon=2.0, delta=DELTA, allow_uninformative=True, optimizer=optimizer, **k),
        "plan": lambda p, labels, **k: plan.fit(p, labels, 2.0, DELTA, allow_uninformative=True,
                                                optimizer=optimizer, **k)}
    probs_ab, y_ab = np.concatenate([probs_b, probs_b]), np.concatenate([y_a, y_b])   # 128 rows read
    for name, fit in fits.items():
        with pytest.raises(ValueError, match=r"^x: .*input shape \(None, 4\).*got shape \(64, 3\)"):
            fit(probs_b, y_b, x=probs_b, y=y_b)
        with pytest.raises(ValueError, match="^x: names 8 records, but the release read 64 rows"):
            fit(probs_b, y_b, x=x_b[:8], y=y_b[:8])
        with pytest.raises(ValueError, match="^record_ids: names 8 records, but the release read 64 rows"):
            fit(probs_b, y_b, record_ids=np.arange(8))
        with pytest.raises(ValueError, match="^x: names 64 records, but the release read 128 rows"):
            fit(probs_ab, y_ab, x=x_b, y=y_b, **({"composition": "parallel"} if name != "plan" else {}))
    released = tfdpbnn.uncertainty.fit_temperature_private(probs_b, y_b, epsilon=2.0, delta=DELTA, seed=0)
    with pytest.raises(ValueError, match="^x: names 8 records, but the release read 64 rows"):
        optimizer.record_release(released, x=x_b[:8], y=y_b[:8])
    with pytest.raises(ValueError, match="^x: .*input shape"):
        optimizer.record_release(released, "parallel", x=probs_b, y=y_b)
    assert len(_ledger().backend.releases()) == written
    assert optimizer.privacy_statement().get("releases") is None
    # Named by its own rows, the release counts for a later run on B: the truth by dp-accounting.
    fit = fits["temperature"](probs_b, y_b, x=x_b, y=y_b)
    _, later = _fit(x_b, y_b, epochs=2, seed=1)
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 2), fit.privacy.dp_event]))
    assert truth > gaussians_epsilon(1.0, 2) * 1.05   # 7.52 against the 7.08 of the passes alone
    quoted = later.privacy_statement()["quote"]["epsilon"]
    assert quoted >= truth * (1 - 1e-6) and quoted == pytest.approx(truth, rel=0.01)


@pytest.mark.parametrize("how", ["load", "compile=False"])
def test_export_of_a_loaded_model_finds_its_recorded_calibration_and_counts_it_once(tmp_path, how):
    # The optimizer of a model loaded from .keras (or a new DP optimizer that imports the release from the
    # per-record ledger) holds the calibration under another object: the export refused it, and recording it
    # again as the error advised counted it twice (5.82 printed where 5.29 holds).
    x, y = small_data()
    model, optimizer = _fit(x, y, epochs=1)
    probs = tf.nn.softmax(model(x)).numpy()
    reason = "fit on the training rows"
    fit = tfdpbnn.uncertainty.fit_temperature_private(probs, y, epsilon=2.0, delta=DELTA, optimizer=optimizer,
                                                      asserted_training_records=reason)
    path = str(tmp_path / "m.keras")
    model.save(path)
    if how == "load":
        loaded = tf.keras.models.load_model(path)
    else:
        loaded = tf.keras.models.load_model(path, compile=False)
        loaded.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                       loss=LOSS)
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 1), fit.privacy.dp_event]))
    twice = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 1), fit.privacy.dp_event,
                                                       fit.privacy.dp_event]))
    assert twice > truth * 1.05
    written = len(_ledger().backend.releases())
    loaded.optimizer.record_release(fit, asserted_training_records=reason)   # held already: not again
    assert len(_ledger().backend.releases()) == written
    assert len(loaded.optimizer.privacy_statement()["releases"]) == 1
    tfdpbnn.export_saved_model(loaded, str(tmp_path / "exported"), calibration=fit)
    with open(os.path.join(str(tmp_path / "exported"), "assets", "privacy.json")) as fh:
        epsilon = json.load(fh)["epsilon"]
    assert epsilon >= truth * (1 - 1e-6) and epsilon == pytest.approx(truth, rel=0.01)
    charged = _ledger().max_epsilon(records.content_keys(x, y), DELTA)
    assert charged >= truth * (1 - 1e-6) and charged == pytest.approx(truth, rel=0.01)


def test_a_calibration_asserted_on_the_training_records_is_charged_to_them_and_listed():
    x, y = small_data()
    model, optimizer = _fit(x, y, epochs=1)
    probs = tf.nn.softmax(model(x)).numpy()
    reason = "the temperature is fit on the training split itself"
    private = {"epsilon": 4.0, "delta": DELTA, "optimizer": optimizer}
    for bad, message in (({"asserted_training_records": "  "}, "a non-empty reason"),
                         ({"asserted_training_records": reason, "x": x, "y": y}, "not both"),
                         ({"asserted_training_records": reason, "composition": "parallel"},
                          "composition='sequential'")):
        with pytest.raises(ValueError, match=f"asserted_training_records: .*{message}"):
            tfdpbnn.uncertainty.fit_temperature_private(probs, y, **private, **bad)
    with pytest.raises(ValueError, match="asserted_training_records: says how the release is recorded"):
        tfdpbnn.uncertainty.fit_temperature_private(probs, y, epsilon=4.0, delta=DELTA,
                                                    asserted_training_records=reason)
    fit = tfdpbnn.uncertainty.fit_temperature_private(probs, y, **private, asserted_training_records=reason)
    statement = optimizer.privacy_statement()
    listed = [a for a in statement["asserted_by_user"] if "asserted_training_records" in a]
    assert listed == [f"release 0 (TemperatureScaling, sequential composition): it read only records this "
                      f"optimizer's training used, so it is charged to those records "
                      f"(asserted_training_records): {reason}"]
    assert statement["releases"][0]["asserted_training_records"] == reason
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 1), fit.privacy.dp_event]))
    charged = _ledger().max_epsilon(records.content_keys(x, y), DELTA)
    assert charged >= truth * (1 - 1e-6) and charged == pytest.approx(truth, rel=0.01)
    # The assertion travels with the optimizer's config (every model.save format).
    restored = type(optimizer).from_config(optimizer.get_config())
    assert [a.split(" composition): ")[1] for a in restored.privacy_statement()["asserted_by_user"]] == [
        a.split(" composition): ")[1] for a in listed]
    # An optimizer whose training the ledger does not hold: the release would be charged to no record.
    fresh = small_model(seed=5)
    unused = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    fresh.compile(optimizer=unused, loss=LOSS)
    with pytest.raises(ValueError, match="asserted_training_records: the per-record ledger holds no record"):
        tfdpbnn.uncertainty.fit_temperature_private(probs, y, epsilon=4.0, delta=DELTA, optimizer=unused,
                                                    asserted_training_records=reason)


def test_a_release_calibrated_under_another_adjacency_is_refused_and_the_optimizers_is_used():
    # A temperature calibrated under add/remove (sensitivity clip) was composed into a replace-one
    # optimizer's statement and ledger as it was: under replace-one the sum's sensitivity is 2 clip, so its
    # noise multiplier there is half, and the printed epsilon understated it.
    x, y = small_data()
    x_cal, y_cal = small_data(n=16, seed=7)
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                 neighboring="replace_one")
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    probs = tf.nn.softmax(model(x_cal)).numpy()
    elsewhere = tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, steps=4)
    assert elsewhere.privacy.neighboring == "add_or_remove"
    with pytest.raises(ValueError, match="neighboring: the release's noise was calibrated to the sensitivity "
                                         "under 'add_or_remove'"):
        opt.record_release(elsewhere, x=x_cal, y=y_cal)
    with pytest.raises(ValueError, match="neighboring="):
        tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, steps=4,
                                                    neighboring="add_or_remove", optimizer=opt)
    assert opt.privacy_statement().get("releases") is None
    # Given the optimizer, the fit takes its relation: half the noise multiplier per unit of sensitivity.
    fit = tfdpbnn.uncertainty.fit_temperature_private(probs, y_cal, epsilon=1.0, delta=DELTA, steps=4,
                                                      optimizer=opt, x=x_cal, y=y_cal)
    sigma = fit.privacy.noise_multiplier
    assert fit.privacy.neighboring == "replace_one"
    assert fit.privacy.dp_event == _gaussians(sigma / 2.0, 4)
    replace_one = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    truth = replace_one.compose(_gaussians(sigma / 2.0, 4)).get_epsilon(DELTA)
    assert truth == pytest.approx(1.0, rel=0.05)  # the calibration meets its epsilon under replace-one
    got = _ledger().max_epsilon(records.content_keys(x_cal, y_cal), DELTA)
    assert got == pytest.approx(truth, rel=0.01)


def test_a_release_without_its_data_counts_for_records_the_model_trains_on_after_it():
    # A release asserted to have read the training records is written against the records the model had
    # trained on. The ledger bound left it out of every record's composition ("in their histories
    # already"): records the model trained on afterwards, with more history of their own, lost it (5 passes
    # printed where 5 passes and the calibration held for them).
    x, y = small_data()
    a, b = slice(0, N // 2), slice(N // 2, N)
    _fit(x[b], y[b], epochs=3, seed=1)  # another model: three passes over B
    model, opt = _fit(x[a], y[a], epochs=1)  # this model: one pass over A
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(2.0, 5), epsilon=0.0, delta=DELTA)
    opt.record_release(type("Release", (), {"privacy": cost})(), "sequential",
                       asserted_training_records="fit on the records of A")  # its data not named
    model.fit(x[b], y[b], batch_size=8, epochs=1, verbose=0)  # then one pass over B
    bound = opt.privacy_statement()["ledger_bound"]
    assert bound["records"] == N
    # A record of B: the other model's three passes, this model's two phases (every phase of the model
    # composes for each of its records), and the calibration, whose records are not known to exclude it.
    truth_b = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 5), _gaussians(2.0, 5)]))
    assert bound["epsilon"] >= truth_b * (1 - 1e-6)
    assert bound["epsilon"] == pytest.approx(truth_b, rel=0.01)
    # A record of A holds the calibration in its own history (one pass and it), so its composition in the
    # bound (two passes and the calibration) is below B's: the calibration is not composed twice there.
    assert _ledger().max_epsilon(records.content_keys(x[a], y[a]), DELTA) == pytest.approx(
        rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 1), _gaussians(2.0, 5)])), rel=0.01)


def test_a_release_in_a_records_history_counts_once_in_the_ledger_bound():
    # DP preprocessing written with its records (labels=) was composed twice for them: from their history
    # and again as one of the model's other releases; so was a calibration named by the training rows.
    x, y = small_data()
    layer = tf.keras.layers.Normalization()
    adapt = tfdpbnn.preprocessing.private_adapt_normalization(layer, x, epsilon=1.0, delta=DELTA,
                                                              bounds=(-3.0, 3.0), labels=y, seed=0)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((x.shape[1],)), layer, tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # The adapt's noise is seeded (replayable: no guarantee); the bound it would have with secret noise is
    # what composes.
    def bound(optimizer):
        return optimizer.privacy_statement()["ledger_bound"]["epsilon_if_noise_were_secret"]

    expected = rdp_epsilon(dp_accounting.ComposedDpEvent([adapt.event(), _gaussians(1.0, 1)]))
    assert bound(opt) == pytest.approx(expected, rel=0.01)
    assert opt.privacy_statement()["epsilon_if_noise_were_secret"] == pytest.approx(expected, rel=0.01)
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(2.0, 5), epsilon=0.0, delta=DELTA)
    opt.record_release(type("Release", (), {"privacy": cost})(), "sequential", x=x, y=y)
    with_calibration = rdp_epsilon(dp_accounting.ComposedDpEvent([adapt.event(), _gaussians(1.0, 1),
                                                                  _gaussians(2.0, 5)]))
    assert bound(opt) == pytest.approx(with_calibration, rel=0.01)
    # A new optimizer of the saved one keeps the releases' tokens: still once.
    assert bound(type(opt).from_config(opt.get_config())) == pytest.approx(with_calibration, rel=0.01)


def test_dp_preprocessing_is_written_against_its_records():
    x, y = small_data()
    layer = tf.keras.layers.Normalization()
    record = tfdpbnn.preprocessing.private_adapt_normalization(layer, x, epsilon=1.0, delta=DELTA,
                                                               bounds=(-3.0, 3.0), labels=y, seed=0)
    ids = np.arange(N)
    _, binned = tfdpbnn.preprocessing.private_discretization(x[:, 0], num_bins=4, epsilon=1.0, delta=DELTA,
                                                             bounds=(-3.0, 3.0), seed=0, record_ids=ids)
    ledger = _ledger()
    assert [r.kind for r in ledger.backend.releases()] == ["preprocessing", "preprocessing"]
    assert ledger.max_epsilon(records.content_keys(x, y), DELTA) == pytest.approx(rdp_epsilon(record.event()),
                                                                                  rel=0.01)
    assert ledger.max_epsilon(records.id_keys(ids), DELTA) == pytest.approx(rdp_epsilon(binned.event()),
                                                                            rel=0.01)
    with pytest.raises(ValueError, match="record_ids: 3 ids for 64 values"):
        tfdpbnn.preprocessing.private_discretization(x[:, 0], num_bins=4, epsilon=1.0, delta=DELTA,
                                                     bounds=(-3.0, 3.0), record_ids=[1, 2, 3])


def test_discretization_named_by_ids_alone_reaches_rows_trained_by_content():
    # private_discretization(record_ids=ids) names its records by ids alone (one column is no record's
    # content). Training on the same rows by content met it in no history: a model without the layer trained
    # on them next quoted 7.08 where the release and two passes hold 7.52. The run of the model holding the
    # layer writes the release against its records that lack it; a run naming the same ids writes nothing.
    x, y = small_data()

    def discretized(ids):
        return tfdpbnn.preprocessing.private_discretization(x[:, 0], num_bins=4, epsilon=2.0, delta=DELTA,
                                                            bounds=(-3.0, 3.0), record_ids=ids)

    def holding(disc):
        inputs = tf.keras.Input((x.shape[1],))
        binned = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(4, 2)(disc(inputs[:, :1])))
        joined = tf.keras.layers.Concatenate()([inputs, binned])
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(3)(joined))
        opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
        model.compile(optimizer=opt, loss=LOSS)
        return model, opt

    def quote(opt):
        return opt.privacy_statement()["quote"]["epsilon"]

    disc, binned = discretized(np.arange(N))
    truth = {passes: rdp_epsilon(dp_accounting.ComposedDpEvent([binned.event(), _gaussians(1.0, passes)]))
             for passes in (1, 2)}
    model, opt = holding(disc)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert quote(opt) == pytest.approx(truth[1], rel=1e-3)
    ledger = _ledger()
    assert ledger.max_epsilon(records.content_keys(x, y), DELTA) == pytest.approx(truth[1], rel=1e-3)
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert quote(opt) >= truth[2] * (1 - 1e-3)
    # Trained by the same ids with their rows (other ids, other rows): the records hold the release already,
    # and it is written no second time.
    ids = np.arange(N, 2 * N)
    x = x + 10.0
    disc, _ = discretized(ids)
    model, opt = holding(disc)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, record_ids=ids)
    assert ledger.max_epsilon(records.id_keys(ids), DELTA) == pytest.approx(truth[1], rel=1e-3)
    assert len([r for r in ledger.backend.releases() if r.kind == "preprocessing"]) == 3


def test_dp_preprocessing_over_the_budget_is_refused_before_it_releases():
    # The release used to be written to the ledger after the layer was set: over a per-record budget the
    # adapt raised with the noisy statistics already in the layer and nothing in the ledger.
    from tfdpbnn.record import attributes

    x, y = small_data()
    ledger = _ledger()
    ledger.set_budget(0.5, DELTA, "rdp")
    layer = tf.keras.layers.Normalization()
    with pytest.raises(record_ledger.BudgetExceededError, match="64 of these 64 records"):
        tfdpbnn.preprocessing.private_adapt_normalization(layer, x, epsilon=1.0, delta=DELTA,
                                                          bounds=(-3.0, 3.0), labels=y)
    assert attributes.preprocessing_record(layer) is None
    np.testing.assert_array_equal(np.asarray(layer.adapt_mean), np.zeros(x.shape[1]))  # the initial state
    with pytest.raises(record_ledger.BudgetExceededError, match="64 of these 64 records"):
        tfdpbnn.preprocessing.private_discretization(x[:, 0], num_bins=4, epsilon=1.0, delta=DELTA,
                                                     bounds=(-3.0, 3.0), record_ids=np.arange(N))
    assert ledger.backend.releases() == []
    # Within the budget the release is written; one whose noise was drawn counts even when it then fails.
    ledger.set_budget(10.0, DELTA, "rdp")
    tfdpbnn.preprocessing.private_adapt_normalization(layer, x, epsilon=1.0, delta=DELTA, bounds=(-3.0, 3.0),
                                                      labels=y)
    with pytest.raises(ValueError, match="the noisy count came out"):
        for seed in range(20):  # a seed whose noisy count of one example falls below 1
            tfdpbnn.preprocessing.private_adapt_normalization(
                tf.keras.layers.Normalization(), x[:1] + 1.0, epsilon=0.1, delta=DELTA, bounds=(-3.0, 3.0),
                labels=y[:1], seed=seed)
    failed = [r for r in ledger.backend.releases() if r.kind == "preprocessing"][-1]
    assert failed.committed and failed.event() == dp_accounting.GaussianDpEvent(
        tfdpbnn.preprocessing.calibrate_gaussian(0.1, DELTA, "rdp", "add_or_remove"))


def test_store_and_ledger_refuse_an_empty_path_and_make_the_directory(tmp_path):
    from tfdpbnn.record import store

    for make, what in ((store.RunStore, "privacy record store"),
                       (record_ledger.RecordLedger, "record ledger")):
        with pytest.raises(ValueError, match=f"path: the {what} needs a file path"):
            make("")
        path = tmp_path / what.replace(" ", "_") / "deeper" / "file.sqlite"
        make(path)  # a pathlib path; its directories are made
        assert path.exists()


def test_a_parallel_release_named_by_ids_without_its_rows_is_refused():
    # Training named the rows by content; a "parallel" calibration on the same rows named by ids alone was
    # reported "checked" disjoint (its id keys are not the training's content keys): 7.08 printed where
    # 7.98 holds (two passes and the calibration, sequentially).
    x, y = small_data()
    _, optimizer = _fit(x, y, epochs=2)
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(4.0, 8), epsilon=0.0, delta=DELTA)
    release = type("Release", (), {"privacy": cost})()
    releases = len(_ledger().backend.releases())
    with pytest.raises(ValueError, match="cannot be checked on record_ids given without the release's rows"):
        optimizer.record_release(release, "parallel", record_ids=np.arange(N))
    assert len(_ledger().backend.releases()) == releases
    assert optimizer.privacy_statement()["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 2), rel=0.01)
    # Sequentially, the same ids alone were accepted: the run's statement composed the release, but the
    # ledger held it under ids no training had named, so a later run on the same rows by content quoted 7.08
    # where 8.54 holds (two passes and the calibration). Ids the ledger has never seen are refused.
    with pytest.raises(ValueError, match="record_ids: 64 of the release's 64 records are named by ids"):
        optimizer.record_release(release, "sequential", record_ids=np.arange(N))
    assert len(_ledger().backend.releases()) == releases
    optimizer.record_release(release, "sequential", x=x, y=y)   # named by its rows: composed in full
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 2), _gaussians(4.0, 8)]))
    assert optimizer.privacy_statement()["epsilon"] == pytest.approx(truth, rel=0.01)
    _, later = _fit(x, y, epochs=1, seed=1)
    assert later.privacy_statement()["ledger_bound"]["epsilon"] >= rdp_epsilon(
        dp_accounting.ComposedDpEvent([_gaussians(1.0, 3), _gaussians(4.0, 8)])) * 0.99


@pytest.mark.parametrize("continued_by", ["the same optimizer", "its from_config copy"])
def test_a_parallel_release_stops_being_parallel_once_its_optimizer_trains_on_its_records(continued_by):
    # One pass on A, a "parallel" calibration on B checked disjoint, then the same optimizer's pass on B:
    # the run's epsilon stayed the larger part (7.08 with a calibration of 7.08 alone) where B's records hold
    # a pass and the calibration (dp-accounting, sequential).
    x, y = small_data()
    a, b = slice(0, N // 2), slice(N // 2, N)
    model, optimizer = _fit(x[a], y[a], epochs=1)
    cost = PrivacyCost(mechanism="temperature", dp_event=_gaussians(1.0, 2), epsilon=0.0, delta=DELTA)
    release = type("Release", (), {"privacy": cost})()
    optimizer.record_release(release, "parallel", x=x[b], y=y[b])
    alone = rdp_epsilon(_gaussians(1.0, 2))
    assert optimizer.privacy_statement()["epsilon"] == pytest.approx(alone, rel=0.01)  # the larger part
    if continued_by != "the same optimizer":  # its keys not held: found in the ledger by its token
        optimizer = type(optimizer).from_config(optimizer.get_config())
        model.compile(optimizer=optimizer, loss=LOSS)
    model.fit(x[b], y[b], batch_size=8, epochs=1, verbose=0)
    statement = optimizer.privacy_statement()
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 2), _gaussians(1.0, 2)]))
    assert statement["run_epsilon"] >= truth * 0.99
    assert all(r["composition"] == "sequential" for r in statement["releases"])
    assert statement["releases"][0]["disjoint_from_training"].startswith("no longer disjoint")


# ------------------------------------------------------------ batches drawn from a user's secret_seed
SECRET, Q = 123456789, 0.125


def _poisson_fit(batches, epochs, seed=0, model=None):
    """A DP-SGD fit (sigma 1, q 1/8) on ``batches``; returns (model, optimizer)."""
    if model is None:
        model = small_model(seed=seed)
        model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                                       sampling="poisson"), loss=LOSS)
    model.fit(batches, epochs=epochs, verbose=0)
    return model, model.optimizer


def _rows(dataset):
    return [tuple(np.asarray(batch[0])[:, 0].round(6)) for batch in dataset]


def test_a_second_dataset_from_one_secret_seed_on_the_same_records_is_refused_before_a_step():
    # Every dataset made from one secret_seed draws the same batches: a second run on the same records drew
    # the first run's batches, and the ledger composed the two as independent (7.10 quoted for two runs of
    # 24 steps where 10.78 holds, each step of the pair one sampled Gaussian at sigma / sqrt(2)).
    x, y = small_data()
    assert _rows(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET)) == _rows(
        tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET))
    first = tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET)
    _poisson_fit(first, epochs=3)
    (release,) = _ledger().backend.releases()
    digest = tfdpbnn.data.poisson.secret_seed_digest(SECRET)
    assert release.samplers == ((digest, tfdpbnn.data.sampling.find_spec(first).stream),)
    assert str(SECRET) not in release.description and len(digest) == 32   # a digest, never the key
    model = small_model(seed=1)
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                                   sampling="poisson"), loss=LOSS)
    weights = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=r"secret_seed: 64 of these 64 records .*same secret_seed.*Nothing "
                                         r"was run or written.*secret_seed=None"):
        model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET), epochs=3, verbose=0)
    assert model.optimizer.steps == 0
    for before, after in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)
    assert [r.release_id for r in _ledger().backend.releases()] == [release.release_id]   # nothing written
    # Some of the records under the same key: refused too; other records under it are others' batches.
    with pytest.raises(ValueError, match=r"secret_seed: 32 of these 32 records"):
        _poisson_fit(tfdpbnn.data.poisson_batches(x[:32], y[:32], sample_rate=Q, secret_seed=SECRET), 1,
                     model=_compiled_on(32))
    other_x, other_y = small_data(seed=5)
    _poisson_fit(tfdpbnn.data.poisson_batches(other_x, other_y, sample_rate=Q, secret_seed=SECRET), 1)


def _compiled_on(n):
    model = small_model(seed=2)
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=n, batch_size=int(n * Q),
                                                   delta=DELTA, sampling="poisson"), loss=LOSS)
    return model


def test_the_same_dataset_object_trained_again_draws_fresh_batches_and_composes_as_independent_runs():
    x, y = small_data()
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET)
    assert _rows(batches) != _rows(batches)   # each iteration goes on with the object's stream of draws
    model, first = _poisson_fit(batches, epochs=2)          # 16 steps
    _poisson_fit(batches, epochs=1, model=model)            # the same optimizer again: 8 more
    _, second = _poisson_fit(batches, epochs=1, seed=1)     # another model on the same object: 8 more
    truth = rdp_epsilon(_poisson(Q, 1.0, 32))   # 32 independent Poisson-sampled Gaussians (dp-accounting)
    bound = second.privacy_statement()["ledger_bound"]
    assert bound["epsilon"] == pytest.approx(truth, rel=0.01) and bound["records"] == N
    assert first.privacy_statement()["ledger_bound"]["epsilon"] == pytest.approx(truth, rel=0.01)
    stream = tfdpbnn.data.sampling.find_spec(batches).stream
    assert {s for r in _ledger().backend.releases() for _, s in r.samplers} == {stream}
    with pytest.raises(ValueError, match="secret_seed"):   # a new object from the key: its first batches
        _poisson_fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET), 1, seed=2)


def test_other_secret_seeds_on_the_same_records_are_independent_runs():
    x, y = small_data()
    for offset in range(3):
        _, optimizer = _poisson_fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q,
                                                                 secret_seed=SECRET + offset), 1, seed=offset)
    assert optimizer.privacy_statement()["ledger_bound"]["epsilon"] == pytest.approx(
        rdp_epsilon(_poisson(Q, 1.0, 24)), rel=0.01)
    digests = [r.samplers[0][0] for r in _ledger().backend.releases()]
    assert digests == [tfdpbnn.data.poisson.secret_seed_digest(SECRET + k) for k in range(3)]
    assert len(set(digests)) == 3


def test_a_key_whose_phase_another_key_extended_is_still_refused():
    # One optimizer fits batches from key K, then from key K2: the phase's second version (16 steps)
    # supersedes the first in the records' histories, and still holds K's batches.
    x, y = small_data()
    model, _ = _poisson_fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET), 1)
    _poisson_fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET + 1), 1, model=model)
    first, second = _ledger().backend.releases()
    assert first.phase_id == second.phase_id   # one phase, extended
    with pytest.raises(ValueError, match="secret_seed"):
        _poisson_fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET), 1, seed=1)


def test_replayable_noise_from_one_secret_seed_is_not_refused():
    # Replayable noise (debug_noise_seed) is a non-private release: nothing composed with it understates,
    # and two runs from one key and one noise seed are the same run, step for step, for comparisons.
    x, y = small_data()
    for _ in range(2):
        model = small_model()
        with pytest.warns(UserWarning, match="debug_noise_seed"):
            optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA,
                                               sampling="poisson", debug_noise_seed=3)
        model.compile(optimizer=optimizer, loss=LOSS)
        model.fit(tfdpbnn.data.poisson_batches(x, y, sample_rate=Q, secret_seed=SECRET), epochs=1, verbose=0)
    assert optimizer.steps == 8
    assert [r.samplers for r in _ledger().backend.releases()] == [(), ()]   # nothing to compare them with


# ----------------------------------------------------------------------------------------- custom loops
def _loop_model(n=N):
    model = small_model()
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=n, batch_size=8, delta=DELTA)
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, optimizer


def _later_pass(x, y, **kwargs):
    """A new model's one shuffled pass over ``x`` (8 steps of 8): its statement."""
    model, optimizer = _loop_model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, **kwargs)
    return optimizer.privacy_statement()


def _loop_steps(model, optimizer, x, y, steps, start=0):
    for i in range(start, start + steps):
        b = i % (len(x) // 8)
        optimizer.dp_train_step(model, (tf.constant(x[b * 8:(b + 1) * 8]), tf.constant(y[b * 8:(b + 1) * 8])))


def test_a_custom_loop_is_in_a_later_models_ledger_bound():
    # 8 dp_train_step calls on x (each one Gaussian on every record: the loop picks its batches), then a new
    # model's fit on x, 1 pass (one Gaussian for each record). The fit quoted 4.73 (its own pass) while the
    # loop's steps were in no per-record ledger release; the loop was not settled before the fit started.
    x, y = small_data()
    model, optimizer = _loop_model()
    optimizer.begin_training(model, x, y, batch_size=8)
    keys = records.content_keys(x, y)
    assert _ledger().max_epsilon(keys, DELTA) == np.inf   # reserved before the first step, steps unknown
    _loop_steps(model, optimizer, x, y, 8)
    statement = _later_pass(x, y)
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 8), _gaussians(1.0, 1)]))
    assert statement["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 1), rel=1e-6)
    assert statement["quote"]["epsilon"] >= truth * (1 - 1e-9)
    assert statement["quote"]["epsilon"] == pytest.approx(truth, rel=1e-6)   # 17.80
    # The loop's own statement: its steps, the later pass on its records in its ledger bound, and the records
    # of begin_training's x asserted by name.
    own = optimizer.privacy_statement()
    assert own["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 8), rel=1e-6)
    assert own["ledger_bound"]["epsilon"] == pytest.approx(truth, rel=1e-6)
    assert any("begin_training" in a and "nothing checks" in a for a in own["asserted_by_user"])


def test_a_custom_loop_read_between_steps_counts_each_segment_once():
    # A traced minimize loop named by record_ids: 3 steps, statement, 5 more steps, statement, then a new
    # model's pass on the same ids. Each read commits what the loop spent and reserves its further steps.
    x, y = small_data()
    ids = np.arange(N)
    model, optimizer = _loop_model()
    optimizer.begin_training(model, x, y, batch_size=8, record_ids=ids,
                             assert_per_example_loss="per-example cross-entropy")
    per_example = LOSS.__class__(from_logits=True, reduction="none")

    @tf.function
    def step(xb, yb):
        optimizer.minimize(lambda: per_example(yb, model(xb, training=True)), model.trainable_variables)
    for i in range(3):
        step(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])
    first = optimizer.privacy_statement()
    assert first["ledger_bound"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 3), rel=1e-6)
    assert optimizer.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=1e-6)
    for i in range(3, 8):
        step(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8])
    second = optimizer.privacy_statement()
    assert second["ledger_bound"]["epsilon"] == pytest.approx(gaussians_epsilon(1.0, 8), rel=1e-6)
    later = _later_pass(x, y, record_ids=ids)
    truth = rdp_epsilon(dp_accounting.ComposedDpEvent([_gaussians(1.0, 8), _gaussians(1.0, 1)]))
    assert later["quote"]["epsilon"] >= truth * (1 - 1e-9)
    assert later["quote"]["epsilon"] == pytest.approx(truth, rel=1e-6)   # not 3 + 8 + 1
    with pytest.raises(ValueError, match="record_ids"):
        optimizer.begin_training(model, x, y, batch_size=8, record_ids=ids[:10])


def test_a_custom_loop_ended_by_its_optimizers_next_run_or_the_process_exit(tmp_path):
    # The loop's phase ends at the optimizer's next run (here train_on_batch on 8 rows): its final commit.
    x, y = small_data()
    model, optimizer = _loop_model()
    optimizer.begin_training(model, x, y, batch_size=8)
    _loop_steps(model, optimizer, x, y, 4)
    model.train_on_batch(x[:8], y[:8])
    keys = records.content_keys(x, y)
    assert _ledger().max_epsilon(keys[8:], DELTA) == pytest.approx(gaussians_epsilon(1.0, 4), rel=1e-6)
    assert _ledger().max_epsilon(keys[:8], DELTA) == pytest.approx(gaussians_epsilon(1.0, 5), rel=1e-6)
    # A process that ends with its loop open, its statement never read: committed at exit (atexit).
    script = tmp_path / "loop.py"
    script.write_text(
        "import sys\nsys.path.insert(0, 'tests')\nimport tensorflow as tf\n"
        "from _small_runs import DELTA, LOSS, N, small_data, small_model\nimport tfdpbnn\n"
        "x, y = small_data(seed=1)\nmodel = small_model()\n"
        "opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)\n"
        "model.compile(optimizer=opt, loss=LOSS)\nopt.begin_training(model, x, y, batch_size=8)\n"
        "for i in range(6):\n    opt.dp_train_step(model, (tf.constant(x[:8]), tf.constant(y[:8])))\n"
        "print('{}')\n")
    from _fresh_process import run_script

    run_script(str(script))
    x1, y1 = small_data(seed=1)
    assert _ledger().max_epsilon(records.content_keys(x1, y1), DELTA) == pytest.approx(
        gaussians_epsilon(1.0, 6), rel=1e-6)


def test_a_per_record_budget_refuses_a_custom_loop_before_its_first_step():
    x, y = small_data()
    _ledger().set_budget(epsilon=50.0, delta=DELTA)
    model, optimizer = _loop_model()
    with pytest.raises(ValueError, match="begin_training: the record ledger has a per-record privacy budget.*"
                                         "custom loop's number of steps is unknown"):
        optimizer.begin_training(model, x, y, batch_size=8)
    assert optimizer.steps == 0
    assert _ledger().backend.releases() == []
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)   # a fit of known steps is checked and admitted
    assert _ledger().max_epsilon(records.content_keys(x, y), DELTA) == pytest.approx(
        gaussians_epsilon(1.0, 1), rel=1e-6)
