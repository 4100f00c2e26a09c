"""``tfdpbnn audit``: a measured lower bound on privacy beside the claimed one, and the audit's power.

``--mode step`` (default): the step audit of ``--method`` (``tfdpbnn.audit.step_audit``): ``--runs`` pairs
of runs of ``--steps`` full-batch steps with and without a white-box canary, through the method's own
optimizer, vectorized (seconds). ``--broken NAME`` injects a deliberately broken mechanism
(``tfdpbnn.audit.mutations``) and shows whether the audit flags it. ``--mode sampling``: the conformance test
of Poisson batches (``tfdpbnn.audit.sampling``; ``--broken`` a broken pipeline; ``--fit`` the batches a real
``model.fit`` consumed, ``tfdpbnn.audit.ParticipationRecorder``). ``--mode one-run``: one training run of the
method's DIGITS model with ``--num-canaries`` canaries (Steinke, Nasr & Jagielski 2023; ``--broken`` one of
its broken configurations; ``--estimator fdp`` the f-DP bound of Mahloujifar, Melis & Chaudhuri 2024 for a
full-batch run). ``--mode multi-run`` (or ``--multi-run``): the multi-run
audit of full-batch DP-SGD through ``model.fit`` (DP-SGD only). ``--mode traced`` (also run after the step
audit of ``--mode step``): the traced-step audit (``tfdpbnn.audit.traced``) of the method's model, or with
``--model PATH`` of a saved ``.keras`` model compiled with its DP optimizer: the noise, the one-example
sensitivity and the accounting of the train function ``model.fit`` runs. See docs/audit.md.
"""

from __future__ import annotations

import json

# The same names as tfdpbnn.audit.experiment.METHODS / BROKEN, tfdpbnn.audit.mutations.MUTATIONS and
# tfdpbnn.audit.sampling.SAMPLING_MUTATIONS (kept here so building the parser imports no TensorFlow;
# tests/test_audit_cli.py checks they agree).
METHODS = ("dpsgd", "dpadam", "dpvd", "dpsgld", "sidp-ln", "sidp-bn", "dpbbp", "dpmcdropout")
BROKEN = ("sigma0", "sidp-paper", "num-examples", "unclipped")
STEP_BROKEN = ("noise-2/3", "clip-1.5x", "double-count", "unclipped-layer", "reused-seed")
SAMPLING_BROKEN = ("sample-rate-1.5x", "shard-overlap", "fixed-batches")
MODES = ("step", "sampling", "one-run", "multi-run", "traced")
_BROKEN_BY_MODE = {"step": STEP_BROKEN, "sampling": SAMPLING_BROKEN, "one-run": BROKEN, "multi-run": (),
                   "traced": ()}
#: The options each mode reads (besides --method, --epsilon, --delta, --broken, --confidence, --seed, --json).
_OPTIONS_BY_MODE = {"step": ("runs", "steps"),
                    "sampling": ("steps", "sample_rate", "num_examples", "replicas", "fit"),
                    "one-run": ("num_canaries", "epochs", "sample_rate", "estimator"),
                    "multi-run": ("runs", "steps", "num_examples"),
                    "traced": ("model", "calls")}


