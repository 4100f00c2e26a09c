"""``sigma-curve``: Ermis & Cemgil (2017a, Figure 3), sigma against epsilon, with sound accountants beside it.

Ermis & Cemgil (2017a, DP Variational Dropout, sec. 5 and Fig. 3) computes the noise multiplier sigma for
a total budget (epsilon, delta = 1e-5) with two procedures: advanced composition ("AC": Gaussian mechanism,
amplification by subsampling, Dwork & Roth Thm 3.20) and its zCDP procedure (per-step amplification, then a
conversion of the per-step (eps', delta')-DP to zCDP that does not hold: ``docs/privacy.md``,
docs/soundness.md, finding 2). Its settings: MNIST q = 0.01 for 200 epochs, DIGITS q = 0.05 for 100 epochs; at
epsilon 1 it reports sigma = 8.24 (AC) and 2.68 (zCDP) on MNIST, 9.73 and 2.97 on DIGITS.

This experiment recomputes the paper's two curves (``tfdpbnn.privacy.paper``) and the sigma that sound
accountants need for the same Poisson-subsampled Gaussian mechanism: RDP, PLD (dp-accounting), tfdpbnn's
sound zCDP, the AC accountant, and the GDP central-limit approximation of Zhang et al. (2022)
(approximate, marked).
Outputs: ``sigma_curve.csv`` (one row per setting, accountant and epsilon) and ``sigma_curve.png``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["PAPER_SIGMAS", "SETTINGS", "paper_sigma", "run"]

# Ermis & Cemgil's (2017a) two settings (sec. 5): sample rate and epochs; steps = epochs / sample rate.
SETTINGS = {
    "MNIST": dict(sample_rate=0.01, epochs=200),
    "DIGITS": dict(sample_rate=0.05, epochs=100),
}
# Sigma values printed in Ermis & Cemgil's (2017a) text at epsilon 1 (delta 1e-5), to check our
# re-implementation.
PAPER_SIGMAS = {("MNIST", "paper-ac"): 8.24, ("MNIST", "paper-zcdp"): 2.68,
                ("DIGITS", "paper-ac"): 9.73, ("DIGITS", "paper-zcdp"): 2.97}
EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
SMOKE_EPSILONS = (1.0, 2.0)
DELTA = 1e-5
# Sound accountants first, then the CLT approximation (Zhang et al. 2022), then the papers' own procedures.
# The papers leave the number of compositions J unspecified: "paper-zcdp" reads J = steps (literal),
# "paper-zcdp-epochs" J = epochs; neither reproduces the printed sigmas exactly (``tfdpbnn.privacy.paper``).
CURVES = ("rdp", "pld", "zcdp", "ac", "gdp", "paper-zcdp", "paper-zcdp-epochs", "paper-ac")
VALID = {"rdp": "sound", "pld": "sound", "zcdp": "sound", "ac": "sound",
         "gdp": "approximate (CLT, Zhang et al. 2022, Thm 2)",
         "paper-zcdp": "not a guarantee (docs/soundness.md, finding 2)",
         "paper-zcdp-epochs": "not a guarantee (docs/soundness.md, finding 2)",
         "paper-ac": "not a guarantee (classical calibration beyond eps < 1)"}


def paper_sigma(method: str, epsilon: float, delta: float, sample_rate: float, steps: int,
                compositions: int | None = None) -> float:
    """Sigma from Ermis & Cemgil's (2017a, 2017b) own procedures (``tfdpbnn.privacy.paper``).

    ``method``: "ac" (advanced composition) or "zcdp" (the papers' zCDP procedure).
    ``compositions``: the zCDP procedure's J (default ``steps``).
    """
    from tfdpbnn.privacy import paper

    if method == "ac":
        return float(paper.ac_noise_multiplier(epsilon, delta, sample_rate, steps))
    if method == "zcdp":
        return float(paper.zcdp_noise_multiplier(epsilon, delta, sample_rate, steps,
                                                 compositions=compositions))
    raise ValueError(f"method: must be 'ac' or 'zcdp', got {method!r}")


def _sigma(curve: str, epsilon: float, sample_rate: float, steps: int, epochs: int) -> float:
    from tfdpbnn import privacy

    if curve == "paper-zcdp-epochs":
        return paper_sigma("zcdp", epsilon, DELTA, sample_rate, steps, compositions=epochs)
    if curve.startswith("paper-"):
        return paper_sigma(curve[len("paper-"):], epsilon, DELTA, sample_rate, steps)
    return float(privacy.calibrate_noise(epsilon, DELTA, sample_rate, steps, accountant=curve,
                                         sampling="poisson"))


def _plot(rows, path, settings):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4.2), squeeze=False)
    styles = {"paper-ac": ("k", "--"), "paper-zcdp": ("r", "--"), "paper-zcdp-epochs": ("orange", "--"),
              "zcdp": ("r", "-"), "rdp": ("b", "-"), "pld": ("g", "-"), "gdp": ("m", ":"), "ac": ("k", "-")}
    for ax, setting in zip(axes[0], settings, strict=True):
        for curve in CURVES:
            pts = [(r["epsilon"], r["sigma"]) for r in rows
                   if r["setting"] == setting and r["curve"] == curve and math.isfinite(r["sigma"])]
            if not pts:
                continue
            color, ls = styles[curve]
            label = curve + ("" if VALID[curve] == "sound" else f" ({VALID[curve].split(' (')[0]})")
            ax.plot(*zip(*pts, strict=True), color=color, linestyle=ls, marker="o", ms=3, label=label)
        for (name, curve), value in PAPER_SIGMAS.items():
            if name == setting:
                ax.plot([1.0], [value], marker="*", ms=11, ls="none", color=styles[curve][0],
                        label=f"{curve} as printed in Ermis & Cemgil (2017a)")
        s = settings[setting]
        ax.set(xscale="log", yscale="log", xlabel="epsilon (delta = 1e-5)", ylabel="noise multiplier sigma",
               title=f"{setting}: q = {s['sample_rate']}, {s['epochs']} epochs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Ermis & Cemgil 2017a, Fig. 3, redrawn: sigma for (epsilon, 1e-5), Poisson-subsampled "
                 "Gaussian")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(out_dir: str, seeds: int | None = None, smoke: bool = False, data_dir: str | None = None,
        log: Callable[[str], None] | None = print, epsilons=None, **unknown) -> dict:
    """Compute sigma(epsilon) for every curve and setting; write CSV, PNG and ``run.json``."""
    from experiments.runner import Run

    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an option of sigma-curve (it takes epsilons only)")
    if data_dir is not None:
        raise ValueError("data_dir: sigma-curve needs no data")
    settings = {"DIGITS": SETTINGS["DIGITS"]} if smoke else dict(SETTINGS)
    if epsilons is None:
        epsilons = SMOKE_EPSILONS if smoke else EPSILONS
    epsilons = tuple(float(e) for e in epsilons)
    if not epsilons or any(not e > 0 for e in epsilons):
        raise ValueError(f"epsilons: need at least one epsilon > 0, got {epsilons!r}")
    run_ = Run("sigma-curve", out_dir, dict(settings=settings, epsilons=list(epsilons), delta=DELTA,
                                            curves=list(CURVES), sampling="poisson", smoke=smoke),
               seeds=(), log=log)
    rows = []
    for setting, s in run_.progress(settings.items(), "setting"):
        steps = int(round(s["epochs"] / s["sample_rate"]))
        for curve in CURVES:
            for eps in epsilons:
                try:
                    sigma = _sigma(curve, eps, s["sample_rate"], steps, s["epochs"])
                    err = ""
                except Exception as e:  # noqa: BLE001 - an accountant that cannot answer is recorded
                    sigma, err = float("nan"), f"{type(e).__name__}: {e}"
                rows.append(dict(setting=setting, sample_rate=s["sample_rate"], epochs=s["epochs"],
                                 steps=steps, curve=curve, validity=VALID[curve], epsilon=eps, sigma=sigma,
                                 paper_sigma=PAPER_SIGMAS.get((setting, curve), "") if eps == 1.0 else "",
                                 error=err))
                run_.log(f"{setting} {curve:10s} eps={eps:<5g} sigma={sigma:.3f} {err}")
    run_.write_csv("sigma_curve.csv", rows)
    _plot(rows, run_.path("sigma_curve.png"), settings)
    return run_.finish()
