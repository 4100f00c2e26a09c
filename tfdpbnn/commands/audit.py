"""``tfdpbnn audit``: a measured lower bound on epsilon beside the accountant's upper bound (DIGITS).

One-run audit (default; Steinke, Nasr & Jagielski 2023): one training run of ``--method``'s DIGITS model
with ``--num-canaries`` Dirac gradient canaries, each included with probability 1/2, through compile/fit.
``--broken NAME`` runs a deliberately broken configuration instead and says whether the audit catches it.
``--multi-run``: the multi-run audit of full-batch DP-SGD (``--runs`` runs of ``--steps`` steps). See
docs/audit.md.
"""

from __future__ import annotations

import json

from tfdpbnn._validation import check_open_unit, check_positive, check_positive_int

# The same names as tfdpbnn.audit.experiment.METHODS / BROKEN (kept here so building the parser imports no
# TensorFlow; tests/test_audit_cli.py checks they agree).
METHODS = ("dpsgd", "dpadam", "dpvd", "dpsgld", "sidp-ln", "sidp-bn", "dpbbp", "dpmcdropout")
BROKEN = ("sigma0", "sidp-paper", "num-examples", "unclipped")


def add_parser(subparsers) -> None:
    """Register the ``audit`` subcommand."""
    p = subparsers.add_parser("audit", help="empirical lower bound on epsilon (privacy audit) on DIGITS",
                              description=__doc__)
    p.add_argument("--method", default="dpsgd", choices=METHODS, help="method to audit (default dpsgd)")
    p.add_argument("--epsilon", type=float, required=True, help="privacy budget the noise is calibrated to")
    p.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument("--num-canaries", type=int, default=1000, help="one-run audit: canaries m (default 1000)")
    p.add_argument("--epochs", type=int, default=20, help="one-run audit: epochs (default 20)")
    p.add_argument("--sample-rate", type=float, default=0.2, help="one-run audit: Poisson rate q (0.2)")
    p.add_argument("--broken", default=None, choices=BROKEN,
                   help="audit a deliberately broken configuration instead of --method (docs/audit.md)")
    p.add_argument("--multi-run", action="store_true",
                   help="multi-run audit of full-batch DP-SGD instead of the one-run audit")
    p.add_argument("--runs", type=int, default=2000, help="multi-run: training runs, half with the canary")
    p.add_argument("--steps", type=int, default=4, help="multi-run: steps per run (default 4)")
    p.add_argument("--num-examples", type=int, default=255, help="multi-run: DIGITS examples (default 255)")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound (0.95)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write the result as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    """Entry point of ``tfdpbnn audit``: run the one-run (or ``--multi-run``) audit; print (and save) it."""
    from tfdpbnn.audit import experiment

    check_positive("--epsilon", args.epsilon)
    check_open_unit("--delta", args.delta)
    check_open_unit("--confidence", args.confidence)
    if args.multi_run:
        runs = check_positive_int("--runs", args.runs)
        if runs < 4 or runs % 2:
            raise ValueError(f"--runs must be an even integer >= 4, got {runs}")
        result = experiment.validate_dpsgd(
            args.epsilon, args.delta, runs, check_positive_int("--steps", args.steps),
            check_positive_int("--num-examples", args.num_examples), seed=args.seed,
            confidence=args.confidence)
        print(f"multi-run audit, full-batch DP-SGD: {result['runs']} runs x {result['steps']} steps, "
              f"sigma {result['noise_multiplier']:.4g} ({result['seconds']:.1f} s)")
        print(f"reported epsilon (pld): {result['reported_epsilon']:.4g}   mu-GDP: {result['mu']:.4g}")
        print(f"lower bound, (epsilon, delta): {result['epsilon_lb']:.4g}")
        print(f"lower bound, mu-GDP claim:     mu >= {result['gdp_mu_lb']:.4g}, "
              f"epsilon >= {result['gdp_epsilon_lb']:.4g}   (confidence {args.confidence})")
    else:
        if not 0 < args.sample_rate <= 1:
            raise ValueError(f"--sample-rate must be in (0, 1], got {args.sample_rate!r}")
        result = experiment.audit_method(
            args.method, args.epsilon, args.delta, check_positive_int("--num-canaries", args.num_canaries),
            check_positive_int("--epochs", args.epochs), args.sample_rate, seed=args.seed, broken=args.broken,
            confidence=args.confidence)
        what = f"BROKEN {args.broken}" if args.broken else result["method"]
        print(f"one-run audit of {what}: {result['num_canaries']} canaries, {result['steps']} steps, "
              f"score {result['score']} ({result['seconds']:.1f} s)")
        print(f"claimed epsilon: {result['claimed_epsilon']:.4g}  [{result['claim_source']}]")
        print(f"lower bound:     {result['lower_bound']:.4g}  ({result['correct']}/{result['guesses']} "
              f"guesses correct; confidence {args.confidence})")
        if args.broken:
            print("CAUGHT: lower bound above the claim" if result["caught"] else "NOT caught")
        elif result["caught"]:
            print("VIOLATION: the lower bound exceeds the reported epsilon")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
