"""``digits-ablation``: which changes to Ermis & Cemgil's (2017a, 2017b) DIGITS setting matter for DP-SGD.

The budget is epsilon 1 throughout.

Starting from the papers' setting (64-1000-10 ReLU, expected batch 100, 100 epochs, C = 2,
eta_t = 0.05 / (1 + epoch)) and sound accounting (Poisson sampling, sigma from RDP for epsilon 1,
delta 1e-5), one change is added at a time, cumulatively:

1. large expected batches, few steps (q = 0.1, 10 epochs: 140 steps instead of 1500, so sigma drops);
2. a larger constant learning rate (no 1/t decay);
3. tempered activations (tanh instead of ReLU, Papernot et al. 2021);
4. centred inputs (x - 0.5: data-independent, so free of privacy cost);
5. clip C = 1;
6. a smaller network (64 hidden units), then no hidden layer (multinomial logistic regression).

Accuracy is measured on a validation split carved from the training set (20%, stratified; the test set is
never used here), mean and std over seeds. Outputs ``ablation.csv`` and ``run.json``.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["STEPS", "run"]

STEPS = (
    ("papers' setting (ReLU 1000, B=100, 100 epochs, lr 0.05/t, C=2)", {}),
    ("+ q=0.1, 10 epochs", dict(sample_rate=0.1, epochs=10)),
    ("+ constant lr 0.5", dict(learning_rate=0.5, lr_decay=False)),
    ("+ tanh", dict(activation="tanh")),
    ("+ centred inputs", dict(center=True)),
    ("+ clip 1", dict(clip=1.0)),
    ("+ 64 hidden units", dict(hidden=64)),
    ("+ no hidden layer, lr 1", dict(hidden=0, learning_rate=1.0)),
)


def run(out_dir: str, seeds: int | None = None, smoke: bool = False, data_dir: str | None = None,
        log: Callable[[str], None] | None = print, epsilons=None, methods=None, **unknown) -> dict:
    """Run the cumulative ablation for DP-SGD (or ``methods``) at epsilon 1 (or ``epsilons``)."""
    import numpy as np

    from experiments.digits_table import (
        DELTA,
        METHODS,
        Setting,
        _split_validation,
        paper_setting,
        train_and_evaluate,
    )
    from experiments.runner import Run, mean_std
    from tfdpbnn import data

    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an option of digits-ablation")
    if data_dir is not None:
        raise ValueError("data_dir: digits-ablation runs on the bundled DIGITS only")
    methods = tuple(methods or ("dpsgd",))
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: each must be one of {METHODS}, got {m!r}")
    epsilons = tuple(float(e) for e in (epsilons or (1.0,)))
    n_seeds = (1 if smoke else 3) if seeds is None else int(seeds)
    trained = {label for label, _ in (STEPS[-2:] if smoke else STEPS)}  # smoke: train the last two only
    run_ = Run("digits-ablation", out_dir, dict(methods=list(methods), epsilons=list(epsilons), delta=DELTA,
                                                sampling="poisson", smoke=smoke, evaluated_on="validation"),
               seeds=range(n_seeds), log=log)
    (x_train, y_train), _ = data.load_digits()
    x_train = np.asarray(x_train, np.float32).reshape(len(x_train), -1)
    xa, ya, xv, yv = _split_validation(x_train, np.asarray(y_train).astype(int).ravel())
    rows = []
    for method in run_.progress(methods, "method"):
        for eps in epsilons:
            setting = dict(paper_setting(method))
            for label, change in STEPS:
                setting.update(change)
                if label not in trained:
                    continue
                s = Setting(**setting)
                if smoke:
                    s.update(sample_rate=0.2, epochs=1, hidden=min(s["hidden"], 8))
                results = [train_and_evaluate(method, s, eps, xa, ya, xv, yv, seed=200 + k)
                           for k in range(n_seeds)]
                m, sd = mean_std([max(r["accuracy"], r["accuracy_mc"]) for r in results])
                r0 = results[0]
                rows.append({**s, **dict(method=method, epsilon=eps, change=label, val_accuracy_mean=m,
                                         val_accuracy_std=sd, seeds=n_seeds, sigma=r0["sigma"],
                                         sample_rate=r0["sample_rate"], steps=r0["steps_run"],
                                         train_time_s=float(np.mean([r["train_time_s"] for r in results])))})
                run_.privacy(f"{method}/eps={eps:g}/{label}", r0["sigma"], r0["sample_rate"], r0["steps_run"],
                             DELTA, sampling="poisson", clip=s["clip"])
                run_.log(f"{method} eps={eps:g} {label}: val acc {m:.4f} +- {sd:.4f} "
                         f"(sigma {r0['sigma']:.2f}, {r0['steps_run']} steps)")
    run_.write_csv("ablation.csv", rows)
    return run_.finish()
