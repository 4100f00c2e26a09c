"""``private_search``: hyperparameter selection on private data with one privacy statement for all of it.

The private input is the pair (training split, validation split), fixed before the search; two inputs are
neighbours when one record is added to or removed from one of the two splits (replace-one likewise, if the
optimizers use it). One trial Q:

1. draws a candidate uniformly at random from the fixed list (data-independent);
2. trains it from scratch on the training split through ``model.compile``/``model.fit`` with a tfdpbnn DP
   optimizer (RDP curve eps_c(lambda) of the DP-SGD run: ``bounds.training_rdp``);
3. scores it on the validation split with a noisy count of correct predictions,
   ``count + N(0, s^2)`` (a Gaussian mechanism of sensitivity 1: RDP lambda / (2 s^2)),
   and outputs (model, hyperparameters, noisy score).

Why the score costs (almost) nothing: the splits are disjoint. If the neighbour differs in the training
split, the validation data are the same and the score is post-processing of the model, so the divergence
is at most eps_c; if it differs in the validation split, the model's distribution is the same and the
divergence is that of the noisy count given the model, lambda / (2 s^2) (a mixture with identical weights
on both sides). So Q is (lambda, max(max_c eps_c(lambda), lambda / (2 s^2)))-RDP (the max over candidates:
``bounds.trial_rdp``). ``score_noise_multiplier=None`` picks the smallest s with lambda / (2 s^2) <=
min_c eps_c(lambda) at every order, so the score adds nothing to the trial's curve.

Selection:

- random stopping (``distribution`` a ``TruncatedNegativeBinomial`` or ``PoissonTrials``): run Q K times, K
  drawn from the distribution and kept secret, output only the trial with the best noisy score; RDP from
  Papernot & Steinke (2022) Theorem 2 (truncated negative binomial) or 6 (Poisson), ``bounds.selection_rdp``.
  With Poisson, K = 0 happens with probability e^(-mu) and the search then returns no model.
- naive (``distribution=None``): run every candidate once, release them all, keep the best: the curves of
  all trials add up (``bounds.composed_rdp``).

The selected model IS the selected trial's model (trained on the training split): there is no retraining, so
the statement covers every use of the private data. Everything the search returns besides ``diagnostics``
is covered; ``diagnostics`` (K, every trial's noisy score) is not, since the random-stopping analysis releases
the best trial only: use it to debug, do not publish it. The guarantee also needs the search's randomness (K,
the draws, the noise, the batches) to be secret: pass ``seed`` only for experiments.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from tfdpbnn._validation import check_open_unit, check_positive
from tfdpbnn.tuning import bounds

_REQUIRED = ("noise_multiplier", "batch_size", "epochs")


@dataclasses.dataclass
class SearchResult:
    """The search's output: the selected trial and the one privacy statement covering the whole search.

    ``model`` and ``hparams`` of the selected trial (None if Poisson drew K = 0), its noisy validation
    accuracy ``score``, and ``privacy``, the one statement covering the whole search. ``diagnostics`` (number
    of trials, every trial's candidate and noisy score, wall time) is NOT covered by the statement (random
    stopping releases the best trial only).
    """

    model: object
    hparams: dict | None
    score: float | None
    privacy: dict
    diagnostics: dict


def _check_candidates(candidates, sampling_default="poisson"):
    if not isinstance(candidates, list | tuple) or not candidates:
        raise ValueError(f"candidates must be a non-empty list of dicts; got {candidates!r}")
    out = []
    for i, c in enumerate(candidates):
        if not isinstance(c, dict):
            raise ValueError(f"candidates[{i}] must be a dict; got {c!r}")
        missing = [k for k in _REQUIRED if k not in c]
        if missing:
            raise ValueError(f"candidates[{i}] must give {_REQUIRED} (the DP parameters the accounting "
                             "needs); "
                             f"missing {missing}")
        c = dict(c)
        c.setdefault("sampling", sampling_default)
        if c["sampling"] not in ("poisson", "shuffle"):
            raise ValueError(f"candidates[{i}]['sampling'] must be 'poisson' or 'shuffle'; "
                             f"got {c['sampling']!r}")
        if not (isinstance(c["epochs"], int) and c["epochs"] >= 1):
            raise ValueError(f"candidates[{i}]['epochs'] must be an integer >= 1; got {c['epochs']!r}")
        if not (isinstance(c["batch_size"], int) and c["batch_size"] >= 1):
            raise ValueError(f"candidates[{i}]['batch_size'] must be an integer >= 1; "
                             f"got {c['batch_size']!r}")
        if not (isinstance(c["noise_multiplier"], int | float) and c["noise_multiplier"] > 0):
            raise ValueError(f"candidates[{i}]['noise_multiplier'] must be > 0; "
                             f"got {c['noise_multiplier']!r}")
        out.append(c)
    return out


def planned_steps(candidate: dict, num_examples: int) -> tuple[float, int]:
    """(sample rate q = batch_size / n, steps) of one candidate.

    Steps are epochs * ceil(1 / q) for Poisson batches (``tfdpbnn.data.poisson_batches``' default epoch),
    epochs * ceil(n / B) for shuffled batches.
    """
    batch = candidate["batch_size"]
    if batch > num_examples:
        raise ValueError(f"batch_size must be <= the training split's size {num_examples}; got {batch}")
    q = batch / num_examples
    per_epoch = (math.ceil(1.0 / q - 1e-9) if candidate.get("sampling", "poisson") == "poisson"
                 else math.ceil(num_examples / batch))
    return q, per_epoch * candidate["epochs"]


def _candidate_curves(candidates, num_examples, neighboring):
    curves = []
    for c in candidates:
        q, steps = planned_steps(c, num_examples)
        curves.append(bounds.training_rdp(c["noise_multiplier"], q, steps, c["sampling"], neighboring))
    return np.asarray(curves)


def auto_score_noise(train_curves) -> float:
    """Smallest score noise s with lambda / (2 s^2) <= min over candidates of eps_c(lambda) at every order.

    The noisy count then leaves the trial's RDP curve unchanged (parallel composition over the disjoint
    splits).
    """
    floor = np.min(np.asarray(train_curves), axis=0)
    if np.any(floor <= 0):
        raise ValueError("a candidate has zero RDP at some order; give score_noise_multiplier explicitly")
    return float(math.sqrt(np.max(bounds.ORDERS / (2.0 * floor))))


def search_rdp(candidates, num_examples: int, distribution, score_noise_multiplier=None,
               neighboring: str = "add_or_remove"):
    """RDP of a search over ``candidates`` trained on ``num_examples`` examples.

    Returns (RDP curve of the whole search at ``bounds.ORDERS``, per-trial curve, score noise multiplier,
    the candidates' training curves).
    """
    candidates = _check_candidates(candidates)
    train = _candidate_curves(candidates, num_examples, neighboring)
    s = auto_score_noise(train) if score_noise_multiplier is None else float(score_noise_multiplier)
    per_candidate = np.maximum(train, bounds.gaussian_rdp(s)[None, :])  # parallel composition (module doc)
    if distribution is None:
        total = bounds.composed_rdp(per_candidate)
        trial = bounds.trial_rdp(per_candidate)
    else:
        trial = bounds.trial_rdp(per_candidate)
        total = bounds.selection_rdp(bounds.ORDERS, trial, distribution)
    return total, trial, s, train


def calibrate_search(target_epsilon: float, delta: float, candidates, num_examples: int, distribution,
                     neighboring: str = "add_or_remove", tolerance: float = 1e-3) -> list[dict]:
    """The candidates with ``noise_multiplier`` set so that the whole search is (target_epsilon, delta)-DP.

    The search is ``distribution`` (None = naive composition). Every candidate is calibrated by RDP
    (``tfdpbnn.privacy.calibrate_noise``) to the same per-trial epsilon, the largest one (Brent's method on
    it, to ``tolerance`` relative) whose search total is <= the target. Each candidate needs "batch_size"
    and "epochs"; a given "noise_multiplier" is replaced.
    """
    from scipy.optimize import brentq

    from tfdpbnn import privacy

    check_positive("target_epsilon", target_epsilon)
    check_open_unit("delta", delta)
    check_positive("tolerance", tolerance)
    base = _check_candidates([dict(c, noise_multiplier=1.0) for c in candidates])
    sigmas = {}  # (q, steps, sampling, per-trial epsilon) -> sigma; candidates often share (q, steps)

    def with_trial_epsilon(eps_t):
        out = []
        for c in base:
            q, steps = planned_steps(c, num_examples)
            key = (q, steps, c["sampling"], eps_t)
            if key not in sigmas:
                sigmas[key] = float(privacy.calibrate_noise(eps_t, delta, q, steps, accountant="rdp",
                                                            neighboring=neighboring, sampling=c["sampling"]))
            out.append(dict(c, noise_multiplier=sigmas[key]))
        return out

    def excess(eps_t):
        curve, *_ = search_rdp(with_trial_epsilon(eps_t), num_examples, distribution, neighboring=neighboring)
        return bounds.epsilon(bounds.ORDERS, curve, delta) - target_epsilon

    hi = float(target_epsilon)  # a search's total is at least one trial's epsilon
    if excess(hi) <= 0:
        return with_trial_epsilon(hi)
    lo = hi / 4
    while excess(lo) > 0:
        lo /= 4
        if lo < 1e-6 * target_epsilon:
            raise ValueError(f"target_epsilon {target_epsilon} is too small for this search")
    xtol = tolerance * target_epsilon
    eps_t = brentq(excess, lo, hi, xtol=xtol)
    while excess(eps_t) > 0:  # Brent's root may sit just above it: step down to the safe side
        eps_t -= xtol
    return with_trial_epsilon(eps_t)


def _fit(model, hp, x, y, callbacks, verbose, record_ids=None, releases_before=0):
    from tfdpbnn import data
    from tfdpbnn.optimizers.base import DPOptimizerMixin

    opt = model.optimizer
    if not isinstance(opt, DPOptimizerMixin):
        raise ValueError(f"build must return a model compiled with a tfdpbnn DP optimizer; got {type(opt)}")
    if not opt._dp_steps_accounted_as_dp_sgd():
        raise ValueError(
            f"build: its optimizer ({type(opt).__name__}) accounts its steps otherwise than DP-SGD's "
            "subsampled Gaussian steps (SIDPOptimizer(paper_mean_update=True) releases the weights, exact "
            "GDP), and the search's epsilon composes every trial as DP-SGD's: it would report far less than "
            "the trials spend. Search with paper_mean_update=False, or train such models outside "
            "private_search.")
    _refuse_preprocessing_made_in_build(model, releases_before)
    n = len(x)
    q, steps = planned_steps(hp, n)
    checks = {"noise_multiplier": (opt.noise_multiplier, hp["noise_multiplier"]),
              "batch_size": (opt.batch_size, hp["batch_size"]), "num_examples": (opt.num_examples, n),
              "sampling": (opt.sampling, hp["sampling"]),
              "neighboring": (opt.neighboring, "add_or_remove")}  # what ``search_rdp`` accounts under
    for name, (got, want) in checks.items():
        if (got != want) if isinstance(want, str) else not math.isclose(got, want, rel_tol=1e-6):
            raise ValueError(f"build: the optimizer's {name} is {got!r} but the candidate (and its "
                             f"accounting) says {want!r}")
    _refuse_trained_before(model, opt)
    start = opt.steps
    if hp["sampling"] == "poisson":
        batches = data.poisson_batches(x, y, sample_rate=q, record_ids=record_ids)
        model.fit(batches, epochs=hp["epochs"], verbose=verbose, callbacks=callbacks)
    else:
        model.fit(x, y, batch_size=hp["batch_size"], epochs=hp["epochs"], shuffle=True, verbose=verbose,
                  callbacks=callbacks, **({} if record_ids is None else {"record_ids": record_ids}))
    ran = opt.steps - start
    if ran != steps:
        raise RuntimeError(f"the trial ran {ran} steps but its accounting assumed {steps}")
    if opt.ledger.steps != ran:  # phases found at the fit's start: these weights' earlier training
        raise ValueError(
            f"build: the trial's weights carry {opt.ledger.steps - ran} DP steps of earlier training (the "
            "privacy record store knows them, or another optimizer trained these variables); every trial "
            "must train a fresh model from scratch, which the search's epsilon assumes. Build a new model "
            "with new weights in build.")


def _refuse_preprocessing_made_in_build(model, releases_before: int) -> None:
    """Refuse a trial's model holding a DP preprocessing release made during the search (in ``build``).

    The search's epsilon composes every trial's training and the scores; a release made for each trial
    (``private_adapt_normalization`` inside ``build``) is another release on the training records per
    trial, which it does not count (the selected model's statement holds its own one alone).
    """
    from tfdpbnn.preprocessing.checks import preprocessing_releases
    from tfdpbnn.record.preprocessing import made_after

    made = [r.layer for r in preprocessing_releases(model)["dp"] if made_after(r, releases_before)]
    if made:
        raise ValueError(
            f"build: the trial's model holds DP preprocessing releases made during the search (layers "
            f"{made[:3]}: private_adapt_... inside build), one more release on the training records per "
            "trial, which the search's epsilon does not count. Adapt once, before private_search, and use "
            "that adapted layer in every trial's model.")


def _refuse_trained_before(model, optimizer) -> None:
    """Refuse a trial's model or optimizer that took DP steps before the trial (``build`` reused it).

    The search's bound covers trials that each train a fresh model (module docstring): a model trained on in
    a second trial carries the training of both, which the random-stopping analysis does not cover.
    """
    from tfdpbnn.record import attributes

    earlier = optimizer.steps or attributes.ledger_link(model) is not None or attributes.variable_trainers(
        model.trainable_variables)
    if earlier:
        raise ValueError(
            "build: it returned a model that was DP-trained before the trial (the same model or optimizer as "
            "an earlier trial, or layers of a trained model); every trial must train a fresh model from "
            "scratch, which the search's epsilon assumes. Build a new model with new weights in build.")


def _scores_event(score_noise_multiplier: float, trials: int):
    """The noisy counts of ``trials`` trials on the validation split: Gaussians of sensitivity 1, composed."""
    import dp_accounting

    if trials == 0:
        return dp_accounting.NoOpDpEvent()
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(score_noise_multiplier), trials)


def _reserve_scores(keys, score_noise_multiplier: float, trials: int):
    """Reserve the search's scores for the validation records ``keys`` in the per-record ledger (None if off).

    Raises ``BudgetExceededError`` before any trial when a validation record would exceed the ledger's
    per-record budget.
    """
    from tfdpbnn.record.record_ledger import default_ledger

    ledger = default_ledger()
    if ledger is None:
        return None
    return ledger.reserve(keys, _scores_event(score_noise_multiplier, trials), kind="search",
                          description=f"private_search: noisy validation scores of {trials} trials (score "
                                      f"noise {score_noise_multiplier:.4g})")


def _split_keys(x_train, y_train, x_val, y_val, record_ids, validation_record_ids):
    """The validation records' keys (``record_keys``), after refusing records in both splits.

    A trial's training and its noisy score compose in parallel (module docstring): that holds for disjoint
    splits only. Records are compared as the per-record ledger names them: by their ids when both splits
    have ids, else by content (equal feature values, ``tfdpbnn.record.records.content_keys``; ids that come
    with their rows carry it). So equal rows in both splits are one record in both, unless ids name them
    apart.
    """
    from tfdpbnn.record.records import record_keys

    keys = {}
    for name, ids, x, y in (("record_ids", record_ids, x_train, y_train),
                            ("validation_record_ids", validation_record_ids, x_val, y_val)):
        try:
            keys[name] = record_keys(x, y, ids)
        except ValueError as error:
            if ids is None:
                raise
            raise ValueError(f"{name}: {str(error).removeprefix('record_ids: ')}") from None
    train, val = keys["record_ids"], keys["validation_record_ids"]
    by_ids = record_ids is not None and validation_record_ids is not None
    if not by_ids:
        train = train.content if record_ids is not None else train
        val = val.content if validation_record_ids is not None else val
        if train is None or val is None:
            raise ValueError(
                "validation_record_ids: the records of one split are named by ids without a content hash "
                "(ragged, sparse or object rows) and the other's by content, so the two splits cannot be "
                "checked for records in both; give record_ids and validation_record_ids")
    both = np.intersect1d(np.asarray(train, np.int64), np.asarray(val, np.int64)).size
    if both:
        how = "ids" if by_ids else "content: their feature values equal those of training rows"
        raise ValueError(
            f"x_val: {both} validation records are training records too (by {how}). The search's "
            "epsilon composes a trial's training and its score in parallel, which holds for disjoint "
            "splits only. Split the records into two disjoint sets"
            + ("." if by_ids else ", or, if rows with equal features are different records, name both "
                                  "splits' records with record_ids and validation_record_ids.")
            + " Nothing was run.")
    return keys["validation_record_ids"]


def _default_predict(model, x):
    return model(x, training=False)


def _validation_labels(y_val, n_val: int) -> np.ndarray:
    """``y_val`` as one class label per validation example (shape [n_val]; [n_val, 1] is flattened).

    The score is the count of validation examples whose argmax prediction equals their label, of
    sensitivity 1: labels of another shape (a one-hot matrix, or a column compared by broadcasting with
    every prediction: a count of pairs, of sensitivity up to n_val) are refused before any trial.
    """
    labels = np.asarray(y_val)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or len(labels) != n_val:
        raise ValueError(f"y_val: one class label per validation example (shape [{n_val}] or [{n_val}, 1]), "
                         f"got shape {np.shape(y_val)}; for one-hot labels pass np.argmax(y_val, axis=-1)")
    return labels


def _correct(scores, labels: np.ndarray) -> int:
    """How many validation examples' argmax of ``scores`` ([n_val, classes]) equals their label."""
    predicted = np.argmax(np.asarray(scores), axis=-1)
    if predicted.shape != labels.shape:
        raise ValueError(f"predict: scores of shape [n_val, classes] ([{len(labels)}, k]) are needed, got "
                         f"{np.shape(scores)}")
    return int(np.sum(predicted == labels))


def private_search(build: Callable, candidates, x_train, y_train, x_val, y_val, *, delta: float,
                   distribution=None, score_noise_multiplier: float | None = None, predict: Callable = None,
                   callbacks: Callable | None = None, seed: int | None = None, verbose: int = 0,
                   record_ids=None, validation_record_ids=None) -> SearchResult:
    """Select hyperparameters on private data; one privacy statement covers the search (module docstring).

    Args:
      build: ``build(hparams) -> model``, a new model compiled with a tfdpbnn DP optimizer whose
        noise_multiplier, batch_size, sampling match the candidate and whose num_examples is
        ``len(x_train)``; the search fits it (Poisson batches ``tfdpbnn.data.poisson_batches`` or shuffled
        arrays) for ``hparams["epochs"]``. A model, optimizer or weights DP-trained before the trial (an
        earlier trial's, found by the record store) are refused.
      candidates: list of dicts, each with "noise_multiplier", "batch_size", "epochs" (and optionally
        "sampling", default "poisson"), plus whatever ``build`` reads. ``calibrate_search`` sets the noise
        for a total budget.
      x_train: inputs of the private training split (disjoint from the validation split, fixed before;
        records in both, by ids or else by content, are refused before any trial).
      y_train: labels of the private training split.
      x_val: inputs of the private validation split (disjoint from the training split, fixed before).
      y_val: labels of the private validation split.
      delta: the delta of the statement.
      distribution: ``TruncatedNegativeBinomial``/``PoissonTrials`` (random stopping), or None (naive: every
        candidate once, all composed).
      score_noise_multiplier: std s of the noise on the count of correct validation predictions; None: the
        smallest s that leaves the trial's RDP unchanged (``auto_score_noise``).
      predict: ``predict(model, x) -> scores [n, classes]`` whose argmax is the prediction (default: the
        model's deterministic call); e.g. an MC average for Bayesian layers. Each row's scores must come
        from that row alone (the noisy count's sensitivity is 1): a ``predict`` given here is listed under
        the statement's ``asserted_by_user``.
      callbacks: ``callbacks(hparams) -> list`` of Keras callbacks for each fit (e.g. an EMA of the weights:
        post-processing), or None.
      seed: None (secret randomness: what a published guarantee needs) or an integer for reproducible
        experiments (it also sets TensorFlow's global seed before each trial; the trials' DP noise is keyed
        from ``os.urandom`` all the same, unless their optimizers are built with ``debug_noise_seed``).
      verbose: Keras ``fit`` verbosity for each trial's training (0 = silent).
      record_ids: one id per training record (``fit(..., record_ids=)``), naming them in the per-record
        ledger for every trial's fit; None: their content names them. Records that earlier releases named
        by ids must be named by the same ids here (``RecordNamingError`` otherwise).
      validation_record_ids: one id per validation record, naming them for the noisy scores' release;
        None: their content names them.
    """
    import tensorflow as tf

    check_open_unit("delta", delta)
    candidates = _check_candidates(candidates)
    n, n_val = len(x_train), len(x_val)
    if n_val < 1:
        raise ValueError("x_val must hold at least one example")
    labels = _validation_labels(y_val, n_val)
    # Before any trial: one distinct id per record, and no record in both splits.
    validation_keys = _split_keys(x_train, y_train, x_val, y_val, record_ids, validation_record_ids)
    total, trial, s, train = search_rdp(candidates, n, distribution, score_noise_multiplier,
                                        neighboring="add_or_remove")
    custom_predict, predict = predict, predict or _default_predict
    rng = np.random.default_rng(seed)
    if distribution is None:
        plan = list(range(len(candidates)))
    else:
        k = distribution.sample(rng)
        plan = [int(rng.integers(len(candidates))) for _ in range(k)]

    # The noisy scores are a release on the validation records: reserved in the per-record ledger before the
    # first trial (K is drawn above, so the plan is known), committed with the selected model's phases. The
    # trials' training is written against the training records by their own fits.
    reservation = _reserve_scores(validation_keys, s, len(plan))
    start = time.time()
    from tfdpbnn.record.preprocessing import releases_made

    releases_before = releases_made()   # DP preprocessing releases made before the search (not in build)
    records, best = [], None

    def commit_scores():  # the noisy scores drawn, linked to the phases of the best model so far
        if reservation is not None:
            phases = [] if best is None else best[1].optimizer.ledger.phases
            phase_ids = [p.phase_id for p in phases if p.released]
            reservation.commit(_scores_event(s, len(records)), phase_ids=phase_ids)

    try:
        for i in plan:
            hp = candidates[i]
            if seed is not None:
                tf.keras.utils.set_random_seed(int(rng.integers(2**31 - 1)))
            model = build(dict(hp))
            _fit(model, hp, x_train, y_train, callbacks(dict(hp)) if callbacks else None, verbose, record_ids,
                 releases_before)
            correct = _correct(predict(model, x_val), labels)
            noisy = (correct + s * rng.standard_normal()) / n_val
            records.append({"candidate": i, "noisy_score": float(noisy)})
            if best is None or noisy > best[0]:
                best = (noisy, model, i)
            else:
                del model
    except BaseException:
        # A trial that failed (refused, interrupted): the scores drawn before it are what was released on
        # the validation records, not the planned ones.
        commit_scores()
        raise
    wall = time.time() - start
    commit_scores()

    eps = bounds.epsilon(bounds.ORDERS, total, delta)
    per_candidate = [bounds.epsilon(bounds.ORDERS, c, delta) for c in train]
    statement = {
        "epsilon": eps, "delta": delta, "accountant": "rdp",
        "selection": ("naive composition of every candidate (Mironov 2017)" if distribution is None else
                      f"random stopping, Papernot & Steinke 2022 Theorem "
                      f"{6 if isinstance(distribution, bounds.PoissonTrials) else 2}"),
        "distribution": None if distribution is None else {"type": type(distribution).__name__,
                                                           **dataclasses.asdict(distribution),
                                                           "expected_trials": distribution.mean()},
        "num_candidates": len(candidates),
        "trial_epsilon": bounds.epsilon(bounds.ORDERS, trial, delta),
        "candidate_training_epsilons": per_candidate,
        "score_noise_multiplier": s, "train_examples": n, "validation_examples": n_val,
        "neighboring": "add_or_remove (one record added to or removed from the training or validation split)",
        "covers": "every trial's training, the noisy validation scores and the selection; the returned model "
                  "is the selected trial's (no retraining)",
        "randomness": ("secret" if seed is None else
                       f"fixed seed {seed} (reproducible experiment; the guarantee assumes it is secret)"),
        "asserted_by_user": [] if custom_predict is None else [
            f"predict ({getattr(custom_predict, '__name__', type(custom_predict).__name__)}) scores each "
            "validation example from that example alone: the noisy count of correct predictions has "
            "sensitivity 1"],
    }
    if best is None:
        return SearchResult(None, None, None, statement, {"trials": records, "num_trials": 0, "wall_s": wall})
    from tfdpbnn.record import attributes
    from tfdpbnn.record.other_releases import SearchRecord

    # The selected model's own privacy statement (and export_saved_model's privacy.json) reports the search.
    record = SearchRecord(statement, tuple(np.asarray(total).tolist()), best[1].optimizer.ledger.steps)
    for holder in (best[1], best[1].optimizer):
        attributes.set_search_record(holder, record)
    return SearchResult(best[1], dict(candidates[best[2]]), float(best[0]), statement,
                        {"trials": records, "num_trials": len(plan), "wall_s": wall})
