"""Every script in ``examples/`` runs in its fast mode as a user would run it, and says true things.

Each script runs as a subprocess (``python examples/<name>.py --fast``, ``TFDPBNN_EXAMPLES_FAST=1``, in a
temporary working directory, the repository first on ``PYTHONPATH``) and ends its output with one line
``summary: {json}``. The tests check that summary: exit status 0; every epsilon finite, within the script's
budget and equal to an independent dp-accounting computation from the noise, sample rate and steps it
reports; the exported privacy record equal to the printed one; served probabilities that are distributions
agreeing with the exporting process; and a serving process that never imported tfdpbnn.

The six training scripts start together in a pool of two processes (the 2-core machine the suite is sized
for); the serving tests wait for the two exports.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import subprocess
import sys

import dp_accounting
import pytest

# Nine fresh TensorFlow processes: about 3 minutes of CPU in all (two at a time).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
TRAINING = ("dpvd_digits", "binary_tabular", "custom_training_loop", "mirrored_strategy", "audit_own_model",
            "private_search")
TIMEOUT_S = 600


def _run(name, cwd, *args):
    env = dict(os.environ, TFDPBNN_EXAMPLES_FAST="1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, f"{name}.py"), "--fast", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("summary: ")]
    assert len(lines) == 1, f"{name}: expected one summary line in\n{proc.stdout[-3000:]}"
    return json.loads(lines[0][len("summary: "):]), proc.stdout


#: which training script each test needs (the serving tests need the two exports).
NEEDS = {"test_train_and_export_examples": ("dpvd_digits", "binary_tabular"),
         "test_serve_savedmodel_in_a_fresh_process": ("dpvd_digits", "binary_tabular"),
         "test_custom_training_loop": ("custom_training_loop",),
         "test_mirrored_strategy": ("mirrored_strategy",), "test_audit_own_model": ("audit_own_model",),
         "test_private_search": ("private_search",)}


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """``{name: future of (summary, stdout, cwd)}``: the selected tests' training scripts, two at a time."""
    selected = {item.originalname for item in request.session.items if item.module is request.module}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    futures = {}
    for name in TRAINING:
        if not any(name in NEEDS.get(test, ()) for test in selected):
            continue
        cwd = str(tmp_path_factory.mktemp(name))
        args = ("--seed", "0") if name == "private_search" else ()
        futures[name] = pool.submit(lambda n=name, c=cwd, a=args: (*_run(n, c, *a), c))
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def _result(runs, name):
    return runs[name].result(timeout=2 * TIMEOUT_S)


def _poisson_steps(noise_multiplier, sample_rate, steps):
    """dp-accounting's own event of ``steps`` Poisson-sampled Gaussian steps."""
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    sampled = dp_accounting.PoissonSampledDpEvent(sample_rate, gaussian)
    return dp_accounting.SelfComposedDpEvent(sampled, steps)


def _rdp_epsilon(noise_multiplier, sample_rate, steps, delta):
    """Epsilon of ``steps`` Poisson-sampled Gaussian steps by dp-accounting's RDP accountant."""
    event = _poisson_steps(noise_multiplier, sample_rate, steps)
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(delta)


def _check_budget(summary):
    assert math.isfinite(summary["epsilon"]) and 0 < summary["epsilon"] <= summary["budget"] * (1 + 1e-9)
    assert summary["steps"] >= 1


def _check_export(summary, cwd):
    path = os.path.join(cwd, summary["export_dir"])
    assert os.path.isfile(os.path.join(path, "saved_model.pb"))
    with open(os.path.join(path, "assets", "privacy.json"), encoding="utf-8") as fh:
        record = json.load(fh)
    assert record["epsilon"] == pytest.approx(summary["epsilon"], rel=1e-12)
    assert record["steps"] == summary["steps"] and record["delta"] == summary["delta"]
    return record


