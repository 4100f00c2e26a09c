"""``tfdpbnn audit``: argument errors, the step audit end to end (flags a broken DPVD, passes the honest
one, prints its power), the sampling mode, and a tiny multi-run audit."""

import json

import pytest

from tfdpbnn import cli
from tfdpbnn.audit import experiment, mutations, sampling, step
from tfdpbnn.commands import audit as audit_command

# Not in the fast tier (./scripts/test --fast): audits end to end through the command line.
pytestmark = pytest.mark.slow


def test_cli_names_match_the_experiment():
    assert audit_command.METHODS == experiment.METHODS == step.METHODS
    assert set(audit_command.BROKEN) == set(experiment.BROKEN)
    assert set(audit_command.STEP_BROKEN) == set(mutations.STEP_MUTATIONS)
    assert set(audit_command.SAMPLING_BROKEN) == set(sampling.SAMPLING_MUTATIONS)


@pytest.mark.parametrize("argv, message", [
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "1", "--multi-run", "--runs", "3"], "--runs"),
    (["--epsilon", "1", "--mode", "one-run", "--sample-rate", "1.5"], "--sample-rate"),
    (["--epsilon", "1", "--sample-rate", "0.1"], "--sample-rate"),  # the step audit has no sampling
    (["--epsilon", "1", "--broken", "sigma0"], "--broken"),  # a one-run configuration, not a step mutation
    (["--epsilon", "1", "--multi-run", "--method", "dpvd"], "--method"),
    (["--epsilon", "1", "--multi-run", "--broken", "noise-2/3"], "--broken"),
    (["--epsilon", "1", "--mode", "sampling", "--broken", "noise-2/3"], "--broken"),
    (["--epsilon", "1", "--replicas", "2"], "--replicas"),  # the step audit has no replicas
    (["--epsilon", "1", "--estimator", "fdp"], "--estimator"),  # the step audit has no estimator
    (["--epsilon", "1", "--mode", "sampling", "--fit", "--replicas", "2"], "--fit"),
    (["--epsilon", "1", "--mode", "one-run", "--estimator", "fdp"], "--estimator fdp"),  # q = 0.2: refused
    (["--model", "m.keras", "--epsilon", "1"], "--model"),  # the saved model's optimizer holds its noise
    (["--mode", "traced"], "--epsilon is required"),
    (["--epsilon", "1", "--calls", "50"], "--calls"),  # the step audit's traced part reads no --calls
    (["--model", "m.keras", "--mode", "sampling"], "--model"),
    (["--epsilon", "1", "--mode", "one-run", "--estimator", "fdp", "--sample-rate", "1", "--method", "dpvd"],
     "estimator 'fdp'"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    assert cli.main(["audit", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("broken", [None, "noise-2/3"])
def test_step_audit_of_dpvd_flags_the_broken_noise_only(broken, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["audit", "--method", "dpvd", "--epsilon", "1", "--runs", "5000", "--json", str(out)]
    assert cli.main(argv + (["--broken", broken] if broken else [])) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["method"] == "dpvd" and result["broken"] == broken and result["runs"] == 5000
    assert result["flagged"] == (broken is not None)
    assert ("FLAGGED" in printed) == (broken is not None)
    assert "would have flagged a 1.5x sensitivity error with probability" in printed
    assert result["power_1_5x"] > 0.95
    assert result["traced"]["flagged"] == (broken is not None)  # the traced-step audit ran after it
    assert "traced-step audit of dpvd at epsilon 1" in printed and "cannot see" in printed


def test_traced_audit_of_a_saved_model(tmp_path, capsys):
    import tensorflow as tf

    import tfdpbnn

    model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(4, activation="tanh"),
                                 tf.keras.layers.Dense(3)])
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.2, num_examples=100, batch_size=20, delta=1e-5),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    path, out = tmp_path / "m.keras", tmp_path / "r.json"
    model.save(path)
    assert cli.main(["audit", "--model", str(path), "--calls", "200", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert not result["flagged"] and result["noise_multiplier"] == pytest.approx(1.2)
    assert result["scale"] == pytest.approx(1 / 20) and 0.99 < result["largest_contribution"] <= 1.002
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("fit", [False, True])
def test_sampling_mode_flags_a_1_5x_rate(fit, capsys):
    args = ["audit", "--mode", "sampling", "--epsilon", "1", "--broken", "sample-rate-1.5x"]
    assert cli.main(args + (["--fit", "--steps", "100"] if fit else [])) == 0
    printed = capsys.readouterr().out
    assert "FLAGGED" in printed and ("model.fit consumed" in printed) == fit


def test_sampling_mode_passes_an_honest_fit(capsys):
    assert cli.main(["audit", "--mode", "sampling", "--epsilon", "1", "--fit", "--steps", "100"]) == 0
    printed = capsys.readouterr().out
    assert "passed" in printed and "as model.fit consumed them" in printed


@pytest.mark.parametrize("broken", [None, "shard-overlap"])
def test_sampling_mode_audits_replica_shards(broken, capsys):
    args = ["audit", "--mode", "sampling", "--epsilon", "1", "--replicas", "2"]
    assert cli.main(args + (["--broken", broken] if broken else [])) == 0
    printed = capsys.readouterr().out
    assert ("FLAGGED" in printed) == (broken is not None) and "drawn by two replicas" in printed
    assert "would have flagged one example placed in two shards with probability" in printed


def test_multi_run_tiny(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = cli.main(["audit", "--multi-run", "--epsilon", "8", "--runs", "8", "--steps", "1",
                     "--num-examples", "15", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["runs"] == 8 and result["steps"] == 1
    assert result["reported_epsilon"] == pytest.approx(8.0, rel=0.02)
    assert 0.0 <= result["gdp_epsilon_lb"] <= result["reported_epsilon"]
    assert "lower bound" in capsys.readouterr().out


@pytest.mark.parametrize("broken", [None, "sigma0"])
def test_one_run_fdp_estimator_on_a_full_batch_run(broken, tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["audit", "--mode", "one-run", "--epsilon", "1", "--sample-rate", "1", "--epochs", "2",
            "--num-canaries", "200", "--estimator", "fdp", "--json", str(out)]
    assert cli.main(argv + (["--broken", broken] if broken else [])) == 0
    result = json.loads(out.read_text())
    assert result["estimator"] == "fdp" and result["steps"] == 2
    # Two full-batch steps: mu = sqrt(2) / sigma exactly, sigma the declared (calibrated) noise multiplier.
    assert result["claimed_mu"] == pytest.approx(2 ** 0.5 / result["declared_noise_multiplier"])
    assert result["caught"] == (broken is not None) == (result["gdp_mu_lb"] > result["claimed_mu"])
    assert "mu-GDP:" in capsys.readouterr().out


def test_multi_run_refuses_an_optimizer_with_per_variable_state():
    from tfdpbnn import optimizers as O
    from tfdpbnn.audit.multi_run import check_stateless

    common = dict(num_examples=4, batch_size=2)
    check_stateless(O.DPSGDOptimizer(1.0, 1.0, **common))           # plain SGD: accepted
    for opt in (O.DPAdamOptimizer(1.0, 1.0, **common), O.DPSGDOptimizer(1.0, 1.0, momentum=0.9, **common)):
        with pytest.raises(ValueError, match="optimizer: it keeps per-variable state"):
            check_stateless(opt)
