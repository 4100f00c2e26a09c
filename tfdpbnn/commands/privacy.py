"""``tfdpbnn privacy``: epsilon for a noise multiplier or noise multiplier for an epsilon, per accountant.

By every accountant of ``tfdpbnn.privacy``, for a DP-SGD run of N examples, batch B, E epochs. ``--plot``
redraws Ermis & Cemgil's (2017a) Figure 3 (sigma against epsilon) with the sound accountants beside the
paper's procedures.

``--statement PATH`` reads a saved privacy statement instead (``privacy.json``, or a SavedModel directory
holding ``assets/privacy.json``) and prints its two numbers: the run's own epsilon and the per-record
ledger bound, and which one to quote; for an export of weights with no privacy record, why, and that no
epsilon is claimed. ``--ledger PATH`` prints the per-record ledger of a privacy record
store file: its distinct record histories, each with its record count and composed epsilon.
"""

from __future__ import annotations

import argparse
import math
import warnings

# (sample rate, epochs) of the papers' settings, to place their reported sigmas on the plot.
PAPER_SETTINGS = {"MNIST": (0.01, 200), "DIGITS": (0.05, 100)}
# keys of ``tfdpbnn.privacy.paper.REPORTED_NOISE`` -> the paper, by author and year (docs/references.md).
PAPER_NAMES = {"000": "Ermis & Cemgil 2017a", "002": "Ermis & Cemgil 2017b"}


