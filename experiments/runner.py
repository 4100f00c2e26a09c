"""Shared machinery of the reproduction experiments: one run directory, its record, its tables.

Every experiment in ``experiments`` writes, under its ``--out`` directory:

- ``run.json``: the experiment name, the command-line settings, the seeds, library versions, the wall time,
  and every privacy statement recorded with :meth:`Run.privacy` (noise multiplier, sample rate, steps, the
  sampling scheme that actually ran, and epsilon from every sound accountant of ``tfdpbnn.privacy``);
- one CSV per table (:meth:`Run.write_csv`) and the PNG figures the experiment draws.

The epsilons recorded are upper bounds for the code that ran: they come from ``tfdpbnn.privacy`` with the
sampling scheme the training loop used (Poisson sampling throughout these experiments).
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Run", "mean_std", "paired_arms_without_ledger", "sound_epsilons"]


def paired_arms_without_ledger() -> None:
    """Switch the privacy record off for this process unless ``TFDPBNN_PRIVACY_STORE`` names a store.

    For experiments whose arms of one seed draw their batches from one sampling key (``poisson_batches``'
    ``secret_seed``), so that the arms are paired: the per-record ledger refuses a second run from one key
    on the same records (the runs are not independent). Each privacy statement is then its own run's.
    """
    os.environ.setdefault("TFDPBNN_PRIVACY_STORE", "off")


def sound_epsilons(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                   sampling: str = "poisson") -> dict[str, float]:
    """Epsilon of ``steps`` subsampled Gaussian steps under every sound accountant of ``tfdpbnn.privacy``.

    The accountants are those ``tfdpbnn.privacy.sound_accountants()`` lists (RDP, PLD, sound zCDP, AC: each
    an upper bound for the mechanism, unlike the GDP central-limit approximation of Zhang et al. (2022,
    Theorem 2)).
    An accountant that cannot bound the event (``dp_accounting.UnsupportedEventError``) or that the sampling
    scheme does not admit (``ValueError``) is recorded as NaN, never as a number it did not prove.
    """
    from tfdpbnn import privacy

    out = {}
    for name in privacy.sound_accountants():
        try:
            out[name] = float(privacy.compute_epsilon(noise_multiplier, sample_rate, steps, delta,
                                                      accountant=name, sampling=sampling))
        except Exception as err:  # noqa: BLE001 - recorded, see docstring
            out[name] = float("nan")
            out[name + "_error"] = f"{type(err).__name__}: {err}"
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) of ``values``."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("values: need at least one value, got none")
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), std


def _versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    from importlib import metadata

    for mod in ("tensorflow", "keras", "tf_keras", "tensorflow_privacy", "tensorflow_probability",
                "dp_accounting", "tensorflow_datasets", "numpy", "tfdpbnn"):
        try:  # the installed distribution's version (dp_accounting has no __version__ attribute)
            versions[mod] = metadata.version(mod.replace("_", "-"))
        except metadata.PackageNotFoundError:
            try:
                versions[mod] = getattr(__import__(mod), "__version__", "?")
            except Exception:  # noqa: BLE001 - a missing optional package is recorded, not fatal
                versions[mod] = "not importable"
    import tensorflow as tf

    versions["tf.keras"] = tf.keras.Model.__module__.split(".")[0]     # which Keras package tf.keras was
    try:  # the code that ran: commit and whether the working tree differed from it
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "tfdpbnn"], cwd=root,
                               capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            versions["git_commit"] = head.stdout.strip()
            versions["git_tfdpbnn_modified"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return versions


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.floating | float):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, str | int | bool) or value is None:
        return value
    return str(value)


class Run:
    """The record of one experiment run, written to ``out_dir/run.json`` by :meth:`finish`.

    Args:
      name: experiment name (e.g. ``"sigma-curve"``).
      out_dir: directory for every file the experiment writes (created if missing).
      settings: the settings the experiment ran with (JSON-serializable mapping).
      seeds: the random seeds used.
      log: function printing one progress line (``print`` by default; ``None`` silences it).
    """

    def __init__(self, name: str, out_dir: str, settings: Mapping, seeds: Iterable[int] = (),
                 log: Callable[[str], None] | None = print):
        if not name:
            raise ValueError("name: must be a non-empty experiment name")
        self.name = name
        self.out_dir = os.fspath(out_dir)
        os.makedirs(self.out_dir, exist_ok=True)
        self.settings = dict(settings)
        self.seeds = [int(s) for s in seeds]
        self._log = log
        self._start = time.time()
        self._privacy: list[dict] = []
        self._files: list[str] = []
        self._extra: dict = {}

    def log(self, message: str) -> None:
        """Print one progress line, prefixed with the experiment name and elapsed seconds."""
        if self._log is not None:
            self._log(f"[{self.name} {time.time() - self._start:7.1f}s] {message}")

    def progress(self, items: Iterable, what: str = "step"):
        """Yield ``items``, logging ``what k/N`` and the estimated time left before each one."""
        items = list(items)
        total, start = len(items), time.time()
        for k, item in enumerate(items):
            if k == 0:
                self.log(f"{what} 1/{total}")
            else:
                left = (time.time() - start) / k * (total - k)
                self.log(f"{what} {k + 1}/{total}, about {left:.0f} s left")
            yield item
        self.log(f"{what}: {total}/{total} done in {time.time() - start:.0f} s")

    def path(self, filename: str) -> str:
        """Path of ``filename`` inside the run directory, remembered as one of the run's outputs."""
        p = os.path.join(self.out_dir, filename)
        if p not in self._files:
            self._files.append(p)
        return p

    def privacy(self, label: str, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                sampling: str = "poisson", clip: float | None = None, **extra) -> dict[str, float]:
        """Record the privacy statement of one training configuration; returns the sound epsilons."""
        eps = sound_epsilons(noise_multiplier, sample_rate, steps, delta, sampling=sampling)
        self._privacy.append(dict(label=label, noise_multiplier=float(noise_multiplier),
                                  sample_rate=float(sample_rate), steps=int(steps), delta=float(delta),
                                  sampling=sampling, clip=clip, epsilon=eps, **extra))
        return eps

    def privacy_statement(self, label: str, statement: Mapping, **extra) -> dict[str, float]:
        """Record an optimizer's own ``privacy_statement()``.

        For a mechanism that is not the subsampled Gaussian :meth:`privacy` accounts (e.g.
        ``SIDPOptimizer(paper_mean_update=True)``); returns its epsilons by accountant (``None`` recorded as
        NaN).
        """
        eps = {name: float("nan") if value is None else float(value)
               for name, value in statement["epsilon_by_accountant"].items()}
        self._privacy.append(dict(label=label, noise_multiplier=float(statement["noise_multiplier"]),
                                  sample_rate=float(statement["sample_rate"]), steps=int(statement["steps"]),
                                  delta=float(statement["delta"]), sampling=statement["sampling"],
                                  clip=float(statement["l2_norm_clip"]), epsilon=eps,
                                  accountant=statement["accountant"], statement=dict(statement), **extra))
        return eps

    def note(self, key: str, value) -> None:
        """Attach one extra entry (e.g. a chosen hyperparameter) to ``run.json``."""
        self._extra[key] = value

    def write_csv(self, filename: str, rows: Sequence[Mapping], columns: Sequence[str] | None = None) -> str:
        """Write ``rows`` (mappings) as a CSV file in the run directory; returns its path."""
        if columns is None:
            columns = []
            for row in rows:
                for key in row:
                    if key not in columns:
                        columns.append(key)
        p = self.path(filename)
        with open(p, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: row.get(k, "") for k in columns})
        return p

    def write_json(self, filename: str, obj) -> str:
        """Write ``obj`` as JSON in the run directory; returns its path."""
        p = self.path(filename)
        with open(p, "w") as fh:
            json.dump(_jsonable(obj), fh, indent=2)
        return p

    def finish(self) -> dict:
        """Write ``run.json`` (settings, seeds, versions, privacy records, outputs, wall time); return it."""
        record = dict(
            experiment=self.name,
            command=" ".join(sys.argv),
            settings=self.settings,
            seeds=self.seeds,
            versions=_versions(),
            privacy=self._privacy,
            outputs=[os.path.relpath(p, self.out_dir) for p in self._files],
            wall_time_s=time.time() - self._start,
            finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **self._extra,
        )
        with open(os.path.join(self.out_dir, "run.json"), "w") as fh:
            json.dump(_jsonable(record), fh, indent=2)
        self.log(f"done in {record['wall_time_s']:.1f}s; results in {self.out_dir}")
        return record