def add_parser(subparsers) -> None:
    """Register the ``audit`` subcommand."""
    p = subparsers.add_parser("audit", help="empirical lower bound on epsilon (privacy audit)",
                              description=__doc__)
    p.add_argument("--method", default=None, choices=METHODS, help="method to audit (default dpsgd)")
    p.add_argument("--epsilon", type=float, default=None,
                   help="privacy budget the noise is calibrated to (required, except with --model)")
    p.add_argument("--model", default=None, metavar="PATH.keras",
                   help="traced: audit this saved model, compiled with its tfdpbnn DP optimizer")
    p.add_argument("--calls", type=int, default=None,
                   help="traced: traced calls of the noise check (default: power 0.99 against 0.9x the std)")
    p.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    p.add_argument("--mode", default=None, choices=MODES,
                   help="which audit (default step, then traced; traced with --model)")
    p.add_argument("--broken", default=None, choices=sorted(set(STEP_BROKEN + SAMPLING_BROKEN + BROKEN)),
                   help="audit a deliberately broken variant; step: " + ", ".join(STEP_BROKEN)
                   + "; sampling: " + ", ".join(SAMPLING_BROKEN) + "; one-run: " + ", ".join(BROKEN))
    p.add_argument("--runs", type=int, default=None,
                   help="step: pairs of runs (default 20000); multi-run: runs, half with the canary (2000)")
    p.add_argument("--steps", type=int, default=None,
                   help="step: full-batch steps per run (default 1); multi-run: (default 4); sampling: "
                        "batches drawn (default 300; 1000 with --replicas)")
    p.add_argument("--num-canaries", type=int, default=None, help="one-run audit: canaries m (default 1000)")
    p.add_argument("--epochs", type=int, default=None, help="one-run audit: epochs (default 20)")
    p.add_argument("--sample-rate", type=float, default=None,
                   help="one-run audit: Poisson rate q (0.2); sampling: declared q (0.01)")
    p.add_argument("--fit", action="store_const", const=True, default=None,
                   help="sampling: audit the batches a real model.fit consumed (ParticipationRecorder: "
                        "DP-SGD on a linear model, one epoch of --steps batches), not the pipeline alone")
    p.add_argument("--estimator", default=None, choices=("steinke", "fdp"),
                   help="one-run: steinke (Steinke et al. 2023; default) or fdp (Mahloujifar et al. 2024, "
                        "mu-GDP claims; full-batch runs only: --sample-rate 1)")
    p.add_argument("--multi-run", action="store_true", help="same as --mode multi-run")
    p.add_argument("--num-examples", type=int, default=None,
                   help="multi-run: DIGITS examples (default 255); sampling: n (default 2000)")
    p.add_argument("--replicas", type=int, default=None,
                   help="sampling: audit the shards of R replicas (distributed_poisson_batches; default 1)")
    p.add_argument("--confidence", type=float, default=None,
                   help="confidence of the lower bound (step: 0.999; others: 0.95)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write the result as JSON")
    p.set_defaults(func=run)


def _check_arguments(args, mode) -> None:
    from tfdpbnn._validation import check_open_unit, check_positive

    if args.model is not None:
        if args.epsilon is not None or args.method is not None:
            raise ValueError("--model: the saved model's optimizer holds its noise and method; --epsilon and "
                             "--method do not apply")
    elif args.epsilon is None:
        raise ValueError("--epsilon is required (except with --model)")
    else:
        check_positive("--epsilon", args.epsilon)
    args.method = args.method or "dpsgd"
    check_open_unit("--delta", args.delta)
    if args.confidence is not None:
        check_open_unit("--confidence", args.confidence)
    for option in ("runs", "steps", "num_canaries", "epochs", "sample_rate", "num_examples", "replicas",
                   "estimator", "fit", "model", "calls"):
        if getattr(args, option) is not None and option not in _OPTIONS_BY_MODE[mode]:
            flag = "--" + option.replace("_", "-")
            raise ValueError(f"{flag} does not apply to --mode {mode} (it reads: "
                             + ", ".join("--" + o.replace("_", "-") for o in _OPTIONS_BY_MODE[mode]) + ")")
    if args.broken is not None and args.broken not in _BROKEN_BY_MODE[mode]:
        allowed = ", ".join(_BROKEN_BY_MODE[mode]) or "none"
        raise ValueError(f"--broken {args.broken} does not apply to --mode {mode} (allowed: {allowed})")
    if mode == "multi-run" and args.method != "dpsgd":
        raise ValueError(f"--method {args.method}: --mode multi-run audits full-batch DP-SGD only; the step "
                         "audit (--mode step, the default) audits every method")
    if mode == "sampling" and args.method != "dpsgd":
        raise ValueError("--method: --mode sampling audits the data pipeline (poisson_batches), which every "
                         "method shares; leave --method at its default")


def _probability(p: float) -> str:
    """A probability with three decimals; above 0.999 as "> 0.999" (not a rounded 1.000)."""
    return "> 0.999" if p > 0.999 else f"{p:.3f}"


