"""Numbers quoted in docs/optimizers.md.

Shuffle vs Poisson epsilon, DP-SGLD's equivalent sigma, SI-DPSGD paper-mode epsilon. Run: ``python
benchmarks/optimizers_doc_numbers.py`` (a few seconds, no training).
"""

from __future__ import annotations

import math

from tfdpbnn import privacy
from tfdpbnn.optimizers.dpsgld import sgld_learning_rate, sgld_noise_multiplier
from tfdpbnn.privacy import gdp_epsilon

DELTA = 1e-5


def shuffle_vs_poisson():
    """Print epsilon under shuffled batches beside Poisson sampling."""
    print("| setting | sigma | epochs | epsilon, Poisson (rdp) | epsilon, shuffle (rdp) "
          "| epsilon, shuffle (pld) |")
    print("| --- | --- | --- | --- | --- | --- |")
    settings = (("DIGITS, tfdpbnn train", 1437, 287, 20), ("MNIST, Ermis & Cemgil (2017a)", 60000, 600, 200))
    for name, n, b, epochs in settings:
        q = b / n
        steps = epochs * math.ceil(n / b)
        sigma = privacy.calibrate_noise(1.0, DELTA, q, steps, accountant="rdp", sampling="poisson")
        shuffle_rdp = privacy.compute_epsilon(sigma, q, steps, DELTA, accountant="rdp", sampling="shuffle")
        shuffle_pld = privacy.compute_epsilon(sigma, q, steps, DELTA, accountant="pld", sampling="shuffle")
        print(f"| {name} (n={n}, B={b}) | {sigma:.3f} | {epochs} | 1.00 | {shuffle_rdp:.1f} "
              f"| {shuffle_pld:.1f} |")
        sigma_shuffle = privacy.calibrate_noise(1.0, DELTA, q, steps, accountant="rdp", sampling="shuffle")
        print(f"|   sigma for epsilon 1 under shuffle (rdp) | {sigma_shuffle:.1f} | | | | |")


def sgld():
    """Print DP-SGLD's equivalent DP-SGD noise multipliers."""
    n, b, clip = 1437, 287, 1.0
    for eta in (1e-3, 1e-4):
        sigma = sgld_noise_multiplier(eta, clip, n, b)
        print(f"DP-SGLD n={n} B={b} C={clip} eta={eta:g}: sigma = {sigma:.3f}")
    sigma = privacy.calibrate_noise(1.0, DELTA, b / n, 120, accountant="rdp", sampling="poisson")
    print(f"DP-SGLD at epsilon 1 (120 Poisson steps): sigma {sigma:.3f} -> eta = "
          f"{sgld_learning_rate(sigma, clip, n, b):.3g}, effective DP-SGD step eta*n = "
          f"{sgld_learning_rate(sigma, clip, n, b) * n:.3g}")


def sidp_paper_mode():
    """Print SI-DPSGD paper-mode mu-GDP and epsilon beside the default mode's."""
    for z, steps in ((1.0, 120), (10.0, 120), (100.0, 1000)):
        mu = math.sqrt(steps * (steps + 1) * (2 * steps + 1) / 6) / z
        print(f"SI-DPSGD paper_mean_update, z={z:g}, T={steps}: mu-GDP {mu:.1f}, "
              f"epsilon {gdp_epsilon(mu, DELTA):.1f} (default mode, Poisson q=0.2, rdp: "
              f"{privacy.compute_epsilon(z, 0.2, steps, DELTA, accountant='rdp', sampling='poisson'):.3g})")


if __name__ == "__main__":
    shuffle_vs_poisson()
    sgld()
    sidp_paper_mode()
