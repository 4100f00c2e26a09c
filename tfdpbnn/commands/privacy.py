"""``tfdpbnn privacy``: epsilon for a noise multiplier or noise multiplier for an epsilon, per accountant.

By every accountant of ``tfdpbnn.privacy``, for a DP-SGD run of N examples, batch B, E epochs. ``--plot``
redraws Ermis & Cemgil's (2017a) Figure 3 (sigma against epsilon) with the sound accountants beside the
paper's procedures. ``--saved-model DIR`` instead prints the privacy record of an export
(``DIR/assets/privacy.json``, read by ``tfdpbnn.read_privacy``: files older than the format version are
read, a newer version is an error that says to upgrade).
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
    p.add_argument("--saved-model", default=None, metavar="DIR",
                   help="print the privacy record of an export (DIR/assets/privacy.json) and nothing else")
    p.add_argument("--num-examples", type=int, help="training set size N (required without --saved-model)")
    p.add_argument("--batch-size", type=int, help="(expected) batch size B; sample rate B/N (required)")
    p.add_argument("--epochs", type=int, help="epochs E; steps = E * ceil(N/B) (required)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--noise-multiplier", type=float,
                        help="sigma (noise std / clip norm): report epsilon")
    budget.add_argument("--epsilon", type=float, help="target epsilon: report the smallest sigma")
    p.add_argument("--delta", type=float, help="delta in (0, 1) (required)")
    p.add_argument("--sampling", default="poisson", choices=("poisson", "shuffle"),
                   help="batch sampling the training used (default poisson)")
    p.add_argument("--neighboring", default="add_or_remove", choices=("add_or_remove", "replace_one"))
    p.add_argument("--accountants", default=None,
                   help="comma-separated accountant names (default: all registered)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="draw sigma against epsilon for every accountant and the paper's procedures")
    p.set_defaults(func=run)


# The arguments of a run's accounting: all required without --saved-model, none allowed with it.
_RUN_ARGUMENTS = (("--num-examples", "num_examples"), ("--batch-size", "batch_size"), ("--epochs", "epochs"),
                  ("--delta", "delta"))


def _check_mode(args) -> None:
    given = [flag for flag, attr in _RUN_ARGUMENTS + (("--noise-multiplier", "noise_multiplier"),
                                                      ("--epsilon", "epsilon"), ("--plot", "plot"),
                                                      ("--accountants", "accountants"))
             if getattr(args, attr) is not None]
    if args.saved_model is not None:
        if given:
            raise ValueError(f"--saved-model prints a recorded run; it takes none of {', '.join(given)}")
        return
    missing = [flag for flag, attr in _RUN_ARGUMENTS if getattr(args, attr) is None]
    if args.noise_multiplier is None and args.epsilon is None:
        missing.append("--noise-multiplier or --epsilon")
    if missing:
        raise ValueError(f"{', '.join(missing)} required (or --saved-model DIR to print an export's record)")


def _print_record(path: str) -> int:
    import json

    from tfdpbnn.export import read_privacy

    try:
        record = read_privacy(path)
    except FileNotFoundError as err:
        raise ValueError(f"--saved-model: {err}") from err
    version = record["format_version"]
    note = " (written before the format had a version; same fields)" if version == 0 else ""
    print(f"privacy record of {path}, format version {version}{note}:")
    print(json.dumps(record, indent=2, sort_keys=True))
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

    _check_mode(args)
    if args.saved_model is not None:
        return _print_record(args.saved_model)
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
