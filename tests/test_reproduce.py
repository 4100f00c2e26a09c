"""Tests of ``experiments`` and ``tfdpbnn reproduce``: the runner's record, and each experiment once in
its smoke configuration (tiny, seconds), checking properties of what it writes."""

import csv
import importlib.util
import json
import math
import os

import numpy as np
import pytest

from experiments import available_experiments, run_experiment
from experiments.runner import Run, mean_std

# The Keras 3 set (Python >= 3.12) installs the test extra without tensorflow-datasets (setup.cfg).
needs_tfds = pytest.mark.skipif(importlib.util.find_spec("tensorflow_datasets") is None,
                                reason="tensorflow-datasets (the tfds extra) is not installed: the Keras 3 "
                                       "set's test extra leaves it out")

# Not in the fast tier (./scripts/test --fast): each experiment of experiments/ once, end to end.
pytestmark = pytest.mark.slow


def _read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_mean_std_closed_form():
    assert mean_std([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, math.sqrt(5.0 / 3.0)))
    assert mean_std([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError, match="values"):
        mean_std([])


def test_run_record_and_csv(tmp_path):
    lines = []
    run = Run("unit", str(tmp_path / "r"), {"a": 1, "b": np.float32(0.5)}, seeds=[3, 4], log=lines.append)
    run.write_csv("t.csv", [{"x": 1, "y": 2.5}, {"x": 2, "z": "q"}])
    eps = run.privacy("cfg", noise_multiplier=10.7, sample_rate=100 / 1437, steps=1500, delta=1e-5)
    run.note("chosen", {"lr": 0.1})
    record = run.finish()
    on_disk = json.loads((tmp_path / "r" / "run.json").read_text())
    assert on_disk["experiment"] == "unit" and on_disk["seeds"] == [3, 4]
    assert on_disk["settings"] == {"a": 1, "b": 0.5} and on_disk["chosen"] == {"lr": 0.1}
    assert on_disk["outputs"] == ["t.csv"] and record["wall_time_s"] >= 0
    from importlib.metadata import version
    for mod, dist in (("dp_accounting", "dp-accounting"), ("tensorflow_privacy", "tensorflow-privacy")):
        if mod == "tensorflow_privacy" and importlib.util.find_spec(mod) is None:   # the Keras 3 set
            assert on_disk["versions"][mod] == "not importable"
            continue
        assert on_disk["versions"][mod] == version(dist)   # the installed versions, never "?"
    assert on_disk["privacy"][0]["sampling"] == "poisson" and on_disk["privacy"][0]["steps"] == 1500
    rows = _read_csv(tmp_path / "r" / "t.csv")
    assert [list(r) for r in rows][0] == ["x", "y", "z"] and rows[1]["z"] == "q" and rows[0]["z"] == ""
    # Reference point: sigma 10.7 at q = 100/1437 for ~100 epochs is epsilon ~1 under RDP.
    assert 0.8 < eps["rdp"] < 1.2
    # PLD is the tightest sound accountant: every other sound one is at least as large (1% slack).
    for name, value in eps.items():
        if not name.endswith("_error") and math.isfinite(value):
            assert value >= eps["pld"] * 0.99, name
    assert lines and lines[-1].startswith("[unit")


def test_unknown_experiment_and_bad_seeds(tmp_path):
    with pytest.raises(ValueError, match="name"):
        run_experiment("no-such-table", str(tmp_path))
    with pytest.raises(ValueError, match="seeds"):
        run_experiment("sigma-curve", str(tmp_path), seeds=0)
    with pytest.raises(ValueError, match="name"):
        Run("", str(tmp_path), {})


def test_cli_lists_and_parses_experiments():
    from experiments.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["sigma-curve", "--out", "x", "--seeds", "3", "--smoke"])
    assert (args.name, args.out, args.seeds, args.smoke) == ("sigma-curve", "x", 3, True)
    with pytest.raises(SystemExit):
        parser.parse_args(["not-an-experiment"])
    assert {"sigma-curve", "digits-table", "sidp-tables"} <= set(available_experiments())


