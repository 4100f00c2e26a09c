"""Snapshot ensembles of DP-SGD under a cyclical learning rate, against DP-SGD's averaged weights.

The private run is the one of ``ood_posteriors.py`` (DP-SGD from its random initialization on all of
DIGITS' 1,437 training records: 64 tanh units, Poisson q = 0.2, 120 steps, clip 1, PLD, delta 1e-5,
epsilon 1, sigma 8.31), with one change: the learning rate follows M cosine cycles over the 120 steps
(``tf.keras.optimizers.schedules.CosineDecayRestarts`` with ``t_mul = m_mul = 1``: SGDR, Loshchilov & Hutter
2017), from ``peak`` down to near 0 in every cycle of 120 / M steps. The posterior is an ensemble of one
network per cycle, taken where its learning rate is lowest (snapshot ensembles, Huang et al. 2017;
cyclical SG-MCMC, Zhang et al. 2020): ``snapshots``, the iterate after each cycle's last step, or
``cycle averages``, the moving average (decay 0.9, Polyak at first) of each cycle's iterates, restarted at
the cycle's first step; ``all`` cycles or ``skip first`` (the first cycle's member left out; M >= 3).
The learning rate only scales the released noisy gradient: the DP steps, their noise and their sampling
are those of the plain run, so the epsilon is the same (the script checks that the statement's epsilon
equals the plain run's and is unchanged after the post-processing).

``--public``: the choice of (M, peak, members, cycles) on public data only. Per seed, a public
permutation of MNIST-5k (NIST conversion, centred; key 50_000 + seed) gives 1,437 stand-ins of DIGITS'
training records and 3,563 validation images; the private run is simulated on the stand-ins (same q,
steps, clip, sigma; sampling key 60_000 + seed, TensorFlow seed 70_000 + seed) for every M in
``CYCLES`` and peak in ``PEAKS``, and each candidate is scored on the validation images (and against
uniform noise and inverted validation images). The plain run (constant rate 1, its moving average, decay
0.9) is scored beside them. The rule, fixed before the run: the candidate with the lowest mean validation
NLL over the seeds. Reads no DIGITS record: choosing by it costs no privacy.

Default (DIGITS): per seed, the plain run (constant rate 1; ``ema``: its moving average, decay 0.9, DP-SGD's
averaged weights of "ood-posteriors"; and its last iterate) and the cyclic run with the chosen setting
(``--cycles``, ``--peak``, ``--members``, ``--skip-first``; also its own moving average and last iterate,
for context), both with sampling key 10_000 + seed, initialization seeded by ``seed``, TensorFlow seed
20_000 + seed; the DP noise is keyed from ``os.urandom`` at every ``fit``. ``--reference``: also the same
network without privacy (Adam, 20 epochs, batch 64, ``train_recipes.pretrain_arrays``) on the same records.
Accuracy, ECE, NLL on DIGITS' 360 test images, and the AUROC of predictive entropy (the score fixed
beforehand) and of the mutual information against uniform noise and inverted digits (``ood_posteriors``'
sets).

Run::

    TFDPBNN_PRIVACY_STORE=off python experiments/ood_cyclic.py --public --out runs/ood_cyclic_public
    TFDPBNN_PRIVACY_STORE=off python experiments/ood_cyclic.py --cycles M --peak P --members snapshots \
        --reference --out runs/ood_cyclic
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DELTA = 1e-5
#: the candidates compared on public data: cycles over the 120 steps, and the learning rate at each
#: cycle's start (the plain run's constant rate is 1)
CYCLES = (2, 3, 4, 6)
PEAKS = (1.0, 2.0, 3.0)
MEMBERS = ("snapshots", "cycle averages")
PLAIN_RATE = 1.0
EMA_DECAY = 0.9


def cyclic_schedule(peak, cycles, steps):
    """``cycles`` cosine cycles over ``steps`` steps, each from ``peak`` to near 0 (SGDR restarts)."""
    import tensorflow as tf

    if steps % cycles:
        raise ValueError(f"cycles must divide the {steps} steps, got {cycles}")
    return tf.keras.optimizers.schedules.CosineDecayRestarts(float(peak), steps // cycles, t_mul=1.0,
                                                             m_mul=1.0, alpha=0.0)


def _cycle_members(cycle_steps):
    """A callback keeping, per cycle of ``cycle_steps`` steps, its last iterate and its restarted average."""
    import tensorflow as tf

    class CycleMembers(tf.keras.callbacks.Callback):
        """Per cycle: the iterate after its last step, and the moving average of its iterates (decay 0.9)."""

        def on_train_begin(self, logs=None):
            """Reset; the model's weights must all be trainable (they are the ensemble's members)."""
            if len(self.model.weights) != len(self.model.trainable_variables):
                raise ValueError("CycleMembers: every weight of the model must be trainable")
            self.step, self.snapshots, self.averages, self._average = 0, [], [], None

        def on_train_batch_end(self, batch, logs=None):
            """Fold this step's iterate into its cycle's average; at the cycle's end keep both members."""
            self.step += 1
            position = (self.step - 1) % cycle_steps  # 0 at the cycle's first step
            weights = [np.asarray(w, np.float64) for w in self.model.get_weights()]
            if position == 0:
                self._average = weights
            else:
                rate = min(EMA_DECAY, position / (position + 1.0))
                self._average = [rate * a + (1.0 - rate) * w for a, w in zip(self._average, weights,
                                                                              strict=True)]
            if position == cycle_steps - 1:
                self.snapshots.append([w.astype(np.float32) for w in weights])
                self.averages.append([a.astype(np.float32) for a in self._average])

    return CycleMembers()


