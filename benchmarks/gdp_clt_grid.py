"""Where does the GDP central-limit approximation under-report against PLD? (delta = 1e-5).

Prints one markdown row per (sigma, q, steps): GDP epsilon, PLD epsilon (discretization 1e-4), their ratio,
and whether ``tfdpbnn.privacy.gdp.clt_may_underreport`` warns. Rows with ratio < 0.95 and no warning would
be a defect of the rule. Run: ``.venv/bin/python benchmarks/gdp_clt_grid.py > gdp_grid.md`` (~10 min).
"""

import itertools
import warnings

import dp_accounting as dpa

from tfdpbnn.privacy import GDPAccountant, dp_sgd_event
from tfdpbnn.privacy.gdp import clt_may_underreport

DELTA = 1e-5


def main() -> None:
    """Print the GDP/PLD epsilon ratio over the (sigma, q, steps) grid."""
    warnings.simplefilter("ignore")
    print("| sigma | q | steps | GDP | PLD | GDP/PLD | warns |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    missed = 0
    for s, q, t in itertools.product([0.6, 0.8, 1.0, 1.5, 2.0, 4.0], [0.001, 0.004, 0.01, 0.02, 0.05, 0.1],
                                     [10, 50, 100, 1000, 10000]):
        event = dp_sgd_event(s, q, t)
        pld = dpa.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA)
        gdp = GDPAccountant().compose(event).get_epsilon(DELTA)
        warns = clt_may_underreport(q, s, t)
        missed += (gdp < 0.95 * pld) and not warns
        print(f"| {s} | {q} | {t} | {gdp:.4f} | {pld:.4f} | {gdp / pld:.3f} | {'yes' if warns else 'no'} |",
              flush=True)
    print(f"\nunder-reporting by >5% without a warning: {missed} rows")


if __name__ == "__main__":
    main()
