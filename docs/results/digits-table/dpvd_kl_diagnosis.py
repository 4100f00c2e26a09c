"""DPVD anomaly diagnosis (docs/results.md, digits-table): DPVD with the epsilon-1 tuned setting (64 tanh, q 0.3,
30 epochs, lr 1, C 1) on the validation split at epsilon 10 and 1, with the KL term of DenseVariational at
weight 1 (the ELBO) and 0; prints log alpha / theta statistics per layer after epochs 1, 10, 20, 30 (seed 100)
and validation accuracies (deterministic, MC) for seeds 100 and 101.

Run (commit 516a3ff, 2026-11-22, shared loaded machine, about 4 minutes):
  PYTHONPATH=$PWD nice -n 10 python docs/results/digits-table/dpvd_kl_diagnosis.py 1,0 > dpvd_kl_diagnosis.log
"""
import sys, time, numpy as np, tensorflow as tf
from experiments import digits_table as dt
from tfdpbnn import data, layers

(xtr, ytr), (xte, yte) = data.load_digits()
xtr = np.asarray(xtr, np.float32).reshape(len(xtr), -1); ytr = np.asarray(ytr).astype(int).ravel()
xa, ya, xv, yv = dt._split_validation(xtr, ytr)
S = dt.Setting(hidden=64, activation="tanh", sample_rate=0.3, epochs=30, learning_rate=1.0, lr_decay=False,
               clip=1.0, center=True, mc_samples=5)
orig = dt._hidden_and_output
KLSCALE = {"v": 1.0}
def patched(method, setting, n):
    if method != "dpvd": return orig(method, setting, n)
    nn = int(n / KLSCALE["v"]) if KLSCALE["v"] > 0 else 10**12
    h, act = setting["hidden"], setting["activation"]
    return [layers.DenseVariational(h, num_examples=nn, activation=act), layers.DenseVariational(10, num_examples=nn)]
dt._hidden_and_output = patched
stats = []
class CB(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch % 10 == 9 or epoch == 0:
            for li, l in enumerate(self.model.layers):
                if hasattr(l, "log_alpha"):
                    la = l.log_alpha.numpy(); th = l.theta.numpy()
                    stats.append((epoch, li, float(np.median(la)), float((la > 3).mean()), float(np.abs(th).max()),
                                  float(np.mean(np.abs(th) < 1e-3)), float(np.std(th))))
orig_fit = tf.keras.Model.fit
def fit(self, *a, **k):
    k["callbacks"] = [CB()]; return orig_fit(self, *a, **k)
tf.keras.Model.fit = fit
for ks in [float(v) for v in sys.argv[1].split(",")]:
    KLSCALE["v"] = ks
    for eps in [10.0, 1.0]:
        for method in (["dpvd", "dpsgd"] if ks == 1.0 else ["dpvd"]):
            accs = []
            for seed in range(2):
                stats.clear()
                r = dt.train_and_evaluate(method, S, eps, xa, ya, xv, yv, seed=100 + seed)
                accs.append((r["accuracy"], r["accuracy_mc"]))
                if method == "dpvd" and seed == 0:
                    for s in stats: print("   ep %d layer %d median_la %.2f pruned %.3f max|th| %.2f frac|th|<1e-3 %.3f std %.3f" % s)
            print(f"KL x{ks} {method} eps {eps}: sigma {r['sigma']:.2f} acc {accs}", flush=True)
