"""Mutation testing with real edits: source patches of a copy of tfdpbnn, audited in a subprocess.

``tfdpbnn.audit.inject_bug`` switches the mechanism through a hook the audits know about; a bug a future
change ships goes through no hook. Here each mutation in ``SOURCE_MUTATIONS`` is a textual edit of the
package's source, the kind of one-line bug a change could ship: the package is copied to a temporary
directory, the edit applied there (every ``old`` text must occur exactly once, else ``PatchError``: a patch
that does not apply is an error, never a silent pass), and the traced-step audit
(``tfdpbnn.audit.traced``) of each method the mutation applies to runs in a subprocess with the copy first
on ``PYTHONPATH``; optionally named test files run there too. ``run_mutation`` reports whether the audit
and the tests killed it. ``python benchmarks/mutation_kill.py`` runs them all and writes the kill table
(docs/audit.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from tfdpbnn.audit.step import METHODS

#: Every method, and those whose models the ghost engine clips (sidp-bn's carried public batch
#: normalization runs the jacobian path).
ALL = METHODS
GHOST = tuple(m for m in ALL if m != "sidp-bn")
#: name -> (what the edit does, the methods it applies to (audited on each), [(path in the package, old,
#: new), ...]).
SOURCE_MUTATIONS = {
    "noise-scale-0.9": (
        "the noise standard deviation is 0.9 sigma C s", ALL,
        [("optimizers/mechanism.py", "return _read(self._sigma) * _read(self._clip) * self.scale()",
          "return _read(self._sigma) * _read(self._clip) * self.scale() * 0.9")]),
    "bias-without-noise": (
        "no noise on biases (rank-1 variables)", ALL,
        [("optimizers/mechanism.py",
          "noised = [g + z for g, z in zip(clipped.clipped_sum, noise, strict=True)]",
          "noised = [g + z if len(g.shape) > 1 else g for g, z in zip(clipped.clipped_sum, noise, "
          "strict=True)]")]),
    "noise-half-duplicated": (
        "the second half of each noise draw repeats the first half", ALL,
        [("privacy/noise.py", "    return flat[:total] if 2 * pairs != total else flat",
          "    flat = flat[:total] if 2 * pairs != total else flat\n"
          "    return tf.concat([flat[:total - total // 2], flat[:total // 2]], 0)")]),
    "noise-frozen-at-trace": (
        "the step seed is computed in Python when the step is traced: every traced step adds the same "
        "noise", ALL,
        [("privacy/noise.py",
          "    return (default_key() if key is None else key).next_seed()",
          "    return tf.constant(np.random.default_rng().integers(-2 ** 62, 2 ** 62, size=2), tf.int64)")]),
    "clip-1.5x": (
        "examples clipped to 1.5 C", ALL,
        [("optimizers/mechanism.py", "        clip = _read(self._clip)\n",
          "        clip = _read(self._clip) * 1.5\n")]),
    "per-layer-clipping": (
        "each layer clipped to C separately (global norm up to sqrt(layers) C)", GHOST,
        [("clipping/ghost.py",
          "    factors = scaled_factors(clip_factors(norms, l2_norm_clip), sum_scale)\n    sums = {}\n"
          "    for r, grads in zip(records, grads_per_record, strict=True):\n",
          "    sums = {}\n"
          "    for r, grads in zip(records, grads_per_record, strict=True):\n"
          "        own = [sq for flag, sq in zip(r.entry.wanted, r.entry.rule.squared_norms(\n"
          "            r.entry.layer, r.context, grads), strict=True) if flag and sq is not None]\n"
          "        own = tf.sqrt(tf.add_n(own)) if own else tf.zeros_like(per_example_loss)\n"
          "        factors = scaled_factors(clip_factors(own, l2_norm_clip), sum_scale)\n")]),
    "dense-bias-out-of-norm": (
        "the Dense (and NoisyDense) clipping rule leaves the bias out of the per-example norm",
        ("dpsgd", "dpadam", "dpsgld", "dpmcdropout", "sidp-ln"),
        [("clipping/rules/dense.py", "        norms.append(ops.summed_squared_norms(b))",
          "        norms.append(None)")]),
    "variational-variance-out-of-norm": (
        "the DenseVariational rule leaves log sigma^2 out of the per-example norm (DPVD)", ("dpvd",),
        [("clipping/rules/dense_variational.py",
          "ops.outer_squared_norms(tf.square(a), h, weight_sq=tf.exp(2.0 * layer.log_sigma2))]",
          "None]")]),
    "bbp-rho-out-of-norm": (
        "the DenseBayesByBackprop rule leaves the kernel's rho out of the per-example norm", ("dpbbp",),
        [("clipping/rules/dense_bayes_by_backprop.py",
          "ops.outer_squared_norms(tf.square(a), h, weight_sq=tf.square(w))]", "None]")]),
    "sgld-scale-twice": (
        "DP-SGLD's n / B applied twice (sum and noise scaled by (n / B)^2)", ("dpsgld",),
        [("optimizers/dpsgld.py", "        noised = released.noised_gradients",
          "        noised = [g * n / self._f32(self._dp_batch_size) for g in released.noised_gradients]")]),
    "sgld-scale-sum-only": (
        "DP-SGLD's n / B applied to the clipped sum only (the noise scaled by 1 / B)", ("dpsgld",),
        [("optimizers/mechanism.py", "return _read(self._sigma) * _read(self._clip) * self.scale()",
          "return _read(self._sigma) * _read(self._clip) / _read(self._batch)")]),
    "sample-rate-halved": (
        "the optimizer's sample rate is B / (2 n): planned epsilon for half the real rate",
        ("dpsgd", "dpvd"),
        [("optimizers/base.py", "        return self.batch_size / self.num_examples",
          "        return self.batch_size / (2 * self.num_examples)")]),
}


class PatchError(ValueError):
    """A source mutation's ``old`` text does not occur exactly once in its file."""