@pytest.mark.parametrize("name", ["dpvd_digits", "binary_tabular"])
def test_train_and_export_examples(runs, name):
    summary, _, cwd = _result(runs, name)
    _check_budget(summary)
    assert summary["epsilon"] == pytest.approx(_rdp_epsilon(summary["noise_multiplier"],
                                                            summary["sample_rate"], summary["steps"],
                                                            summary["delta"]), rel=1e-6)
    accuracy = summary["test_accuracy" if name == "dpvd_digits" else "accuracy"]
    assert 0 <= accuracy <= 1 and 0 <= summary["ece"] <= 1
    if name == "binary_tabular":   # Bernoulli probabilities from sigmoid, never a softmax over one logit
        # (which is 1.0 for every example). Not a bound on confidence: the fast mode's few noisy steps often
        # predict the majority class everywhere, with p_min from 0.74 to 0.9994 in runs of the example.
        assert 0 <= summary["p_min"] < summary["p_max"] <= 1
        assert 0 <= summary["brier"] <= 1
    record = _check_export(summary, cwd)
    assert record["optimizer"] == "DPVDOptimizer" and record["asserted_by_user"] == []


@pytest.mark.parametrize("name", ["dpvd_digits", "binary_tabular"])
def test_serve_savedmodel_in_a_fresh_process(runs, name):
    exported, _, cwd = _result(runs, name)
    summary, out = _run("serve_savedmodel", cwd, exported["export_dir"], "--inputs", exported["requests"])
    assert summary["tfdpbnn_imported"] is False
    assert summary["epsilon"] == pytest.approx(exported["epsilon"], rel=1e-12)
    assert summary["num_requests"] == 32 and summary["num_samples"] == 20
    assert 0 <= summary["prob_min"] <= summary["prob_max"] <= 1
    assert summary["max_row_sum_error"] < 1e-6
    # Entropy = expected entropy + mutual information, float64 arithmetic; MI >= 0 (Jensen).
    assert summary["max_entropy_split_error"] < 1e-9 and summary["min_mutual_information"] >= 0
    # The deterministic signature is the exporting process's model: float32 agreement.
    assert summary["max_deterministic_difference"] < 1e-5
    # Independent MC draws (5 samples in the exporter, 20 served): the means agree on average within 0.05
    # (observed: below 0.005); a served softmax over one logit (probability 1) would be about 0.4 off.
    assert summary["mean_mc_difference"] < 0.05
    assert "model trained with DPVDOptimizer" in out


def test_custom_training_loop(runs):
    summary, _, _ = _result(runs, "custom_training_loop")
    _check_budget(summary)
    assert summary["steps"] == summary["planned_steps"]
    expected = _rdp_epsilon(summary["noise_multiplier"], summary["sample_rate"], summary["steps"],
                            summary["delta"])
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert 0 < summary["epsilon_pld"] <= summary["epsilon"] * (1 + 1e-6)   # PLD is tighter than RDP here


def test_mirrored_strategy(runs):
    summary, _, _ = _result(runs, "mirrored_strategy")
    _check_budget(summary)
    assert summary["replicas"] == 2
    assert summary["epsilon"] == pytest.approx(summary["single_device_epsilon"], rel=1e-12)


def test_audit_own_model(runs):
    summary, out, _ = _result(runs, "audit_own_model")
    assert 0 < summary["reported_epsilon"] <= summary["budget"] * (1 + 1e-9)
    # A correct DP-SGD run: the 95% lower bound stays below the reported epsilon.
    assert 0 <= summary["audited_epsilon"] <= summary["reported_epsilon"]
    assert summary["num_canaries"] == 100 and 0 <= summary["num_correct"] <= summary["num_guesses"] <= 100
    assert "consistent" in out


def test_private_search(runs):
    from tfdpbnn.tuning import bounds

    summary, _, _ = _result(runs, "private_search")
    assert math.isfinite(summary["epsilon"]) and summary["epsilon"] <= summary["budget"] * (1 + 1e-9)
    assert summary["epsilon"] > summary["trial_epsilon"]     # the search costs more than one run
    hp = summary["selected"]
    q, steps = hp["batch_size"] / 1150, math.ceil(1150 / hp["batch_size"]) * hp["epochs"]
    one = _poisson_steps(hp["noise_multiplier"], q, steps)
    # Papernot & Steinke 2022, Theorem 2 with E[K] = 2 and eta = 0 (logarithmic), by dp-accounting.
    search = dp_accounting.dp_event.RepeatAndSelectDpEvent(one, 2.0, 0.0)
    acc = dp_accounting.rdp.RdpAccountant(orders=list(bounds.ORDERS)).compose(search)
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(summary["delta"]), rel=1e-6)
    assert 0 <= summary["test_accuracy"] <= 1
