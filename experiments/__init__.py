"""Reproductions of the papers' experiments with sound privacy accounting.

Run from a source checkout: ``python -m experiments <name> [options]`` (or ``tfdpbnn reproduce <name>``,
which runs this folder). They use only tfdpbnn's public API. Each experiment is a module with
``run(out_dir, seeds=None, smoke=False, data_dir=None, log=print)`` that writes CSV/JSON/PNG files and a
``run.json`` record (``experiments.runner.Run``) and returns that record. ``docs/results.md`` puts the
numbers beside the papers' own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["EXPERIMENTS", "available_experiments", "run_experiment"]

# name -> (module, one-line description).
EXPERIMENTS = {
    "sigma-curve": ("experiments.sigma_curve",
                    "Ermis & Cemgil 2017a, Fig. 3: sigma against epsilon, the papers' AC/zCDP beside sound "
                    "accountants"),
    "digits-table": ("experiments.digits_table",
                     "Ermis & Cemgil 2017a/b, Table 1 on DIGITS (MNIST with --data-dir): DPVD, DPD, SVI/SGLD,"
                     " "
                     "DP-SGD "
                     "at several epsilons"),
    "digits-ablation": ("experiments.digits_ablation",
                        "which changes to the papers' DIGITS setting matter for DP-SGD at epsilon 1"),
    "dpbnn-table": ("experiments.dpbnn_table",
                    "Zhang et al. 2022, Tables 1-2 on DIGITS (MNIST with --data-dir): DP-SGLD, DP-BBP, DP-MC "
                    "Dropout, DP-SGD; ECE, MCE"),
    "heteroscedastic": ("experiments.heteroscedastic",
                        "Zhang et al. 2022, sec. 5.2: heteroscedastic GP regression, median MSE, uncertainty "
                        "bands"),
    "sidp-tables": ("experiments.sidp_tables",
                    "Davody et al. 2020, Tables 1 and 4: noisy weights with/without LN/BN; SI-DPSGD vs "
                    "DP-SGD"),
}


def available_experiments() -> list[str]:
    """Names accepted by :func:`run_experiment` and ``python -m experiments``."""
    return list(EXPERIMENTS)


def run_experiment(name: str, out_dir: str, seeds: int | None = None, smoke: bool = False,
                   data_dir: str | None = None, log: Callable[[str], None] | None = print, **options) -> dict:
    """Run the experiment ``name``, writing its results under ``out_dir``; returns its ``run.json`` record.

    Args:
      name: one of :func:`available_experiments`.
      out_dir: output directory (created if missing).
      seeds: number of seeds (runs per configuration); ``None`` uses the experiment's default.
      smoke: tiny configuration for tests (seconds, numbers not meaningful).
      data_dir: TFDS data directory holding prepared data, never downloaded; dpbnn-table and digits-table
        (their MNIST variants) and sidp-tables (MNIST, CIFAR-10) use it, the others raise ``ValueError``.
      log: progress printer.
      **options: experiment-specific keyword arguments of its ``run`` (e.g. ``epsilons``, ``methods``,
        ``configs`` for digits-table).
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"name: unknown experiment {name!r}; allowed: {', '.join(EXPERIMENTS)}")
    if seeds is not None and (int(seeds) != seeds or seeds < 1):
        raise ValueError(f"seeds: must be an integer >= 1, got {seeds!r}")
    module = importlib.import_module(EXPERIMENTS[name][0])
    return module.run(out_dir, seeds=seeds, smoke=smoke, data_dir=data_dir, log=log, **options)