def add_parser(subparsers) -> None:
    """Register the ``privacy`` subcommand."""
    p = subparsers.add_parser("privacy", help="privacy accounting for a DP-SGD run (table, optional plot)",
                              description=__doc__)
    p.add_argument("--num-examples", type=int, help="training set size N")
    p.add_argument("--batch-size", type=int, help="(expected) batch size B; sample rate B/N")
    p.add_argument("--epochs", type=int, help="epochs E; steps = E * ceil(N/B)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--noise-multiplier", type=float,
                        help="sigma (noise std / clip norm): report epsilon")
    budget.add_argument("--epsilon", type=float, help="target epsilon: report the smallest sigma")
    p.add_argument("--delta", type=float, help="delta in (0, 1)")
    p.add_argument("--sampling", default="poisson", choices=("poisson", "shuffle"),
                   help="batch sampling the training used (default poisson)")
    p.add_argument("--neighboring", default="add_or_remove", choices=("add_or_remove", "replace_one"))
    p.add_argument("--accountants", default=None,
                   help="comma-separated accountant names (default: all registered)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="draw sigma against epsilon for every accountant and the paper's procedures")
    p.add_argument("--statement", default=None, metavar="PATH",
                   help="print a saved statement's run epsilon, ledger bound and which to quote "
                        "(privacy.json or a SavedModel directory); no other argument")
    p.add_argument("--ledger", default=None, metavar="STORE",
                   help="print a privacy record store's per-record ledger: each distinct record history, its "
                        "record count and composed epsilon (needs --delta)")
    p.set_defaults(func=run)


def _statement(path: str) -> int:
    """Print the run epsilon, the ledger bound and the quote of a saved privacy statement.

    Read by ``tfdpbnn.export.read_privacy``: any format version this release knows (files from before the
    version existed included); a newer version is an error that says to upgrade.
    """
    import os

    from tfdpbnn.export import read_privacy

    file = os.path.join(path, "assets", "privacy.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ValueError(f"--statement: no privacy statement at {file} (give privacy.json or a SavedModel "
                         "directory with assets/privacy.json)")
    try:
        statement = read_privacy(file)
    except ValueError as err:
        raise ValueError(f"--statement: {err}") from err
    if "no_record" in statement:   # an export of weights of which nothing was known
        print(statement["no_record"])
        print("no epsilon is claimed for these weights (guarantee: false)")
        _calibration_lines(statement, "covers the calibration alone, not the weights")
        return 0
    if "epsilon" not in statement and "run_epsilon" not in statement:
        held = ", ".join(k for k in statement if k != "format_version") or "nothing"
        raise ValueError(f"--statement: {file} states no epsilon of the weights (it holds only {held}): "
                         "an earlier tfdpbnn wrote this for a model without a DP optimizer, so the "
                         "calibration's epsilon in it bounds nothing about the training; export the model "
                         "again with this tfdpbnn")
    if "ledger_bound" not in statement:
        raise ValueError(f"--statement: {file} has no ledger_bound (a statement given as privacy=, or "
                         f"written by an earlier tfdpbnn); its epsilon {statement.get('epsilon')} holds only "
                         "for the weights its run produced")
    def number(entry, key):  # privacy.json writes an infinite epsilon as null plus "<key>_is_infinite"
        value = entry[key]
        return "infinite" if value in ("inf", math.inf) or entry.get(f"{key}_is_infinite") \
            else f"{value:.4g}"

    bound = statement["ledger_bound"]
    if bound.get("no_guarantee"):
        shown = f"infinite ({bound['no_guarantee']})"
    elif bound.get("epsilon_is_infinite"):
        shown = "infinite"
    elif bound["epsilon"] is None:
        shown = f"unavailable ({bound.get('unavailable')})"
    else:
        shown = number(bound, "epsilon")
    print(f"run epsilon:  {number(statement, 'run_epsilon')} (delta {statement['delta']:g}, "
          f"{statement['accountant']}): valid for weights trained from scratch in the recorded run")
    print(f"ledger bound: {shown} over {bound['records']} records: valid for any weights derived from any "
          "recorded run on them")
    quote = statement["quote"]
    print(f"quote: {quote['which']} = {number(quote, 'epsilon')} ({quote['note']})")
    if statement.get("statement_source"):   # exported without a DP optimizer
        print(f"source: {statement['statement_source']}")
    _calibration_lines(statement, "composed into the numbers above" if statement.get("releases") else
                       "listed beside the statement")
    return 0


def _calibration_lines(statement: dict, how: str) -> None:
    """Print each calibration release a statement lists (method, epsilon, delta) and ``how`` it counts."""
    for item in statement.get("calibration") or []:
        cost = item.get("privacy") or {}
        epsilon = "infinite" if cost.get("epsilon_is_infinite") else cost.get("epsilon")
        shown = epsilon if isinstance(epsilon, str) or epsilon is None else f"{epsilon:.4g}"
        print(f"calibration: {item.get('method')} epsilon {shown} (delta {cost.get('delta')}): {how}")


def _ledger(path: str, delta) -> int:
    """Print the per-record ledger's distinct histories with their record counts and composed epsilons."""
    import os

    from tfdpbnn._validation import check_open_unit
    from tfdpbnn.record.record_ledger import RecordLedger

    if delta is None:
        raise ValueError("--delta: --ledger needs the delta to report epsilon at")
    check_open_unit("--delta", delta)
    if not os.path.isfile(path):
        raise ValueError(f"--ledger: no privacy record store at {path}")
    ledger = RecordLedger(path)
    histories = sorted(ledger.record_epsilons(None, delta), key=lambda h: -h[1])
    budget = ledger.budget()
    print(f"per-record ledger of {path}: {sum(c for c, _ in histories)} records in {len(histories)} "
          f"histories; budget: {'none' if budget is None else budget}")
    print("| records | composed epsilon (rdp) |")
    print("| --- | --- |")
    for count, epsilon in histories:
        print(f"| {count} | {epsilon:.4g} |")
    return 0


def _setting(args) -> tuple[float, int]:
    from tfdpbnn._validation import check_open_unit, check_positive_int
    from tfdpbnn.privacy import steps_per_epoch

    n = check_positive_int("--num-examples", args.num_examples)
    b = check_positive_int("--batch-size", args.batch_size)
    if b > n:
        raise ValueError(f"--batch-size must be in [1, --num-examples={n}]; got {b}")
    epochs = check_positive_int("--epochs", args.epochs)
    check_open_unit("--delta", args.delta)
    q = b / n
    return q, epochs * steps_per_epoch(q)


def _row(name, args, q, steps):
    """(value, approximate, warned) for one accountant: epsilon for --noise-multiplier, else sigma."""
    from tfdpbnn import privacy
    from tfdpbnn.privacy.budget import NEIGHBORING, SENSITIVITY

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.noise_multiplier is not None:
            sigma = args.noise_multiplier
            value = None
        else:
            sigma = value = privacy.calibrate_noise(args.epsilon, args.delta, q, steps, accountant=name,
                                                    neighboring=args.neighboring, sampling=args.sampling)
        acc = privacy.get_accountant(name, neighboring_relation=NEIGHBORING[args.neighboring])
        acc.compose(privacy.dp_sgd_event(sigma / SENSITIVITY[args.neighboring], q, steps, args.sampling))
        eps = acc.get_epsilon(args.delta)
    approximate = bool(getattr(acc, "is_approximate", name not in privacy.sound_accountants()))
    return (eps if value is None else value), approximate, bool(caught)


def run(args: argparse.Namespace) -> int:
    """Print the table (and write the plot)."""
    import dp_accounting

    from tfdpbnn import privacy
    from tfdpbnn._validation import check_choice, check_positive
    from tfdpbnn.privacy import paper

    if args.statement is not None:
        return _statement(args.statement)
    if args.ledger is not None:
        return _ledger(args.ledger, args.delta)
    needed = (("--num-examples", args.num_examples), ("--batch-size", args.batch_size),
              ("--epochs", args.epochs), ("--delta", args.delta))
    missing = [flag for flag, value in needed if value is None]
    if args.noise_multiplier is None and args.epsilon is None:
        missing.append("--noise-multiplier or --epsilon")
    if missing:
        raise ValueError(f"{', '.join(missing)}: required for the accounting table (or give --statement or "
                         "--ledger)")
    q, steps = _setting(args)
    if args.noise_multiplier is not None:
        check_positive("--noise-multiplier", args.noise_multiplier)
    else:
        check_positive("--epsilon", args.epsilon)
    names = privacy.available_accountants() if args.accountants is None else tuple(
        a.strip() for a in args.accountants.split(",") if a.strip())
    for name in names:
        check_choice("--accountants", name, privacy.available_accountants())
    what = "epsilon" if args.noise_multiplier is not None else "noise multiplier"
    given = (f"noise multiplier {args.noise_multiplier:g}" if args.noise_multiplier is not None
             else f"epsilon {args.epsilon:g}")
    print(f"DP-SGD: N={args.num_examples}, batch {args.batch_size} (q={q:.6g}), {args.epochs} epochs = "
          f"{steps} steps, {args.sampling} sampling, {args.neighboring}, delta={args.delta:g}, {given}")
    print(f"| accountant | {what} | guarantee |")
    print("| --- | --- | --- |")
    notes = []
    for name in names:
        try:
            value, approximate, warned = _row(name, args, q, steps)
        except dp_accounting.UnsupportedEventError:
            print(f"| {name} | - | cannot bound this run ({args.sampling}, {args.neighboring}) |")
            continue
        kind = "APPROXIMATE (central-limit)" if approximate else "upper bound"
        if warned:
            kind += " *"
            notes.append("* GDP's central-limit approximation may under-report epsilon by >5% here.")
        print(f"| {name} | {value:.4g} | {kind} |")
    if args.epsilon is not None and args.sampling == "poisson" and args.neighboring == "add_or_remove":
        for label, sigma in (
                ("Ermis & Cemgil (2017a) zCDP (J = steps)",
                 paper.zcdp_noise_multiplier(args.epsilon, args.delta, q, steps)),
                ("Ermis & Cemgil (2017a) zCDP (J = epochs)", paper.zcdp_noise_multiplier(
                    args.epsilon, args.delta, q, steps, compositions=args.epochs)),
                ("Ermis & Cemgil (2017a) AC", paper.ac_noise_multiplier(args.epsilon, args.delta, q, steps))):
            print(f"| {label} | {sigma:.4g} | NOT a guarantee (see docs/privacy.md) |")
    for note in dict.fromkeys(notes):
        print(note)
    if args.sampling == "shuffle":
        print("shuffle: no amplification assumed (each example in one noised sum per epoch); Poisson "
              "sampling gives a far smaller epsilon at the same noise.")
    if args.plot:
        _plot(args, q, steps, names)
        print(f"plot written to {args.plot}")
    return 0


def _plot(args, q, steps, names) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from tfdpbnn import privacy
    from tfdpbnn.privacy import paper

    eps_grid = np.geomspace(0.1, 10.0, 7)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            try:
                sig = [privacy.calibrate_noise(float(e), args.delta, q, steps, accountant=name,
                                               neighboring=args.neighboring, sampling=args.sampling)
                       for e in eps_grid]
            except Exception as err:  # noqa: BLE001 - an accountant that cannot bound the run is skipped
                print(f"plot: skipping {name}: {err}")
                continue
            style = ":" if name not in privacy.sound_accountants() else "-"
            label = name + ("" if name in privacy.sound_accountants() else " (approximate)")
            ax.plot(eps_grid, sig, style, marker="o", ms=3, label=label)
        if args.sampling == "poisson" and args.neighboring == "add_or_remove":
            ax.plot(eps_grid, [paper.zcdp_noise_multiplier(float(e), args.delta, q, steps) for e in eps_grid],
                    "--", color="gray", label="Ermis & Cemgil (2017a) zCDP, J=steps (not a guarantee)")
            ax.plot(eps_grid, [paper.zcdp_noise_multiplier(float(e), args.delta, q, steps,
                                                           compositions=args.epochs) for e in eps_grid],
                    "--", color="red", label="Ermis & Cemgil (2017a) zCDP, J=epochs (not a guarantee)")
            ax.plot(eps_grid, [paper.ac_noise_multiplier(float(e), args.delta, q, steps) for e in eps_grid],
                    "--", color="black", label="Ermis & Cemgil (2017a) AC (not a guarantee)")
            for (pid, data, eps), sigmas in paper.REPORTED_NOISE.items():
                q_paper, epochs_paper = PAPER_SETTINGS[data]
                if math.isclose(q, q_paper, rel_tol=0.02) and args.epochs == epochs_paper:
                    ax.plot([eps], [sigmas["zcdp"]], "r*", ms=10,
                            label=f"{PAPER_NAMES[pid]} reported zCDP sigma ({data}, eps {eps:g})")
                    ax.plot([eps], [sigmas["ac"]], "k*", ms=10,
                            label=f"{PAPER_NAMES[pid]} reported AC sigma ({data}, eps {eps:g})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("noise multiplier sigma")
    ax.set_title(f"N={args.num_examples}, B={args.batch_size}, {args.epochs} epochs, delta={args.delta:g}, "
                 f"{args.sampling}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    plt.close(fig)