def _dp_run(x, y, seed, sampling_key, tf_seed, learning_rate, callbacks, epsilon=1.0):
    """One DP-SGD run of the ``ood_posteriors`` recipe at ``learning_rate``; (model, optimizer, steps)."""
    import tensorflow as tf

    import tfdpbnn
    from tfdpbnn.commands import train_recipes

    tf.keras.backend.clear_session()
    recipe = dataclasses.replace(train_recipes.RECIPES["dpsgd"], accountant="pld",
                                 learning_rate=learning_rate)
    n = len(x)
    batch_size = int(round(recipe.sample_rate * n))
    steps = int(math.ceil(n / batch_size))
    model = train_recipes.build_model("dpsgd", (64,), 10, n, recipe.hidden, seed)
    optimizer = train_recipes.build_optimizer("dpsgd", recipe, epsilon, DELTA, n, batch_size)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=batch_size / n, steps_per_epoch=steps,
                                           secret_seed=sampling_key)
    tf.random.set_seed(tf_seed)
    model.fit(batches, epochs=recipe.epochs, verbose=0, callbacks=callbacks)
    return model, optimizer, steps * recipe.epochs


def _scores(model, members, x_eval, y_eval, ood) -> dict:
    """Accuracy, ECE, NLL of the ensemble ``members`` (weight lists), and its AUROCs (entropy, MI)."""
    import tfdpbnn
    from experiments.honest_common import auroc
    from tfdpbnn.uncertainty import mc_predict

    def predict(inputs):
        return mc_predict(model, inputs, weight_snapshots=members, from_logits=True)

    test = predict(x_eval)
    p = np.asarray(test.mean, dtype=np.float64)
    row = {"members": len(members), "accuracy": float(np.mean(p.argmax(1) == y_eval)),
           "ece": float(tfdpbnn.uncertainty.expected_calibration_error(p, y_eval)),
           "nll": float(-np.mean(np.log(np.clip(p[np.arange(len(y_eval)), y_eval], 1e-12, 1.0))))}
    for name, xo in ood.items():
        out = predict(xo)
        row[f"auroc_{name}"] = auroc(test.predictive_entropy, out.predictive_entropy)
        row[f"auroc_{name}_mi"] = auroc(test.mutual_information, out.mutual_information)
    return row


def _plain(x, y, seed, sampling_key, tf_seed, epsilon=1.0):
    """The plain run (constant rate 1): (model, its epsilon, {"ema": [weights], "last iterate": [...]})."""
    from tfdpbnn.uncertainty import IterateAverage

    average = IterateAverage(EMA_DECAY, swap_at_end=False)
    model, optimizer, _ = _dp_run(x, y, seed, sampling_key, tf_seed, PLAIN_RATE, [average], epsilon)
    spent = float(optimizer.privacy_statement()["epsilon"])
    last = model.get_weights()
    average.swap_in()
    return model, optimizer, spent, {"ema": [model.get_weights()], "last iterate": [last]}


