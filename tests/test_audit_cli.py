"""``tfdpbnn audit``: argument errors, and a tiny multi-run audit end to end."""

import json

import pytest

from tfdpbnn import cli
from tfdpbnn.audit import experiment
from tfdpbnn.commands import audit as audit_command


def test_cli_names_match_the_experiment():
    assert audit_command.METHODS == experiment.METHODS
    assert set(audit_command.BROKEN) == set(experiment.BROKEN)


@pytest.mark.parametrize("argv, message", [
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "1", "--multi-run", "--runs", "3"], "--runs"),
    (["--epsilon", "1", "--sample-rate", "1.5"], "--sample-rate"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    assert cli.main(["audit", *argv]) == 2
    assert message in capsys.readouterr().err


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