def test_tfdpbnn_reproduce_forwards_to_the_checkout_or_says_it_needs_one(tmp_path, monkeypatch, capsys):
    """``tfdpbnn reproduce`` hands its arguments to the checkout's experiments/ parser; with no checkout
    beside the package or in the current directory it exits 2 with an error naming experiments/."""
    from tfdpbnn.cli import command_module, main

    reproduce = command_module("reproduce")   # the copy the command runs (loaded by path, tfdpbnn.cli)

    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "not-an-experiment"])
    assert exc.value.code == 2 and "invalid choice: 'not-an-experiment'" in capsys.readouterr().err
    monkeypatch.setattr(reproduce, "__file__", str(tmp_path / "site" / "tfdpbnn" / "commands" / "x.py"))
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "sigma-curve", "--smoke"]) == 2
    assert "experiments/ folder of the tfdpbnn source repository" in capsys.readouterr().err


def test_experiments_use_only_the_public_api():
    """No module of experiments/ imports a private tfdpbnn name or module, or reads a private attribute of
    anything but its own objects (``self``)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "experiments"
    files = sorted(root.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfdpbnn"):
                parts = node.module.split(".") + [alias.name for alias in node.names]
                assert not any(p.startswith("_") for p in parts), f"{path.name}:{node.lineno}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not (alias.name.startswith("tfdpbnn") and "._" in alias.name), path.name
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                own = isinstance(node.value, ast.Name) and node.value.id == "self"
                assert own or node.attr.startswith("__"), f"{path.name}:{node.lineno}: {node.attr}"


def test_sigma_curve_smoke(tmp_path, capsys):
    from tfdpbnn import privacy
    from tfdpbnn.cli import main

    out = tmp_path / "sigma"
    assert main(["reproduce", "sigma-curve", "--smoke", "--out", str(out)]) == 0
    assert "sigma-curve" in capsys.readouterr().out  # progress lines
    rows = _read_csv(out / "sigma_curve.csv")
    assert os.path.getsize(out / "sigma_curve.png") > 1000
    record = json.loads((out / "run.json").read_text())
    assert "sigma_curve.csv" in record["outputs"] and record["settings"]["sampling"] == "poisson"
    sig = {(r["curve"], float(r["epsilon"])): float(r["sigma"]) for r in rows}
    for eps in (1.0, 2.0):
        # Sound curves: RDP needs at least PLD's sigma; each calibrated sigma meets the budget (1%).
        assert sig[("rdp", eps)] >= sig[("pld", eps)] * 0.99
        q, steps = float(rows[0]["sample_rate"]), int(rows[0]["steps"])
        assert privacy.compute_epsilon(sig[("rdp", eps)], q, steps, 1e-5, accountant="rdp") <= eps * 1.01
        # The reading of the papers' zCDP procedure that matches their printed sigmas (J = epochs) asks for
        # less noise than the tightest sound accountant (docs/soundness.md, finding 2).
        assert sig[("paper-zcdp-epochs", eps)] < sig[("pld", eps)]
    # Less budget, more noise.
    assert sig[("rdp", 1.0)] > sig[("rdp", 2.0)]
    # Ermis & Cemgil (2017a) prints sigma 2.97 (its zCDP) for DIGITS at epsilon 1: below what PLD needs for
    # the same
    # Poisson-subsampled Gaussian, i.e. the paper's noise does not give epsilon 1 (docs/soundness.md, finding
    # 2).
    printed = [r for r in rows if r["curve"] == "paper-zcdp" and float(r["epsilon"]) == 1.0]
    assert float(printed[0]["paper_sigma"]) == 2.97 and sig[("pld", 1.0)] > 2.97


def test_validation_split_is_stratified_and_disjoint():
    from experiments.digits_table import _split_validation

    x = np.arange(500, dtype=float)[:, None]
    y = np.repeat(np.arange(10), 50)
    xa, ya, xv, yv = _split_validation(x, y)
    assert len(xv) == 100 and len(xa) == 400
    assert not set(xa[:, 0]) & set(xv[:, 0])
    assert np.all(np.bincount(yv, minlength=10) == 10)


def test_digits_ablation_smoke(tmp_path):
    out = tmp_path / "ablation"
    record = run_experiment("digits-ablation", str(out), smoke=True, log=None)
    rows = _read_csv(out / "ablation.csv")
    assert [r["change"] for r in rows] == ["+ 64 hidden units", "+ no hidden layer, lr 1"]
    assert rows[0]["hidden"] == "8" and rows[1]["hidden"] == "0" and rows[1]["center"] == "True"
    assert all(p["epsilon"]["rdp"] <= 1.01 for p in record["privacy"])
    with pytest.raises(ValueError, match="methods"):
        run_experiment("digits-ablation", str(out), smoke=True, log=None, methods=("nope",))


def test_dpbnn_table_smoke(tmp_path):
    out = tmp_path / "dpbnn"
    record = run_experiment("dpbnn-table", str(out), smoke=True, log=None)
    rows = _read_csv(out / "dpbnn_table.csv")
    assert {(r["method"], r["dp"]) for r in rows} == {
        ("sgld", "True"), ("bbp", "True"), ("mcdropout", "True"), ("sgd", "True"), ("sgd", "False")}
    for r in rows:
        assert int(r["steps_run"]) == int(r["steps"])
        assert 0.0 <= float(r["ece"]) <= float(r["mce"]) <= 1.0  # ECE is a weighted mean of the bin gaps
        if r["dp"] == "True":
            assert float(r["epsilon_rdp"]) <= 1.01
    assert int([r for r in rows if r["method"] == "sgld"][0]["posterior_samples"]) >= 1
    assert os.path.getsize(out / "reliability_sgld_gaussian_dp.png") > 1000
    assert len(record["privacy"]) == 4


def _run_on_mock_mnist(name, tmp_path, capsys):
    """``tfdpbnn reproduce NAME --smoke --data-dir`` on mocked TFDS MNIST (40 random images per split);
    returns the output directory and its run.json, after checking the command's progress output and the
    recorded data set."""
    import tensorflow_datasets as tfds

    from tfdpbnn.cli import main

    out = tmp_path / f"{name}-mnist"
    with tfds.testing.mock_data(num_examples=40):
        assert main(["reproduce", name, "--smoke", "--data-dir", str(tmp_path / "tfds"),
                     "--out", str(out)]) == 0
    assert name in capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    settings = record["settings"]
    assert settings["dataset"] == "mnist" and settings["data_dir"] == str(tmp_path / "tfds")
    return out, record


@needs_tfds
def test_dpbnn_table_mnist_smoke_on_mock_tfds(tmp_path, capsys):
    """The MNIST variant through the command line: --data-dir selects TFDS MNIST (mocked: 40 random images
    per split), inputs are flattened to 784, and what is written covers every method with sound epsilons."""
    from experiments.dpbnn_table import MNIST_SMOKE_SETTING

    out, record = _run_on_mock_mnist("dpbnn-table", tmp_path, capsys)
    settings = record["settings"]
    assert (settings["n_train"], settings["n_test"]) == (40, 40)
    assert tuple(settings["setting"]["hidden"]) == MNIST_SMOKE_SETTING["hidden"]
    rows = _read_csv(out / "dpbnn_table.csv")
    assert {(r["method"], r["dp"]) for r in rows} == {
        ("sgld", "True"), ("bbp", "True"), ("mcdropout", "True"), ("sgd", "True"), ("sgd", "False")}
    q = float(rows[0]["sample_rate"])
    assert q == pytest.approx(10 / 40)  # expected batch round(0.25 * 40) = 10: 4 steps per epoch, 1 epoch
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0
        assert 0.0 <= float(r["ece"]) <= float(r["mce"]) <= 1.0
        assert int(r["steps_run"]) == int(r["steps"]) == 4
        if r["dp"] == "True":
            assert float(r["sigma"]) > 0 and 0.0 < float(r["epsilon_rdp"]) <= 1.01
        else:
            assert float(r["sigma"]) == 0.0 and r["epsilon_rdp"] == "inf"
    # Every DP configuration is recorded with its epsilon by every sound accountant, within the budget.
    assert sorted(p["label"] for p in record["privacy"]) == [
        "bbp/gaussian", "mcdropout/gaussian", "sgd/gaussian", "sgld/gaussian"]
    for p in record["privacy"]:
        assert p["steps"] == 4 and p["sample_rate"] == pytest.approx(q)
        assert 0.0 < p["epsilon"]["pld"] <= p["epsilon"]["rdp"] * 1.01 and p["epsilon"]["rdp"] <= 1.01
    assert os.path.getsize(out / "reliability_sgd_gaussian_dp.png") > 1000


def test_heteroscedastic_smoke(tmp_path):
    from experiments.heteroscedastic import make_data

    x, y, xt, yt, ft = make_data(0, n_train=10, n_test=1200)
    assert x.shape == (10, 1) and yt.shape == (1200, 1) and ft.shape == (1200,)
    # Heteroscedastic noise: std 0.1 + 0.3 |x| (0.1-0.25 for |x| < 0.5, 0.85-1.0 for |x| > 2.5); seeded.
    resid, grid = np.ravel(yt) - ft, np.ravel(xt)
    assert 0.1 < resid[np.abs(grid) < 0.5].std() < 0.25 and 0.8 < resid[np.abs(grid) > 2.5].std() < 1.05
    out = tmp_path / "het"
    record = run_experiment("heteroscedastic", str(out), smoke=True, log=None)
    rows = _read_csv(out / "heteroscedastic.csv")
    assert {(r["method"], r["dp"]) for r in rows} == {(m, d) for m in ("sgld", "bbp", "mcdropout")
                                                      for d in ("True", "False")}
    for r in rows:
        assert int(r["steps_run"]) == 4 and float(r["mse"]) >= 0 and float(r["aleatoric_std"]) > 0
        if r["dp"] == "True":
            assert float(r["epsilon_rdp"]) <= 4.21 * 1.01
    assert os.path.getsize(out / "heteroscedastic.png") > 1000 and len(record["privacy"]) == 3


def test_digits_table_smoke(tmp_path):
    from experiments.digits_table import SMOKE_SETTING

    out = tmp_path / "digits"
    record = run_experiment("digits-table", str(out), smoke=True, log=None)
    rows = _read_csv(out / "digits_table.csv")
    methods = {r["method"] for r in rows}
    assert methods == {"dpvd", "dpd", "svi", "sgld", "dpsgd"}
    assert {r["config"] for r in rows} == {"tuned"}
    for r in rows:
        assert int(r["steps_run"]) == int(r["steps"])  # the optimizer ran exactly the accounted steps
        assert float(r["epsilon_rdp"]) <= float(r["epsilon_target"]) * 1.01  # the budget holds for what ran
        assert 0.0 <= float(r["accuracy"]) <= 1.0 and 0.0 <= float(r["accuracy_mc"]) <= 1.0
        # The reported accuracy is that of the chosen weights: the last iterate or the chosen average.
        key = "accuracy_last" if r["ema"] == "" else f"accuracy_ema{float(r['ema']):g}"
        assert float(r["accuracy"]) == float(r[key])
    # The tuning path ran at each epsilon for the first method (smoke): one candidate, every average.
    tuning = _read_csv(out / "tuning.csv")
    assert {(r["method"], float(r["epsilon"])) for r in tuning} == {("dpvd", 1.0), ("dpvd", 0.5)}
    # 20% of the 1437 training images, stratified by class; never the 360 test images.
    assert all(int(r["n_validation"]) + int(r["n_fit"]) == 1437 and 280 <= int(r["n_validation"]) <= 295
               for r in tuning)
    chosen = record["chosen_settings"]
    for eps in (1.0, 0.5):
        cands = [r for r in tuning if float(r["epsilon"]) == eps]
        best = max(cands, key=lambda r: float(r["val_accuracy"]))
        assert chosen[f"tuned/dpvd/eps={eps:g}"]["ema"] == (None if best["ema"] == "" else float(best["ema"]))
        assert {k: v for k, v in chosen[f"tuned/dpvd/eps={eps:g}"].items() if k != "ema"} == {
            k: v for k, v in SMOKE_SETTING.items() if k != "ema"}
        dpvd = [r for r in rows if r["method"] == "dpvd" and float(r["epsilon_target"]) == eps]
        assert len(dpvd) == 1
    assert len(record["privacy"]) == 6
    for p in record["privacy"]:
        assert p["sampling"] == "poisson" and p["epsilon"]["rdp"] <= 1.01
    summary = _read_csv(out / "digits_summary.csv")
    assert len(summary) == 6 and all(r["seeds"] == "1" for r in summary)


def test_sidp_tables_smoke(tmp_path):
    out = tmp_path / "sidp"
    record = run_experiment("sidp-tables", str(out), smoke=True, log=None, tables=("table1", "table4"),
                            norms=("ln",), methods=("sidp-ln", "sidp-paper-ln"))
    t1 = _read_csv(out / "table1.csv")
    assert {(r["kind"], r["norm"], r["epsilon_target"]) for r in t1} == {("nonprivate", "ln", "inf"),
                                                                         ("sidp", "ln", "1.0")}
    t4 = {r["method"]: r for r in _read_csv(out / "table4.csv")}
    assert set(t4) == {"sidp-ln", "sidp-paper-ln"}
    for r in t1 + list(t4.values()):
        assert int(r["steps_run"]) == int(r["steps"]) > 0
        for key in ("accuracy", "accuracy_mu", "accuracy_sample"):
            assert 0.0 <= float(r[key]) <= 1.0, key
    assert all(float(r["weight_noise"]) == 0.5 for r in t1)  # the fixed Table 1 level, not eta C z / B
    sound, paper = t4["sidp-ln"], t4["sidp-paper-ln"]
    # Same noise multiplier and steps: the sound mode's epsilon is the target (RDP, Poisson); paper mode's
    # real epsilon (GDP composition of the released samples, docs/soundness.md, finding 1) is larger than
    # that, while
    # the epsilon the paper would claim is the sound one.
    assert float(sound["sigma"]) == float(paper["sigma"]) > 0
    assert float(sound["epsilon"]) <= 0.5 * 1.01
    assert float(paper["epsilon_claimed"]) == float(sound["epsilon"])
    assert math.isfinite(float(paper["epsilon"])) and float(paper["epsilon"]) > float(sound["epsilon"])
    # s_T = eta C z / B for the Table 4 rows.
    b = float(sound["sample_rate"]) * 100
    assert float(sound["weight_noise"]) == pytest.approx(0.5 * 1.0 * float(sound["sigma"]) / b, rel=1e-4)
    labels = {p["label"]: p for p in record["privacy"]}
    assert labels["table1/eps=1/ln/s=0.5"]["epsilon"]["rdp"] <= 1.01
    stated = [p for p in record["privacy"] if "paper-ln" in p["label"]]
    assert len(stated) == 1 and stated[0]["epsilon"]["gdp_exact"] == pytest.approx(float(paper["epsilon"]))
    assert stated[0]["epsilon"]["gdp_exact"] > labels["table4/sidp-ln/eps=0.5"]["epsilon"]["pld"]
    summary = _read_csv(out / "table4_summary.csv")
    assert {r["paper_mnist"] for r in summary} == {"", "98.56"}  # Davody et al. 2020, Table 4
    assert os.path.getsize(out / "sidp_tables.png") > 1000
    assert {"table1.csv", "table1_summary.csv", "table4.csv", "table4_summary.csv",
            "sidp_tables.png"} <= set(record["outputs"])


@needs_tfds
@pytest.mark.parametrize("dataset, shape", [("mnist", [28, 28, 1]), ("cifar10", [32, 32, 3])])
def test_sidp_tables_tfds_path_on_mock_data(dataset, shape, tmp_path):
    import tensorflow_datasets as tfds

    out = tmp_path / dataset
    # One configuration each: mnist takes the costly path (public-statistics BN under DP: jacobian
    # clipping through the carried public batch); cifar10 plain DP-SGD on 3 channels.
    options = (dict(tables=("table1-bn-dp",), norms=("bn",)) if dataset == "mnist"
               else dict(tables=("table4",), methods=("dpsgd",)))
    with tfds.testing.mock_data(num_examples=64, data_dir=str(tmp_path / "tfds")):
        record = run_experiment("sidp-tables", str(out), smoke=True, log=None, dataset=dataset,
                                data_dir=str(tmp_path / "tfds"), **options)
    assert record["data"]["image_shape"] == shape and record["data"]["public_held_out"] == 30
    assert record["data"]["train_private"] == 34
    rows = _read_csv(out / ("table1.csv" if dataset == "mnist" else "table4.csv"))
    assert len(rows) == 1 and 0.0 <= float(rows[0]["accuracy"]) <= 1.0
    assert int(rows[0]["steps_run"]) == int(rows[0]["steps"]) > 0
    assert all(p["epsilon"]["rdp"] <= (1.01 if dataset == "mnist" else 0.505) for p in record["privacy"])


def test_sidp_tables_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="dataset"):
        run_experiment("sidp-tables", str(tmp_path), smoke=True, log=None, dataset="svhn")
    with pytest.raises(ValueError, match="data_dir"):
        run_experiment("sidp-tables", str(tmp_path), smoke=True, log=None, dataset="mnist")
    for bad in (dict(tables=("table2",)), dict(methods=("adam",)), dict(norms=("gn",)),
                dict(epsilons=(0.0,)), dict(noise_levels=(-1.0,)), dict(epochs=0), dict(colour="red")):
        with pytest.raises(ValueError, match=next(iter(bad))):
            run_experiment("sidp-tables", str(tmp_path), smoke=True, log=None, **bad)


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_sidp_tables_lenet5_shapes(shape):
    from experiments.sidp_tables import build_model

    x_pub = np.random.default_rng(0).random((30,) + shape).astype("float32")
    for norm, noisy in (("bn", True), ("ln", False), ("none", True)):
        model = build_model(shape, norm, noisy, x_pub, arch="lenet5", seed=0)
        assert model(x_pub[:3]).shape == (3, 10)  # the public rows are dropped before the logits


def test_sidp_paper_mode_noise_for_the_epsilon_that_holds():
    import warnings

    from experiments.sidp_tables import paper_mode_noise_multiplier
    from tfdpbnn import SIDPOptimizer

    for eps, steps in ((1.0, 150), (10.0, 40)):
        z = paper_mode_noise_multiplier(eps, steps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            opt = SIDPOptimizer(1.0, z, paper_mean_update=True, num_examples=1000, batch_size=100,
                                sampling="poisson", delta=1e-5, learning_rate=0.5)
        # The optimizer's own paper-mode epsilon (GDP composition of the releases) after `steps` steps.
        assert opt.epsilon_after(steps) == pytest.approx(eps, rel=1e-6)
        assert opt.epsilon_after(steps + 1) > eps


def test_digits_tuning_is_per_epsilon_on_validation_only(monkeypatch):
    """tune() trains on the 80% part and evaluates on the 20% validation part of the training set only;
    the chosen setting per (method, epsilon) is that epsilon's candidate with the best validation
    accuracy."""
    from experiments import digits_table as dt

    rng = np.random.default_rng(0)
    x_train = rng.normal(size=(200, 64)).astype(np.float32)
    y_train = np.repeat(np.arange(10), 20)
    calls = []

    def fake_train(method, setting, epsilon, xa, ya, xv, yv, seed):
        calls.append((method, epsilon, setting, xa, xv))
        assert setting in dt.tuning_candidates(epsilon, method)
        # A made-up validation accuracy: higher for larger learning rates at epsilon 10, lower at 0.1.
        lr = setting["learning_rate"] * (1 if epsilon > 1 else -1) + setting["sample_rate"]
        r = dict(sigma=1.0, steps=setting["epochs"], accuracy_last=0.5 + 0.01 * lr, accuracy_mc_last=0.0)
        for d in dt.EMA_DECAYS:
            r[f"accuracy_ema{d:g}"] = r[f"accuracy_mc_ema{d:g}"] = 0.0
        return r

    monkeypatch.setattr(dt, "train_and_evaluate", fake_train)
    rows = dt.tune(("dpsgd",), (10.0, 0.1), x_train, y_train, seeds=1)
    train_rows = {tuple(r) for r in x_train}
    for _method, _eps, _setting, xa, xv in calls:
        assert len(xv) == 40 and len(xa) == 160
        assert {tuple(r) for r in xv} <= train_rows and not {tuple(r) for r in xv} & {tuple(r) for r in xa}
    assert {c[1] for c in calls} == {10.0, 0.1}
    assert len(calls) == len(dt.tuning_candidates(10.0)) + len(dt.tuning_candidates(0.1))
    best = dt._best_of(rows)
    for eps in (10.0, 0.1):
        cands = dt.tuning_candidates(eps)
        score = [c["learning_rate"] * (1 if eps > 1 else -1) + c["sample_rate"] for c in cands]
        expected = cands[int(np.argmax(score))]
        assert best[("dpsgd", eps)] == expected and best[("dpsgd", eps)]["ema"] is None
    assert dt.tuning_candidates(10.0) != dt.tuning_candidates(0.1)
    assert dt.tuning_candidates(0.12) == dt.tuning_candidates(0.1)
    # A candidate runs the same number of steps on the tuning split (1150) as on the training set (1437).
    for c in dt.TUNING_GRID[0.1] + dt.TUNING_GRID[1.0]:
        assert dt.steps_for(c, 1150)[1] == dt.steps_for(c, 1437)[1]
    assert dt.steps_for(dt.paper_setting("dpsgd"), 1437)[1] == 1500  # B = 100: 15 steps per epoch
    # DPVD also tries smaller KL weights (its KL term pulls the means to 0 unclipped).
    extra = dt.tuning_candidates(1.0, "dpvd")[len(dt.tuning_candidates(1.0)):]
    assert [c["kl_weight"] for c in extra] == list(dt.DPVD_KL_WEIGHTS)


def test_digits_ema_is_the_moving_average_of_the_iterates():
    import tensorflow as tf

    from experiments.digits_table import _ema_callback

    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign([[0.0]])
    cb = _ema_callback((0.5,))
    cb.set_model(model)
    cb.on_train_begin()
    values = [1.0, 2.0, 3.0, 4.0]
    for k, v in enumerate(values):
        model.layers[0].kernel.assign([[v]])
        cb.on_train_batch_end(k)
    # d_t = min(0.5, t / (t + 1)): 0, 0.5, 0.5, 0.5 -> 1, 1.5, 2.25, 3.125.
    assert float(cb.averages[0.5][0].numpy().ravel()[0]) == pytest.approx(3.125)


def test_digits_kl_weight_scales_the_variational_layers_kl():
    from experiments.digits_table import Setting, build_model

    model = build_model("dpvd", Setting(hidden=4, kl_weight=0.1), 1437, seed=0)
    assert [(layer.num_examples, layer.kl_weight) for layer in model.layers] == [(1437, 0.1), (1437, 0.1)]
    with pytest.raises(ValueError, match="kl_weight"):
        build_model("dpsgd", Setting(hidden=4, kl_weight=0.1), 1437, seed=0)
    with pytest.raises(ValueError, match="ema"):
        Setting(ema=0.5)


@needs_tfds
def test_digits_table_mnist_smoke_on_mock_tfds(tmp_path, capsys):
    """The MNIST variant of digits-table through the command line: --data-dir selects TFDS MNIST (mocked:
    40 random images per split), inputs are flattened to 784, tuning uses a validation split of MNIST's
    training set, and what is written covers every method with sound epsilons and the papers' MNIST
    numbers."""
    from experiments.digits_table import PAPER_TABLE_MNIST

    out, record = _run_on_mock_mnist("digits-table", tmp_path, capsys)
    assert record["data"] == dict(dataset="mnist", train=40, test=40, features=784)
    rows = _read_csv(out / "digits_table.csv")
    assert sorted((r["method"], float(r["epsilon_target"])) for r in rows) == sorted(
        [("dpvd", 1.0), ("dpvd", 0.5), ("dpd", 1.0), ("svi", 1.0), ("sgld", 1.0), ("dpsgd", 1.0)])
    for r in rows:
        assert 0.0 <= float(r["accuracy"]) <= 1.0 and 0.0 <= float(r["accuracy_mc"]) <= 1.0
        assert int(r["steps_run"]) == int(r["steps"]) == 5  # expected batch round(0.2 * 40) = 8: 5 steps
        assert float(r["sigma"]) > 0
        eps = float(r["epsilon_rdp"])
        assert math.isfinite(eps) and 0.0 < eps <= float(r["epsilon_target"]) * 1.01
    # Tuning on a stratified split of the 40 mock training images only (dpvd, both epsilons).
    tuning = _read_csv(out / "tuning.csv")
    assert {(r["method"], float(r["epsilon"])) for r in tuning} == {("dpvd", 1.0), ("dpvd", 0.5)}
    assert all(int(r["n_fit"]) + int(r["n_validation"]) == 40 and 0 < int(r["n_validation"]) < 20
               for r in tuning)
    # Every configuration's privacy statement: finite sound epsilons within its budget.
    assert len(record["privacy"]) == 6
    for p in record["privacy"]:
        budget = float(p["label"].split("eps=")[1])
        assert p["sampling"] == "poisson" and p["steps"] == 5
        assert math.isfinite(p["epsilon"]["rdp"]) and 0.0 < p["epsilon"]["rdp"] <= budget * 1.01
        assert 0.0 < p["epsilon"]["pld"] <= p["epsilon"]["rdp"] * 1.01
    # The summary's paper column is the papers' MNIST table, not DIGITS's.
    summary = {(r["method"], float(r["epsilon"])): r for r in _read_csv(out / "digits_summary.csv")}
    assert len(summary) == 6
    assert float(summary[("dpvd", 1.0)]["paper"]) == PAPER_TABLE_MNIST[("dpvd", 1.0)] == 0.9327
    assert float(summary[("dpsgd", 1.0)]["paper"]) == 0.9305 and summary[("dpvd", 0.5)]["paper"] == ""


@needs_tfds
@pytest.mark.parametrize("name", ["dpbnn-table", "digits-table"])
def test_mnist_variant_without_data_is_a_clear_error(tmp_path, name):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"data_dir.*no prepared TFDS 'mnist'.*{name} never downloads"):
        run_experiment(name, str(tmp_path / "out"), smoke=True, data_dir=str(empty), log=None)
    assert not (tmp_path / "out" / "run.json").exists()
    with pytest.raises(ValueError, match="data_dir"):  # DIGITS is bundled: a data_dir would be ignored
        run_experiment(name, str(tmp_path / "out"), smoke=True, data_dir=str(empty), dataset="digits",
                       log=None)
    with pytest.raises(ValueError, match="dataset"):
        run_experiment(name, str(tmp_path / "out"), smoke=True, dataset="cifar10", log=None)


def test_digits_table_mnist_settings():
    """The papers' MNIST setting (Ermis & Cemgil 2017a/b sec. 5) for ``paper``; MNIST candidates for
    ``tuned``; 784
    inputs."""
    from experiments import digits_table as dt

    for method in dt.METHODS:
        s = dt.paper_setting(method, "mnist")
        assert (s["hidden"], s["batch_size"], s["epochs"], s["learning_rate"], s["lr_decay"]) == (
            1000, 600, 200, 0.1, True)
        assert s["clip"] == (3.0 if method in ("dpd", "sgld") else 2.0)
        assert dt.steps_for(s, 60000) == (100, 20000, 0.01)  # q 0.01, 200 epochs (2017a sec. 5)
    assert dt.paper_setting("dpd") == dt.Setting(hidden=500)  # DIGITS unchanged
    for eps in dt.EPSILONS:
        mnist = dt.tuning_candidates(eps, "dpsgd", "mnist")
        assert mnist and not set(map(str, mnist)) & set(map(str, dt.tuning_candidates(eps, "dpsgd")))
        assert all(c["sample_rate"] * 48000 >= 200 for c in mnist)  # batches of hundreds on the 80% split
    assert len(dt.tuning_candidates(1.0, "dpvd", "mnist")) == len(dt.MNIST_TUNING_GRID[1.0]) + len(
        dt.DPVD_KL_WEIGHTS)
    model = dt.build_model("dpd", dt.paper_setting("dpd", "mnist"), 60000, seed=0, input_dim=784)
    assert model.input_shape == (None, 784) and model.output_shape == (None, 10)


def test_run_progress_logs_position_and_time_left(tmp_path):
    lines = []
    run_ = Run("demo", str(tmp_path), {}, log=lines.append)
    assert list(run_.progress(["a", "b", "c"], "setting")) == ["a", "b", "c"]
    assert "setting 1/3" in lines[0]
    assert "setting 2/3, about" in lines[1] and "s left" in lines[1]
    assert "setting 3/3, about" in lines[2]
    assert "3/3 done in" in lines[3]