def apply_mutation(package_dir, name) -> None:
    """Apply mutation ``name`` to the copy of the package at ``package_dir`` (raises ``PatchError``)."""
    if name not in SOURCE_MUTATIONS:
        raise ValueError(f"name must be one of {sorted(SOURCE_MUTATIONS)}, got {name!r}")
    for rel, old, new in SOURCE_MUTATIONS[name][2]:
        path = pathlib.Path(package_dir) / rel
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise PatchError(f"mutation {name!r}: {rel} holds the text to replace {count} times (need "
                             f"exactly 1): {old[:80]!r}")
        path.write_text(text.replace(old, new))


def mutated_copy(name, dest) -> pathlib.Path:
    """Copy the installed tfdpbnn package under ``dest`` (a directory), mutated by ``name`` unless None."""
    import tfdpbnn

    source = pathlib.Path(tfdpbnn.__file__).parent
    target = pathlib.Path(dest) / "tfdpbnn"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    if name is not None:
        apply_mutation(target, name)
    return target


@dataclasses.dataclass
class MutationOutcome:
    """What ran against one mutation: the audit's verdict per method, the tests' verdict, the time."""

    name: str
    audit_flagged: dict
    audit_flags: dict
    tests_failed: bool | None
    seconds: float

    def as_dict(self) -> dict:
        """The outcome as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @property
    def killed_by_audit(self) -> bool:
        """Whether the audit flagged it on every method it applies to."""
        return bool(self.audit_flagged) and all(self.audit_flagged.values())


def _subprocess_env(root):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_mutation(name, methods=None, tests=(), epsilon=1.0, timeout=900, calls=None, seed=0,
                 candidates=None, ascent=None) -> MutationOutcome:
    """Apply ``name`` (None: the honest code) to a copy, audit ``methods`` and run ``tests`` against it.

    The audit subprocess runs ``python -m tfdpbnn.audit.source_mutations METHOD...`` with the copy first on
    ``PYTHONPATH`` (it checks that it imported the copy); ``tests`` are pytest paths run the same way (their
    failure kills the mutation). ``calls``, ``candidates``, ``ascent``: ``traced_audit``'s (None: its
    defaults).
    """
    start = time.perf_counter()
    if methods is None:
        methods = SOURCE_MUTATIONS[name][1] if name is not None else ("dpsgd",)
    with tempfile.TemporaryDirectory(prefix="tfdpbnn-mutant-") as root:
        mutated_copy(name, root)
        env = _subprocess_env(root)
        argv = [sys.executable, "-m", "tfdpbnn.audit.source_mutations", "--expect-root", root,
                "--epsilon", str(epsilon), "--seed", str(seed)]
        for flag, value in (("--calls", calls), ("--candidates", candidates), ("--ascent", ascent)):
            if value is not None:
                argv += [flag, str(value)]
        argv += list(methods)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=root)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"audit of mutation {name!r} crashed (exit {proc.returncode}):\n"
                               + proc.stderr[-3000:])
        verdicts = json.loads(lines[-1])
        tests_failed = None
        if tests:
            # The tests and the pytest configuration are copied beside the mutated package, so that the
            # configuration's ``pythonpath = .`` puts the copy (not the checkout) first.
            repo = pathlib.Path(__file__).resolve().parents[2]
            shutil.copytree(repo / "tests", pathlib.Path(root) / "tests",
                            ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(repo / "setup.cfg", root)
            paths = [str(pathlib.Path(root) / "tests" / pathlib.Path(t).name) for t in tests]
            pytest = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-c",
                      str(pathlib.Path(root) / "setup.cfg"), "--rootdir", root, *paths]
            test_proc = subprocess.run(pytest, env=env, capture_output=True, text=True, timeout=timeout,
                                       cwd=root)
            tests_failed = test_proc.returncode != 0
    return MutationOutcome(name=name or "honest",
                           audit_flagged={m: v["flagged"] for m, v in verdicts.items()},
                           audit_flags={m: v["flags"] for m, v in verdicts.items()},
                           tests_failed=tests_failed, seconds=time.perf_counter() - start)


def _main(argv=None) -> int:
    """Subprocess entry: audit each method's tiny model; print one JSON line of verdicts."""
    import argparse

    parser = argparse.ArgumentParser(description="traced-step audit of each method (mutation subprocess)")
    parser.add_argument("methods", nargs="+")
    parser.add_argument("--expect-root", default=None)
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidates", type=int, default=None)
    parser.add_argument("--ascent", type=int, default=None)
    args = parser.parse_args(argv)
    import tfdpbnn

    if args.expect_root and not pathlib.Path(tfdpbnn.__file__).resolve().is_relative_to(
            pathlib.Path(args.expect_root).resolve()):
        raise RuntimeError(f"imported {tfdpbnn.__file__}, not the mutated copy under {args.expect_root}")
    from tfdpbnn.audit.traced import method_traced_audit

    out = {}
    for method in args.methods:
        extra = {k: v for k, v in (("candidates", args.candidates), ("ascent", args.ascent)) if v is not None}
        r = method_traced_audit(method, args.epsilon, seed=args.seed, calls=args.calls, **extra)
        out[method] = {"flagged": r.flagged, "flags": [f"{f.check}: {f.variable}: {f.statistic} {f.value:.4g}"
                                                       for f in r.flags]}
    print(json.dumps(out))
    return 0


__all__ = ["MutationOutcome", "PatchError", "SOURCE_MUTATIONS", "apply_mutation", "mutated_copy",
           "run_mutation"]

if __name__ == "__main__":
    sys.exit(_main())
