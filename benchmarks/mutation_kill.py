"""Kill table of the source mutations (``tfdpbnn.audit.source_mutations``): audit vs tests, per mutation.

Each mutation is applied to a copy of the package; the traced-step audit of every method it applies to
runs in a subprocess against the copy, and, with ``--tests``, the named test files too. The honest code is
audited ``--honest-repeats`` times (each with a fresh seed) to measure the false-alarm rate. Writes the JSON
results and, with ``--docs``, the marked table in docs/audit.md.

    python benchmarks/mutation_kill.py --honest-repeats 5 --docs docs/audit.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfdpbnn.audit.source_mutations import SOURCE_MUTATIONS, run_mutation  # noqa: E402

MARK = "mutation-kill"


def _table(results, meta) -> list[str]:
    test_files = list(dict.fromkeys(a.strip("`") for a in meta["command"].split() if a.startswith("tests/")))
    lines = ["### Source mutations: killed by the traced-step audit and by the tests", "",
             "Tests: " + (", ".join(f"`{t}`" for t in test_files) if test_files else "not run") + ".", "",
             "| mutation | what the edit does | methods audited | audit | what the audit flagged | tests "
             "| s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if r["name"] == "honest":
            continue
        verdict = ", ".join(f"{m}: {'killed' if v else 'SURVIVED'}" for m, v in r["audit_flagged"].items())
        statistics = sorted({(f.split(":")[0] + ": " + f.split(": ")[2].rsplit(" ", 1)[0]).replace("|", "\\|")
                             for flags in r["audit_flags"].values() for f in flags})
        tests = {None: "not run", True: "killed", False: "survived"}[r["tests_failed"]]
        lines.append(f"| `{r['name']}` | {SOURCE_MUTATIONS[r['name']][0]} | "
                     f"{', '.join(r['audit_flagged'])} | {verdict} | {'; '.join(statistics)} | {tests} | "
                     f"{r['seconds']:.0f} |")
    honest = [r for r in results if r["name"] == "honest"]
    flagged = sum(any(r["audit_flagged"].values()) for r in honest)
    honest_line = (f"Honest code: flagged in {flagged} of {len(honest)} audits (dpsgd, seeds "
                   f"0..{len(honest) - 1})." if honest else "Honest code: not run.")
    lines += ["", honest_line,
              "", f"_Machine: {meta['machine']}; command `{meta['command']}`; wall time "
              f"{meta['seconds']:.0f} s._"]
    return lines


def main(argv=None) -> int:
    """Run the mutations, print and save the kill table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mutations", nargs="*", default=list(SOURCE_MUTATIONS), choices=list(SOURCE_MUTATIONS))
    p.add_argument("--honest-repeats", type=int, default=1)
    p.add_argument("--tests", nargs="*", default=(), help="test files run against each mutated copy")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--json", default="docs/mutation_kill.json")
    p.add_argument("--docs", default=None, help="replace the marked kill table in this markdown file")
    p.add_argument("--render-only", action="store_true", help="only render the table of an earlier --json")
    args = p.parse_args(argv)
    if args.render_only:
        with open(args.json) as f:
            saved = json.load(f)
        return _write(_table(saved["results"], saved["meta"]), args.docs)
    if args.honest_repeats < 0:
        raise SystemExit(f"--honest-repeats must be >= 0, got {args.honest_repeats}")
    start = time.perf_counter()
    results = []
    for seed in range(args.honest_repeats):
        outcome = run_mutation(None, tests=(), epsilon=args.epsilon, seed=seed)
        results.append(outcome.as_dict())
        print("honest", seed, outcome.audit_flagged, f"{outcome.seconds:.0f} s", flush=True)
    for name in args.mutations:
        outcome = run_mutation(name, tests=args.tests, epsilon=args.epsilon)
        results.append(outcome.as_dict())
        print(name, outcome.audit_flagged, "tests failed:", outcome.tests_failed, f"{outcome.seconds:.0f} s",
              flush=True)
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.platform()})",
            "command": "python benchmarks/mutation_kill.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
            "seconds": time.perf_counter() - start}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=2)
    return _write(_table(results, meta), args.docs)


def _write(lines, docs) -> int:
    """Print the table; with ``docs``, replace the marked block of that markdown file with it."""
    print("\n".join(lines))
    if docs:
        with open(docs) as f:
            text = f.read()
        start_mark, end_mark = f"<!-- audit-table:{MARK} -->", f"<!-- /audit-table:{MARK} -->"
        if start_mark not in text or end_mark not in text:
            raise SystemExit(f"--docs: {docs} has no {start_mark} ... {end_mark} block")
        head, rest = text.split(start_mark, 1)
        text = head + start_mark + "\n" + "\n".join(lines) + "\n" + end_mark + rest.split(end_mark, 1)[1]
        with open(docs, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
