"""Validation-only probe after the digits-table runs: DP-SGD at epsilon 1, more candidates (2 seeds each,
validation split; the test set is not used). Run at commit f66e841 (2026-11-22, ~150 s, loaded machine):
  PYTHONPATH=$PWD nice -n 10 python docs/results/digits-table/dpsgd_eps1_probe.py > dpsgd_eps1_probe.log
Columns: hidden, q, steps, lr, sigma, last-iterate accuracy, best of (last, EMA 0.8/0.9/0.97)."""
import numpy as np
from experiments import digits_table as dt
from tfdpbnn import data
(xtr, ytr), _ = data.load_digits()
xtr = np.asarray(xtr, np.float32).reshape(len(xtr), -1); ytr = np.asarray(ytr).astype(int).ravel()
xa, ya, xv, yv = dt._split_validation(xtr, ytr)
C = dt._cand
cands = [C(0, 0.5, 20, 1.0), C(0, 0.5, 20, 2.0), C(0, 1.0, 30, 2.0), C(0, 0.3, 30, 1.0), C(0, 0.1, 10, 2.0),
         C(0, 0.1, 20, 1.0), C(64, 0.5, 30, 2.0)]
for c in cands:
    rs = [dt.train_and_evaluate("dpsgd", c, 1.0, xa, ya, xv, yv, seed=100 + k) for k in range(2)]
    best = max([("last", np.mean([r["accuracy_last"] for r in rs]))] + [(d, np.mean([r[f"accuracy_ema{d:g}"] for r in rs])) for d in dt.EMA_DECAYS], key=lambda t: t[1])
    print(c["hidden"], c["sample_rate"], dt.steps_for(c, len(xa))[1], c["learning_rate"], "sigma %.2f" % rs[0]["sigma"],
          "last %.3f" % np.mean([r["accuracy_last"] for r in rs]), "best", best, flush=True)