def _step(args) -> dict:
    from tfdpbnn._validation import check_positive_int
    from tfdpbnn.audit.mutations import MUTATIONS
    from tfdpbnn.audit.step import step_audit

    runs = check_positive_int("--runs", 20000 if args.runs is None else args.runs)
    if runs < 3:
        raise ValueError(f"--runs must be >= 3, got {runs}")
    steps = check_positive_int("--steps", 1 if args.steps is None else args.steps)
    confidence = 0.999 if args.confidence is None else args.confidence
    r = step_audit(args.method, args.epsilon, args.delta, runs, steps, broken=args.broken,
                   confidence=confidence, seed=args.seed)
    what = r.method + (f", BROKEN {args.broken}: {MUTATIONS[args.broken][0]}" if args.broken else "")
    print(f"step audit of {what}")
    print(f"  {r.runs} pairs of runs x {r.steps} full-batch step(s), sigma {r.noise_multiplier:.4g} "
          f"({r.seconds:.1f} s)")
    print(f"claimed:  mu = {r.claimed_mu:.4g}-GDP, epsilon {r.claimed_epsilon:.4g} at delta {r.delta:g} "
          f"(the optimizer's PLD epsilon: {r.library_epsilon:.4g})")
    print(f"measured: mu >= {r.mu_lower:.4g} (estimate {r.mu_hat:.4g}; confidence {r.confidence}), "
          f"epsilon >= {r.epsilon_lower:.4g} for a GDP mechanism; {r.mu_lower / r.claimed_mu:.3g}x the claim")
    print(f"          assumption-free (Clopper-Pearson, confidence 0.95): mu >= {r.tradeoff_mu_lower:.4g}, "
          f"(epsilon, delta) epsilon >= {r.clopper_pearson_epsilon_lower:.4g}")
    print("power:    would have flagged a 1.5x sensitivity error with probability",
          _probability(r.power_1_5x))
    print("FLAGGED: the measured lower bound exceeds the claim" if r.flagged
          else "passed: the measured lower bound is within the claim")
    result = r.as_dict()
    if args.broken == "unclipped-layer":
        print("traced-step audit: not run (unclipped-layer acts on the step audit's canary layer)")
        return result
    print()
    result["traced"] = _traced(args)
    return result


def _traced(args) -> dict:
    import contextlib

    from tfdpbnn._validation import check_positive_int
    from tfdpbnn.audit.mutations import inject_bug
    from tfdpbnn.audit.traced import example_batch, method_model, traced_audit

    calls = None if args.calls is None else check_positive_int("--calls", args.calls)
    if args.model is not None:
        import tensorflow as tf

        model = tf.keras.models.load_model(args.model)
        x, y = example_batch(model)
        what = args.model
    else:
        model, x, y = method_model(args.method, args.epsilon, args.delta, args.seed)
        what = f"{args.method} at epsilon {args.epsilon:g}"
    with inject_bug(args.broken) if args.broken else contextlib.nullcontext():
        r = traced_audit(model, x, y, calls=calls, seed=args.seed,
                         alpha=1e-3 if args.confidence is None else 1.0 - args.confidence)
    print(f"traced-step audit of {what}" + (f", BROKEN {args.broken}" if args.broken else ""))
    print(r.summary())
    return r.as_dict()


def _sampling(args) -> dict:
    from tfdpbnn._validation import check_positive_int
    from tfdpbnn.audit.sampling import SAMPLING_MUTATIONS, sampling_audit

    n = check_positive_int("--num-examples", 2000 if args.num_examples is None else args.num_examples)
    q = 0.01 if args.sample_rate is None else args.sample_rate
    if not 0 < q <= 1:
        raise ValueError(f"--sample-rate must be in (0, 1], got {q!r}")
    steps = None if args.steps is None else check_positive_int("--steps", args.steps)
    alpha = 1e-3 if args.confidence is None else 1.0 - args.confidence
    replicas = check_positive_int("--replicas", 1 if args.replicas is None else args.replicas)
    if args.fit:
        from tfdpbnn.audit.participation import fit_sampling_audit

        if replicas > 1 or args.broken not in (None, "sample-rate-1.5x"):
            raise ValueError("--fit audits a single-device fit: no --replicas, and --broken only "
                             "sample-rate-1.5x")
        r = fit_sampling_audit(n, q, 300 if steps is None else steps, broken=args.broken, seed=args.seed,
                               alpha=alpha)
    else:
        r = sampling_audit(n, q, steps, broken=args.broken, seed=args.seed, alpha=alpha, replicas=replicas)
    source = "poisson_batches" if replicas == 1 else f"the shards of {replicas} replicas"
    source += " as model.fit consumed them" if args.fit else ""
    what = f"BROKEN {args.broken}: {SAMPLING_MUTATIONS[args.broken]}" if args.broken else source
    what += " (the batches model.fit consumed)" if args.fit and args.broken else ""
    print(f"sampling audit of {what}: n {r.num_examples}, declared q {r.sample_rate:g}, {r.steps} batches")
    print(f"participations {r.participations} (expected {r.expected_participations:.1f}); p-values: total "
          f"{r.p_total:.3g}, per-example counts {r.p_counts:.3g}, batch sizes {r.p_batch_sizes:.3g}")
    if replicas > 1:
        print(f"shards: {r.in_two_batches_of_a_step} examples in two replicas' batches of one step, "
              f"{r.on_two_replicas} drawn by two replicas (both must be 0)")
    print("power:    would have flagged a 1.5x sample-rate error with probability",
          _probability(r.power_1_5x))
    if replicas > 1:
        print("power:    would have flagged one example placed in two shards with probability",
              _probability(r.power_shard_overlap))
    print("FLAGGED: the batches do not follow Poisson sampling at the declared rate" if r.flagged
          else "passed: the batches are consistent with Poisson sampling at the declared rate")
    return r.as_dict()


