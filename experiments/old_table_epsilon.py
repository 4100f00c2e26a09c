"""The total epsilon of the earlier "tuned per epsilon" digits table, search included (naive composition).

    python experiments/old_table_epsilon.py

That table trained, for each method and target epsilon, every candidate of its grid with 2 seeds on the
1150-image tuning split (each run calibrated by RDP to the target), chose by EXACT validation accuracy, then
retrained the choice on all 1437 images with 5 seeds. Exact accuracy on private data is not a DP release, so
as run no finite epsilon covers that table. This script states what it would have cost had each validation
score been released through a noisy count whose RDP stays below the training run's (what
``tfdpbnn.tuning.private_search`` does, free under parallel composition): the RDP curves of all tuning runs
plus one final run add up (naive composition), and with all 5 final runs released, of those too.
"""

from __future__ import annotations

import math

import numpy as np

import tfdpbnn
from tfdpbnn.tuning import bounds

DELTA = 1e-5
N_TUNE, N_FULL = 1150, 1437
# (sample rate q, epochs) of the earlier grid's candidates per target epsilon (docs/results.md, digits-table).
GRID = {
    10.0: [(0.3, 30), (0.1, 30), (0.1, 60), (0.3, 60), (0.1, 30)],
    1.0: [(0.1, 10), (0.2, 20), (0.1, 30), (0.3, 30), (0.3, 30)],
    0.5: [(0.1, 10), (0.3, 10), (0.3, 15), (0.5, 10), (0.3, 30)],
    0.1: [(0.3, 3), (0.5, 4), (1.0, 5), (1.0, 10), (0.3, 10)],
}
CACHE: dict = {}


def curve(eps, q, epochs, n):
    """RDP curve of one run calibrated by RDP to ``eps`` with sample rate q (steps ceil(1/q) per epoch)."""
    key = (eps, q, epochs, n)
    if key not in CACHE:
        batch = max(1, int(round(q * n)))
        qq = batch / n
        steps = math.ceil(1 / q - 1e-9) * epochs
        sigma = tfdpbnn.privacy.calibrate_noise(eps, DELTA, qq, steps, accountant="rdp", sampling="poisson")
        CACHE[key] = bounds.training_rdp(sigma, qq, steps)
    return CACHE[key]


def main():
    """Print, per target epsilon and method, the total epsilon of the search plus one and five final runs."""
    print("| target epsilon | method | tuning runs | total epsilon, 1 final model | total, 5 final models |")
    for eps, grid in GRID.items():
        for method, extra in (("dpd, svi, sgld, dpsgd", 0), ("dpvd", 2)):
            cands = grid + [grid[0]] * extra  # DPVD also tried the first candidate with 2 KL weights
            tuning = [curve(eps, q, e, N_TUNE) for q, e in cands for _ in range(2)]
            # The final run: the costliest candidate bounds whichever was chosen.
            final = max(
                (curve(eps, q, e, N_FULL) for q, e in grid),
                key=lambda c: bounds.epsilon(bounds.ORDERS, c, DELTA),
            )
            one = bounds.epsilon(bounds.ORDERS, np.sum(tuning, axis=0) + final, DELTA)
            five = bounds.epsilon(bounds.ORDERS, np.sum(tuning, axis=0) + 5 * final, DELTA)
            print(f"| {eps:g} | {method} | {len(tuning)} | {one:.2f} | {five:.2f} |", flush=True)


if __name__ == "__main__":
    main()
