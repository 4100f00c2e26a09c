"""Audit tables and figure of docs/audit.md (step audit, sampling audit, one-run and multi-run audits).

Sections: the step audit's power and mutations, the sampling audit, auditor validation, every method's
one-run audit, every broken configuration.

    python benchmarks/audit_table.py                      # everything (about an hour on 2 CPU cores)
    python benchmarks/audit_table.py --sections step-power step-mutations sampling   # the step audit
    python benchmarks/audit_table.py --sections methods   # one section; results merge into the JSON
    python benchmarks/audit_table.py --render-only        # tables + figure from the saved JSON

Writes docs/audit_results.json (every number), docs/audit_tables.md (the tables) and docs/audit.png
(lower bound against reported epsilon for every method and broken configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

EPSILONS_VALIDATION = (1.0, 2.0, 4.0, 8.0)
EPSILONS_METHODS = (1.0, 4.0, 8.0)
CLAIMS_BROKEN = (1.0, 4.0)
SECTIONS = ("step-power", "step-mutations", "sampling", "one-run-power", "gaussian", "dpsgd", "methods",
            "broken")
CLAIMS_STEP = (1.0, 2.0, 4.0)
#: Injected bug sizes of the power table: sensitivity / noise ratio (1 = honest), injected as noise x 1/size.
BUG_SIZES = (1.0, 1.25, 1.5)


def _step_power(args):
    """Detection rate of ``args.repeats`` step audits per method x claim x bug size (noise x 1/size)."""
    from tfdpbnn.audit.step import METHODS, StepAuditor

    rows = []
    for method in METHODS:
        for e in CLAIMS_STEP:
            start = time.perf_counter()
            auditor = StepAuditor(method, e, steps=args.step_steps, seed=0)
            for size in BUG_SIZES:
                broken, argument = (None, None) if size == 1.0 else ("noise-2/3", 1.0 / size)
                audits = [auditor.audit(args.step_runs, broken, argument, assumption_free=False)
                          for _ in range(args.repeats)]
                rows.append({"method": method, "claim": e, "size": size, "repeats": args.repeats,
                             "flagged": sum(a.flagged for a in audits), "runs": args.step_runs,
                             "steps": args.step_steps, "claimed_mu": audits[0].claimed_mu,
                             "mu_lower_over_claim": [a.mu_lower / a.claimed_mu for a in audits],
                             "stated_power_1_5x": audits[0].power_1_5x,
                             "seconds": time.perf_counter() - start})
                start = time.perf_counter()
                print("step-power", {k: v for k, v in rows[-1].items() if k != "mu_lower_over_claim"},
                      flush=True)
    return rows


def _step_mutations(args):
    """One step audit per method x claim x mutation, and the honest one, with every bound."""
    from tfdpbnn.audit.mutations import STEP_MUTATIONS
    from tfdpbnn.audit.step import METHODS, StepAuditor

    rows = []
    for method in METHODS:
        start = time.perf_counter()
        for e in CLAIMS_STEP:
            auditor = StepAuditor(method, e, steps=args.step_steps, seed=1)
            for broken in (None, *STEP_MUTATIONS):
                rows.append(auditor.audit(args.step_runs, broken).as_dict())
                print("step-mutations", rows[-1], flush=True)
        for r in rows[-3 * (1 + len(STEP_MUTATIONS)):]:
            r["suite_seconds"] = time.perf_counter() - start
    return rows


def _sampling(args):
    """The sampling audit of poisson_batches, the replicas' shards and the broken pipelines.

    q = 0.01, n = 2000; 300 batches on one device, 1000 with replicas.
    """
    from tfdpbnn.audit.sampling import sampling_audit

    rows = []
    for replicas, broken in ((1, None), (1, "sample-rate-1.5x"), (1, "fixed-batches"), (2, None),
                             (2, "sample-rate-1.5x"), (2, "shard-overlap"), (4, None), (4, "shard-overlap")):
        start = time.perf_counter()
        r = sampling_audit(2000, 0.01, broken=broken, seed=0, replicas=replicas).as_dict()
        rows.append({**r, "broken": broken, "seconds": time.perf_counter() - start})
        print("sampling", rows[-1], flush=True)
    return rows


def _one_run_power(args):
    """Detection rates of the two one-run estimators against a claim, for bugs of several sizes.

    The one-run experiment of a full-batch run with Dirac gradient canaries: canary j's coordinate is
    released as ``mu b_j + N(0, 1)`` in units of its noise, ``b_j ~ Bernoulli(1/2)`` (exactly mu-GDP per
    canary, the best case for a one-run audit). The claim is the mu whose mu-GDP epsilon at delta 1e-5 is
    the claimed epsilon; a bug of size f runs at f mu. Flagged: Steinke et al.'s epsilon bound above the
    claimed epsilon, or Mahloujifar et al.'s mu bound above the claimed mu (95% confidence each).
    """
    from tfdpbnn.audit.bounds import one_run_epsilon
    from tfdpbnn.audit.experiment import gaussian_mu
    from tfdpbnn.audit.fdp_one_run import one_run_gdp_bound

    rng = np.random.default_rng(0)
    rows = []
    for claim in (1.0, 2.0, 4.0):
        mu_claim = gaussian_mu(claim, 1e-5)
        for size in (1.0, 1.5, 2.0, 3.0, 4.0):
            start = time.perf_counter()
            steinke, fdp = [], []
            for _ in range(args.repeats):
                included = rng.random(args.canaries) < 0.5
                scores = size * mu_claim * included + rng.normal(size=args.canaries)
                steinke.append(one_run_epsilon(scores, included, 1e-5).epsilon)
                fdp.append(one_run_gdp_bound(scores, included, 1e-5))
            rows.append({"claim_epsilon": claim, "claimed_mu": mu_claim, "size": size,
                         "repeats": args.repeats, "canaries": args.canaries,
                         "steinke_flagged": int(sum(e > claim for e in steinke)),
                         "fdp_flagged": int(sum(r.mu > mu_claim for r in fdp)),
                         "steinke_median_epsilon": float(np.median(steinke)),
                         "fdp_median_epsilon": float(np.median([r.epsilon for r in fdp])),
                         "seconds": time.perf_counter() - start})
            print("one-run-power", rows[-1], flush=True)
    return rows


def _save(path, results):
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def run_sections(args, results):
    """Run the audit sections in ``args.sections`` into ``results``, saving the JSON after every new row."""
    from tfdpbnn.audit import experiment

    step_sections = {"step-power": _step_power, "step-mutations": _step_mutations, "sampling": _sampling,
                     "one-run-power": _one_run_power}
    for name, fn in step_sections.items():
        if name in args.sections:
            start = time.perf_counter()
            results[name] = fn(args)
            results.setdefault("section_seconds", {})[name] = time.perf_counter() - start
            _save(args.json, results)
    if "gaussian" in args.sections:
        counts = sorted({args.runs, 200_000} | {r["runs"] for r in results.get("dpsgd", [])})
        results["gaussian"] = [experiment.validate_gaussian(e, num_runs=runs, seed=0)
                               for runs in counts for e in EPSILONS_VALIDATION]
        _save(args.json, results)
    if "dpsgd" in args.sections:  # rows of other run counts are kept: the table shows each count
        rows = [r for r in results.get("dpsgd", [])
                if r["runs"] != args.runs or r["epsilon"] not in args.validation_epsilons]
        for e in args.validation_epsilons:
            rows.append(experiment.validate_dpsgd(e, num_runs=args.runs, steps=args.steps, seed=0))
            print("dpsgd", rows[-1], flush=True)
            results["dpsgd"] = rows
            _save(args.json, results)
    if "methods" in args.sections:
        rows = []
        for method in experiment.METHODS:
            for e in EPSILONS_METHODS:
                rows.append(experiment.audit_method(method, e, num_canaries=args.canaries,
                                                    epochs=args.epochs))
                print("method", rows[-1], flush=True)
                results["methods"] = rows
                _save(args.json, results)
    if "broken" in args.sections:
        rows = []
        for broken in experiment.BROKEN:
            for e in CLAIMS_BROKEN:
                rows.append(experiment.audit_method(None, e, num_canaries=args.broken_canaries,
                                                    epochs=args.epochs, broken=broken))
                print("broken", rows[-1], flush=True)
                results["broken"] = rows
                _save(args.json, results)


def _f(x, digits=3):
    return "-" if x is None else f"{x:.{digits}g}"


def render(results, md_path, figure_path, doc_path="docs/audit.md"):
    """Write the tables of ``results`` to ``md_path`` and into ``doc_path``'s marked spots; draw the figure.

    The figure is drawn when ``results`` has method or broken-configuration rows.
    """
    from tfdpbnn.audit.experiment import BROKEN

    sections = {}
    lines = []
    if "step-power" in results:
        rows = results["step-power"]
        r0 = rows[0]
        lines += [f"### Step audit: detection rate in {r0['repeats']} repeated audits ({r0['runs']} pairs of "
                  f"runs, {r0['steps']} full-batch step(s) each, confidence 0.999)", "",
                  "Bug size = (sensitivity / noise) of the code that ran over the claim's (injected as noise "
                  "x 1 / size); 1 = the honest code. Median mu lower bound / claimed mu in parentheses.", "",
                  "| method | claim epsilon | claimed mu | size 1 (honest) | size 1.25 | size 1.5 | stated "
                  "power at 1.5x | s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for method in dict.fromkeys(r["method"] for r in rows):
            for e in dict.fromkeys(r["claim"] for r in rows if r["method"] == method):
                cell = {r["size"]: r for r in rows if r["method"] == method and r["claim"] == e}
                text = [f"{c['flagged']}/{c['repeats']} ({float(np.median(c['mu_lower_over_claim'])):.2f})"
                        for c in (cell[s] for s in BUG_SIZES)]
                lines.append(f"| {method} | {e:g} | {cell[1.0]['claimed_mu']:.3f} | " + " | ".join(text)
                             + f" | {cell[1.0]['stated_power_1_5x']:.3f} | "
                             f"{sum(c['seconds'] for c in cell.values()):.0f} |")
        sections["step-power"], lines = lines, []
    if "step-mutations" in results:
        rows = results["step-mutations"]
        lines += ["### Step audit of every mutation (one audit each; mu lower bound / claimed mu, FLAGGED "
                  "when > 1)", "", "| method | claim epsilon | honest | " + " | ".join(
                      dict.fromkeys(r["broken"] for r in rows if r["broken"])) + " | suite s |",
                  "| --- | --- | --- |" + " --- |" * (len({r['broken'] for r in rows}) - 1) + " --- |"]
        for method in dict.fromkeys(r["method"] for r in rows):
            for e in dict.fromkeys(r["claimed_epsilon"] for r in rows if r["method"] == method):
                cells = [r for r in rows if r["method"] == method and r["claimed_epsilon"] == e]
                text = [(f"{r['mu_lower'] / r['claimed_mu']:.2f}" if r["mu_lower"] < 1000 * r["claimed_mu"]
                         else "> 1000")
                        + (" FLAGGED" if r["flagged"] else "") for r in cells]
                lines.append(f"| {method} | {e:.3g} | " + " | ".join(text)
                             + f" | {cells[0]['suite_seconds']:.0f} |")
        sections["step-mutations"], lines = lines, []
    if "sampling" in results:
        lines += ["### Sampling audit (n = 2000, declared q = 0.01, alpha 0.001)", "",
                  "| pipeline | replicas | batches | participations (expected) | p total | p counts | "
                  "p batch sizes | in two batches of a step / on two replicas | flagged | power at 1.5x q | "
                  "power against one example in two shards | s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in results["sampling"]:
            replicas = r.get("replicas", 1)
            source = "poisson_batches" if replicas == 1 else "replica shards"
            overlap = r.get("power_shard_overlap")
            lines.append(f"| {r['broken'] or source} | {replicas} | {r['steps']} | {r['participations']} "
                         f"({r['expected_participations']:.0f}) | {r['p_total']:.3g} | {r['p_counts']:.3g} | "
                         f"{r['p_batch_sizes']:.3g} | "
                         + (f"{r['in_two_batches_of_a_step']} / {r['on_two_replicas']}" if replicas > 1
                            else "-")
                         + f" | {'yes' if r['flagged'] else 'no'} | {r['power_1_5x']:.3f} | "
                         + (f"{overlap:.4f}" if overlap is not None else "-") + f" | {r['seconds']:.1f} |")
        sections["sampling"], lines = lines, []
    if "one-run-power" in results:
        rows = results["one-run-power"]
        lines += [f"### One-run audit: detection rate in {rows[0]['repeats']} repeated audits "
                  f"({rows[0]['canaries']} canaries, delta 1e-5, 95% confidence)", "",
                  "Bug size f: the canaries' mechanism runs at f times the claimed mu. Median epsilon lower "
                  "bound in parentheses (f-DP: the epsilon of the mu-GDP claim it rejects).", "",
                  "| claim epsilon | claimed mu | bug size | Steinke et al. 2023: flagged (median bound) | "
                  "Mahloujifar et al. 2024, f-DP: flagged (median bound) | s |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| {r['claim_epsilon']:g} | {r['claimed_mu']:.3f} | {r['size']:g} | "
                         f"{r['steinke_flagged']}/{r['repeats']} ({r['steinke_median_epsilon']:.2f}) | "
                         f"{r['fdp_flagged']}/{r['repeats']} ({r['fdp_median_epsilon']:.2f}) | "
                         f"{r['seconds']:.0f} |")
        sections["one-run-power"], lines = lines, []
    if "gaussian" in results or "dpsgd" in results:
        lines += ["### Auditor validation: mechanisms with a known epsilon (delta 1e-5, 95% confidence)", "",
                  "| mechanism | runs | epsilon | (eps, delta) bound | ratio | GDP bound: mu_lb / mu | "
                  "GDP bound: epsilon | ratio |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in results.get("gaussian", []):
            lines.append(f"| Gaussian (numpy) | {r['runs']} | {r['epsilon']:g} | {_f(r['epsilon_lb'])} | "
                         f"{r['epsilon_lb'] / r['epsilon']:.2f} | {r['gdp_mu_lb'] / r['mu']:.2f} | "
                         f"{_f(r['gdp_epsilon_lb'])} | {r['gdp_epsilon_lb'] / r['epsilon']:.2f} |")
        for r in sorted(results.get("dpsgd", []), key=lambda r: (r["runs"], r["epsilon"])):
            lines.append(f"| DP-SGD full batch, compile/fit ({r['steps']} steps, {r['seconds']:.0f} s) | "
                         f"{r['runs']} | {_f(r['reported_epsilon'])} | {_f(r['epsilon_lb'])} | "
                         f"{r['epsilon_lb'] / r['reported_epsilon']:.2f} | {r['gdp_mu_lb'] / r['mu']:.2f} | "
                         f"{_f(r['gdp_epsilon_lb'])} | {r['gdp_epsilon_lb'] / r['reported_epsilon']:.2f} |")
        sections["validation"], lines = lines, []
    if "methods" in results:
        lines += ["### One-run audit of every method (DIGITS, delta = 1e-5, 95% confidence)", "",
                  "| method | budget | reported epsilon (rdp) | white-box lower bound | score | guesses "
                  "correct | black-box lower bound | black-box AUC | s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in results["methods"]:
            flag = " **VIOLATION**" if r["caught"] else ""
            lines.append(f"| {r['method']} | {r['budget']:g} | {_f(r['claimed_epsilon'], 4)} | "
                         f"{_f(r['lower_bound'])}{flag} | {r['score']} | {r['correct']}/{r['guesses']} | "
                         f"{_f(r.get('blackbox_lower_bound'))} | {_f(r.get('blackbox_auc'))} | "
                         f"{r['seconds']:.0f} |")
        sections["methods"], lines = lines, []
    if "broken" in results:
        lines += ["### Broken configurations (one run each; caught = lower bound above the claim)", "",
                  "| configuration | claimed epsilon | how the claim is computed | library's epsilon | "
                  "lower bound | caught | s |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in results["broken"]:
            lines.append(f"| {r['broken']} | {_f(r['claimed_epsilon'], 4)} | {r['claim_source']} | "
                         f"{_f(r['library_epsilon'], 4) if r['library_epsilon'] is not None else 'inf'} | "
                         f"{_f(r['lower_bound'])} | {'yes' if r['caught'] else 'NO'} | {r['seconds']:.0f} |")
        lines += ["", "Configurations: " + "; ".join(f"`{k}`: {v}" for k, v in BROKEN.items()) + "."]
        sections["broken"], lines = lines, []
    meta = results.get("meta", {})
    timed = results.get("section_seconds", {})
    times = "; ".join(f"{name} {seconds:.0f} s" for name, seconds in timed.items())
    footer = [f"_Machine: {meta['machine']}; command `{meta['command']}`; wall time of each section's last "
              f"run: {times or 'not recorded'} (sections run at different times; the methods, broken, "
              "gaussian and dpsgd sections time each row in its table)._"] if meta else []
    with open(md_path, "w") as f:
        f.write("\n\n".join(["<!-- generated by benchmarks/audit_table.py; do not edit -->"]
                            + ["\n".join(v) for v in sections.values()] + footer) + "\n")
    if os.path.exists(doc_path):  # docs/audit.md: replace each marked table with the new one
        with open(doc_path) as f:
            text = f.read()
        for name, body in sections.items():
            start, end = f"<!-- audit-table:{name} -->", f"<!-- /audit-table:{name} -->"
            if start in text and end in text:
                head, rest = text.split(start, 1)
                text = head + start + "\n" + "\n".join(body) + "\n" + end + rest.split(end, 1)[1]
        with open(doc_path, "w") as f:
            f.write(text)
    if "methods" in results or "broken" in results:
        _figure(results, figure_path)


def _figure(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    rows = results.get("methods", [])
    methods = sorted({r["method"] for r in rows}, key=[r["method"] for r in rows].index)
    for i, method in enumerate(methods):
        pts = [(r["claimed_epsilon"], r["lower_bound"]) for r in rows if r["method"] == method]
        offset = 1 + 0.01 * (i - len(methods) / 2)  # small horizontal jitter so markers do not hide
        ax.plot([p[0] * offset for p in pts], [p[1] for p in pts], "o-", label=method, alpha=0.8)
    broken = results.get("broken", [])
    for name, marker in zip(sorted({r["broken"] for r in broken}), "XPD*s", strict=False):
        pts = [(r["claimed_epsilon"], r["lower_bound"]) for r in broken if r["broken"] == name]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color="black", markersize=8, ls="none",
                label=f"BROKEN: {name}")
    if broken:
        from tfdpbnn.audit import one_run_epsilon_from_counts

        m = max(r["num_canaries"] for r in broken)
        cap = one_run_epsilon_from_counts(m, m, m, broken[0]["delta"], 1 - 0.05 / 12)
        ax.axhline(cap, color="grey", ls=":", lw=1, label=f"one-run ceiling (m = {m}, all guesses right)")
    lim = 9
    ax.plot([0, lim], [0, lim], "k--", lw=1, label="lower bound = claimed epsilon")
    ax.set_xlim(0, lim)
    ax.set_ylim(0, lim)
    ax.set_xlabel("claimed (reported) epsilon, delta = 1e-5")
    ax.set_ylabel("audited lower bound (95% confidence)")
    ax.set_title("One-run white-box audit on DIGITS (black: broken configurations)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    """Run the sections given on the command line (unless ``--render-only``); render tables and figure."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--runs", type=int, default=2000, help="multi-run audits: runs per epsilon")
    p.add_argument("--step-runs", type=int, default=20000, help="step audits: pairs of runs")
    p.add_argument("--step-steps", type=int, default=1, help="step audits: full-batch steps per run")
    p.add_argument("--repeats", type=int, default=20, help="step power table: audits per cell")
    p.add_argument("--validation-epsilons", type=float, nargs="+", default=list(EPSILONS_VALIDATION),
                   help="multi-run DP-SGD: the epsilons to validate at")
    p.add_argument("--steps", type=int, default=4, help="multi-run DP-SGD: steps per run")
    p.add_argument("--canaries", type=int, default=1000, help="one-run audits: gradient canaries")
    p.add_argument("--broken-canaries", type=int, default=2000,
                   help="one-run audits of broken configurations: gradient canaries")
    p.add_argument("--epochs", type=int, default=10, help="one-run audits: epochs (q = 0.2: 5 steps each)")
    p.add_argument("--json", default="docs/audit_results.json")
    p.add_argument("--md", default="docs/audit_tables.md")
    p.add_argument("--figure", default="docs/audit.png")
    p.add_argument("--doc", default="docs/audit.md", help="page whose marked tables are replaced")
    p.add_argument("--render-only", action="store_true")
    args = p.parse_args()
    results = {}
    if os.path.exists(args.json):
        with open(args.json) as f:
            results = json.load(f)
    if not args.render_only:
        run_sections(args, results)
        results["meta"] = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), no GPU",
                           "command": "python benchmarks/audit_table.py --sections SECTION ..."}
        _save(args.json, results)
    render(results, args.md, args.figure, args.doc)


if __name__ == "__main__":
    main()
