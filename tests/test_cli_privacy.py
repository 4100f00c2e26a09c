"""``tfdpbnn privacy``: the table (one row per accountant, approximate rows marked), the plot, bad input."""

import re

import pytest

from tfdpbnn.cli import main
from tfdpbnn.privacy import calibrate_noise, compute_epsilon


def _rows(out):
    found = re.finditer(r"^\| (\w+) \| ([^|]+) \| ([^|]+) \|$", out, flags=re.M)
    return {m.group(1): (m.group(2), m.group(3)) for m in found if m.group(1) != "accountant"}


def test_table_for_noise_multiplier(capsys):
    assert main(["privacy", "--num-examples", "1000", "--batch-size", "50", "--epochs", "10",
                 "--noise-multiplier", "1.1", "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) >= {"rdp", "pld", "zcdp", "gdp", "ac"}
    steps = 10 * 20
    for name in ("rdp", "zcdp", "ac"):
        assert float(rows[name][0]) == pytest.approx(compute_epsilon(1.1, 0.05, steps, 1e-5, name), rel=1e-3)
        assert rows[name][1].strip() == "upper bound"
    assert rows["gdp"][1].startswith("APPROXIMATE")
    assert rows["gdp"][1].strip().endswith("*")  # 200 steps at sigma 1.1: the CLT under-reports here
    assert "under-report" in out


@pytest.mark.slow   # not in the fast tier: calibrates sigma for every accountant on a grid for the plot
def test_table_for_epsilon_with_paper_rows_and_plot(capsys, tmp_path):
    plot = tmp_path / "fig3.png"
    assert main(["privacy", "--num-examples", "1000", "--batch-size", "50", "--epochs", "5",
                 "--epsilon", "2", "--delta", "1e-5", "--accountants", "rdp,gdp", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {"rdp", "gdp"}
    assert float(rows["rdp"][0]) == pytest.approx(calibrate_noise(2.0, 1e-5, 0.05, 100), rel=1e-3)
    assert out.count("NOT a guarantee") == 3
    assert plot.stat().st_size > 10_000
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_shuffle_rows_are_exact_gaussian_compositions(capsys):
    assert main(["privacy", "--num-examples", "1000", "--batch-size", "100", "--epochs", "4",
                 "--noise-multiplier", "3", "--delta", "1e-5", "--sampling", "shuffle"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["gdp"][1].strip() == "upper bound"  # no CLT step: exact
    assert "Poisson sampling gives a far smaller epsilon" in out


@pytest.mark.parametrize("argv,match", [
    (["--noise-multiplier", "0"], "--noise-multiplier"),
    (["--noise-multiplier", "1", "--batch-size", "5000"], "--batch-size"),
    (["--epsilon", "-1"], "--epsilon"),
    (["--noise-multiplier", "1", "--accountants", "rdp,moments"], "--accountants"),
])
def test_bad_input_exit_code_and_message(argv, match, capsys):
    base = {"--num-examples": "1000", "--batch-size": "50", "--epochs": "2", "--delta": "1e-5"}
    for i in range(0, len(argv) - 1, 2):
        if argv[i] in base:
            base[argv[i]] = argv[i + 1]
    extra = [a for i, a in enumerate(argv) if argv[i - (i % 2)] not in base]
    args = ["privacy"] + [x for kv in base.items() for x in kv] + extra
    assert main(args) == 2
    assert match in capsys.readouterr().err


def test_bad_delta(capsys):
    assert main(["privacy", "--num-examples", "10", "--batch-size", "5", "--epochs", "1",
                 "--noise-multiplier", "1", "--delta", "1.5"]) == 2
    assert "--delta must be a number in the open interval (0, 1)" in capsys.readouterr().err