def _multi_run(args) -> dict:
    from tfdpbnn._validation import check_positive_int
    from tfdpbnn.audit import experiment

    runs = check_positive_int("--runs", 2000 if args.runs is None else args.runs)
    if runs < 4 or runs % 2:
        raise ValueError(f"--runs must be an even integer >= 4, got {runs}")
    confidence = 0.95 if args.confidence is None else args.confidence
    steps = check_positive_int("--steps", 4 if args.steps is None else args.steps)
    n = check_positive_int("--num-examples", 255 if args.num_examples is None else args.num_examples)
    result = experiment.validate_dpsgd(args.epsilon, args.delta, runs, steps, n, seed=args.seed,
                                       confidence=confidence)
    print(f"multi-run audit, full-batch DP-SGD: {result['runs']} runs x {result['steps']} steps, "
          f"sigma {result['noise_multiplier']:.4g} ({result['seconds']:.1f} s)")
    print(f"reported epsilon (pld): {result['reported_epsilon']:.4g}   mu-GDP: {result['mu']:.4g}")
    print(f"lower bound, (epsilon, delta): {result['epsilon_lb']:.4g}")
    print(f"lower bound, mu-GDP claim:     mu >= {result['gdp_mu_lb']:.4g}, "
          f"epsilon >= {result['gdp_epsilon_lb']:.4g}   (confidence {confidence})")
    return result


def _one_run(args) -> dict:
    from tfdpbnn._validation import check_positive_int
    from tfdpbnn.audit import experiment

    q = 0.2 if args.sample_rate is None else args.sample_rate
    if not 0 < q <= 1:
        raise ValueError(f"--sample-rate must be in (0, 1], got {q!r}")
    estimator = args.estimator or "steinke"
    if estimator == "fdp" and q < 1:
        raise ValueError(f"--estimator fdp: needs a full-batch run (--sample-rate 1), got --sample-rate {q}; "
                         "a subsampled run's tradeoff curve is not mu-GDP")
    confidence = 0.95 if args.confidence is None else args.confidence
    canaries = check_positive_int("--num-canaries", 1000 if args.num_canaries is None else args.num_canaries)
    epochs = check_positive_int("--epochs", 20 if args.epochs is None else args.epochs)
    result = experiment.audit_method(args.method, args.epsilon, args.delta, canaries, epochs, q,
                                     seed=args.seed, broken=args.broken, confidence=confidence,
                                     estimator=estimator)
    what = f"BROKEN {args.broken}" if args.broken else result["method"]
    print(f"one-run audit of {what}: {result['num_canaries']} canaries, {result['steps']} steps, "
          f"score {result['score']} ({result['seconds']:.1f} s)")
    print(f"claimed epsilon: {result['claimed_epsilon']:.4g}  [{result['claim_source']}]")
    print(f"lower bound:     {result['lower_bound']:.4g}  ({result['correct']}/{result['guesses']} "
          f"guesses correct; confidence {confidence}; estimator {estimator})")
    if estimator == "fdp":
        print(f"mu-GDP:          mu >= {result['gdp_mu_lb']:.4g}; the run's exact claim mu = "
              f"{result['claimed_mu']:.4g} (sqrt(steps) / sigma)")
    print("power: in its best case (docs/audit.md, one-run power) a one-run audit of 1000 canaries flags a "
          "1.5x sensitivity error in at most 1 of 20 audits and a 3-4x error in most; the step audit "
          "(--mode step) flags 1.5x with the power it prints")
    if args.broken:
        print("CAUGHT: lower bound above the claim" if result["caught"] else "NOT caught")
    elif result["caught"]:
        print("VIOLATION: the lower bound exceeds the reported epsilon")
    return result


def run(args) -> int:
    """Entry point of ``tfdpbnn audit``: run the audit of ``--mode``; print (and save) it."""
    mode = "multi-run" if args.multi_run else args.mode or ("traced" if args.model else "step")
    if args.multi_run and args.mode not in (None, "step", "multi-run"):
        raise ValueError(f"--multi-run contradicts --mode {args.mode}")
    _check_arguments(args, mode)
    if args.model is not None and mode != "traced":
        raise ValueError(f"--model audits a saved model with --mode traced, not --mode {mode}")
    result = {"step": _step, "sampling": _sampling, "multi-run": _multi_run, "one-run": _one_run,
              "traced": _traced}[mode](args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