def _cyclic(x, y, seed, sampling_key, tf_seed, cycles, peak, epsilon=1.0):
    """The cyclic run: (model, optimizer, its epsilon, {candidate name: members})."""
    from tfdpbnn.commands import train_recipes
    from tfdpbnn.uncertainty import IterateAverage

    recipe = train_recipes.RECIPES["dpsgd"]
    total = recipe.epochs * int(math.ceil(len(x) / int(round(recipe.sample_rate * len(x)))))
    members = _cycle_members(total // cycles)
    average = IterateAverage(EMA_DECAY, swap_at_end=False)
    model, optimizer, steps = _dp_run(x, y, seed, sampling_key, tf_seed, cyclic_schedule(peak, cycles, total),
                                      [members, average], epsilon)
    if steps != total or len(members.snapshots) != cycles:
        raise AssertionError(f"{steps} steps, {len(members.snapshots)} cycles collected")
    spent = float(optimizer.privacy_statement()["epsilon"])
    last = model.get_weights()
    average.swap_in()
    out = {"cyclic, ema": [model.get_weights()], "cyclic, last iterate": [last]}
    for kind, collected in (("snapshots", members.snapshots), ("cycle averages", members.averages)):
        out[(kind, False)] = collected
        if cycles >= 3:
            out[(kind, True)] = collected[1:]
    return model, optimizer, spent, out


def candidate_name(cycles, peak, members, skip_first) -> str:
    """The name of one cyclic posterior."""
    return f"cyclic M={cycles} peak={peak:g}, {members}, {'skip first' if skip_first else 'all'}"


def _check_epsilons(plain, spent, optimizer):
    if abs(spent - plain) > 1e-9:
        raise AssertionError(f"the cyclic run's epsilon {spent} differs from the plain run's {plain}")
    if float(optimizer.privacy_statement()["epsilon"]) != spent:
        raise AssertionError("the statement's epsilon changed after post-processing")


def public_rows(seeds, cycles_list=CYCLES, peaks=PEAKS, epsilon=1.0) -> list:
    """Every candidate and the plain run on the public simulation (module docstring), per seed."""
    import tfdpbnn
    from experiments.ood_posteriors import _ood_sets
    from tfdpbnn.commands import train_recipes

    x_all, y_all = tfdpbnn.data.load_mnist5k_as_digits(normalization=train_recipes.PUBLIC_NORMALIZATION)
    x_all = (x_all - 0.5).astype("float32")
    rows = []
    for seed in seeds:
        order = np.random.default_rng(50_000 + seed).permutation(len(x_all))
        train, validation = order[:1437], order[1437:]
        x, y, xv, yv = x_all[train], y_all[train], x_all[validation], y_all[validation]
        ood = _ood_sets(xv, seed)
        start = time.perf_counter()
        model, optimizer, plain_eps, plain = _plain(x, y, seed, 60_000 + seed, 70_000 + seed, epsilon)
        for name, members in plain.items():
            rows.append(dict(_scores(model, members, xv, yv, ood), seed=seed, posterior=f"plain, {name}",
                             epsilon=plain_eps, seconds=time.perf_counter() - start))
            print(json.dumps(rows[-1]), flush=True)
        for cycles in cycles_list:
            for peak in peaks:
                start = time.perf_counter()
                model, optimizer, spent, out = _cyclic(x, y, seed, 60_000 + seed, 70_000 + seed, cycles, peak,
                                                       epsilon)
                for key, members in out.items():
                    if isinstance(key, str):
                        continue
                    row = dict(_scores(model, members, xv, yv, ood), seed=seed, cycles=cycles, peak=peak,
                               member_kind=key[0], skip_first=key[1], epsilon=spent,
                               posterior=candidate_name(cycles, peak, *key))
                    rows.append(row)
                _check_epsilons(plain_eps, spent, optimizer)
                for row in rows[-len(out) + 2:]:
                    row["seconds"] = time.perf_counter() - start
                print(json.dumps(rows[-1]), flush=True)
    return rows


def choose(rows) -> dict:
    """The declared rule: the cyclic candidate with the lowest mean public validation NLL over the seeds."""
    means = {}
    for row in rows:
        if "cycles" in row:
            means.setdefault(row["posterior"], []).append(row)
    best = min(means, key=lambda name: np.mean([r["nll"] for r in means[name]]))
    first = means[best][0]
    return {"posterior": best, "cycles": first["cycles"], "peak": first["peak"],
            "members": first["member_kind"], "skip_first": first["skip_first"],
            "mean_nll": float(np.mean([r["nll"] for r in means[best]]))}


def digits_rows(seeds, cycles, peak, members, skip_first, reference=False, epsilon=1.0) -> list:
    """Per seed on DIGITS: the plain run's posteriors, the cyclic run's, and the non-private network."""
    import tfdpbnn
    from experiments.ood_posteriors import _ood_sets
    from tfdpbnn.commands import train_recipes

    rows = []
    for seed in seeds:
        (x, y), (x_test, y_test) = tfdpbnn.data.load_digits(seed=seed)
        x, x_test = (x - 0.5).astype("float32"), (x_test - 0.5).astype("float32")
        ood = _ood_sets(x_test, seed)
        start = time.perf_counter()
        model, _, plain_eps, plain = _plain(x, y, seed, 10_000 + seed, 20_000 + seed, epsilon)
        for name, weights in plain.items():
            rows.append(dict(_scores(model, weights, x_test, y_test, ood), seed=seed,
                             posterior=f"dpsgd, {name}", epsilon=plain_eps,
                             seconds=time.perf_counter() - start))
        start = time.perf_counter()
        model, optimizer, spent, out = _cyclic(x, y, seed, 10_000 + seed, 20_000 + seed, cycles, peak,
                                               epsilon)
        _check_epsilons(plain_eps, spent, optimizer)
        chosen = candidate_name(cycles, peak, members, skip_first)
        for name, weights in ((chosen, out[(members, skip_first)]), ("cyclic, ema", out["cyclic, ema"]),
                              ("cyclic, last iterate", out["cyclic, last iterate"])):
            rows.append(dict(_scores(model, weights, x_test, y_test, ood), seed=seed, posterior=name,
                             epsilon=spent, seconds=time.perf_counter() - start))
        _check_epsilons(plain_eps, spent, optimizer)
        if reference:
            start = time.perf_counter()
            model = train_recipes.build_model("dpsgd", (64,), 10, len(x), 64, seed)
            train_recipes.pretrain_arrays(model, x, y, seed, train_recipes.PublicPretraining())
            rows.append(dict(_scores(model, [model.get_weights()], x_test, y_test, ood), seed=seed,
                             posterior="non-private (Adam)", epsilon=float("inf"),
                             seconds=time.perf_counter() - start))
        for row in rows[-(5 + reference):]:
            print(json.dumps(row), flush=True)
    return rows


COLUMNS = (("accuracy", "accuracy"), ("ece", "ECE"), ("nll", "NLL"), ("auroc_noise", "AUROC noise (entropy)"),
           ("auroc_inverted", "AUROC inverted (entropy)"), ("auroc_noise_mi", "AUROC noise (MI)"),
           ("auroc_inverted_mi", "AUROC inverted (MI)"))


def table(rows, sort_by_nll=False) -> str:
    """Markdown: mean ± std over seeds per posterior (sorted by mean NLL with ``sort_by_nll``)."""
    names = list(dict.fromkeys(r["posterior"] for r in rows))
    if sort_by_nll:
        names.sort(key=lambda name: np.mean([r["nll"] for r in rows if r["posterior"] == name]))
    lines = ["| posterior | seeds | members | " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|" + " --- |" * (len(COLUMNS) + 3)]
    for name in names:
        group = [r for r in rows if r["posterior"] == name]
        cells = [f"{np.mean([r[k] for r in group]):.3f} ± {np.std([r[k] for r in group]):.3f}"
                 for k, _ in COLUMNS]
        lines.append(f"| {name} | {len(group)} | {group[0]['members']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired(rows, posterior, against="dpsgd, ema") -> dict:
    """Per column: ``posterior`` minus ``against`` paired by seed (mean, std, how many seeds higher)."""
    by_seed = {r["seed"]: r for r in rows if r["posterior"] == against}
    out = {}
    for key, _ in COLUMNS:
        d = np.array([r[key] - by_seed[r["seed"]][key] for r in rows if r["posterior"] == posterior])
        out[key] = {"mean": float(d.mean()), "std": float(d.std()), "higher": int((d > 0).sum()), "n": len(d)}
    return out


def main(argv=None) -> int:
    """``--public``: score every candidate on public data and print the choice; else the DIGITS run."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--public", action="store_true", help="the candidates on public data (the choice)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--peak", type=float, default=2.0)
    p.add_argument("--members", choices=MEMBERS, default="snapshots")
    p.add_argument("--skip-first", action="store_true")
    p.add_argument("--reference", action="store_true", help="also the network without privacy")
    p.add_argument("--out", default=os.path.join("runs", "ood_cyclic"))
    args = p.parse_args(argv)
    if args.skip_first and args.cycles < 3:
        p.error("--skip-first needs --cycles >= 3")
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    meta = {"command": "python experiments/ood_cyclic.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, TensorFlow CPU",
            "load_average_start": os.getloadavg()}
    if args.public:
        rows = public_rows(args.seeds)
        result = {"choice": choose(rows)}
        text = table(rows, sort_by_nll=True)
    else:
        rows = digits_rows(args.seeds, args.cycles, args.peak, args.members, args.skip_first, args.reference)
        chosen = candidate_name(args.cycles, args.peak, args.members, args.skip_first)
        names = (chosen, "cyclic, ema", "cyclic, last iterate", "dpsgd, last iterate")
        result = {"paired_vs_dpsgd_ema": {name: paired(rows, name) for name in names}}
        text = table(rows)
        for name, diffs in result["paired_vs_dpsgd_ema"].items():
            text += (f"\n{name} minus dpsgd, ema (paired by seed, mean ± std; seeds higher): "
                     + "; ".join(f"{k} {d['mean']:+.3f} ± {d['std']:.3f} ({d['higher']}/{d['n']})"
                                 for k, d in diffs.items()) + "\n")
    meta.update(seconds=time.perf_counter() - start, load_average_end=os.getloadavg())
    print(json.dumps(result), flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, **result, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
