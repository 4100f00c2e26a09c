"""Shared pieces of the honest-epsilon experiments (``honest_table.py``, ``recipes.py``); public API only.

Methods (one optional tanh hidden layer, 10 logits, clip C = 1, inputs centred as x - 0.5):
``dpsgd`` (Dense + ``DPSGDOptimizer``), ``dpvd`` (``DenseVariational`` + ``DPVDOptimizer``, Ermis & Cemgil
2017a), ``dpd`` (Dense + Gaussian ``MCDropout`` + DP-SGD, Ermis & Cemgil 2017b), ``svi``
(``DenseBayesByBackprop`` + DP-SGD, Ermis & Cemgil 2017a's SVI / DP-BBP), ``sgld`` (Dense +
``DPSGLDOptimizer``, step size (B / (n sigma C))^2).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfdpbnn
from tfdpbnn.optimizers.dpsgld import sgld_learning_rate

METHODS = ("dpsgd", "dpvd", "dpd", "svi", "sgld")
STOCHASTIC = ("dpvd", "dpd", "svi")


def load(validation_fraction: float = 0.2, seed: int = 1234):
    """DIGITS centred, split into private training and validation splits and the public test set.

    The validation split is stratified with a fixed seed; both it and the training split are private data.
    """
    (x, y), (xt, yt) = tfdpbnn.data.load_digits()
    x, xt = (x - 0.5).astype("float32"), (xt - 0.5).astype("float32")
    rng = np.random.default_rng(seed)
    val = np.zeros(len(y), bool)
    for c in np.unique(y):
        idx = np.nonzero(y == c)[0]
        rng.shuffle(idx)
        val[idx[: int(round(validation_fraction * len(idx)))]] = True
    return (x[~val], y[~val]), (x[val], y[val]), (x, y), (xt, yt)


def ood_inputs(x_test, seed: int = 0):
    """Two data-independent out-of-distribution sets, centred like the inputs.

    The sets are uniform noise images, and the test digits turned upside down and mirrored (rotated 180
    degrees).
    """
    rng = np.random.default_rng(seed)
    noise = rng.uniform(0, 1, size=x_test.shape).astype("float32") - 0.5
    rotated = x_test.reshape(-1, 8, 8)[:, ::-1, ::-1].reshape(len(x_test), 64)
    return {"noise": noise, "rot180": np.ascontiguousarray(rotated)}


def _layers(method, hidden, n, kl_weight):
    L, K = tfdpbnn.layers, tf.keras.layers
    n_kl = int(round(n / kl_weight))  # the Bayesian layers add KL / num_examples: weight kl_weight
    if method == "dpvd":
        return ([L.DenseVariational(hidden, num_examples=n_kl, activation="tanh")] if hidden else []) + [
            L.DenseVariational(10, num_examples=n_kl)
        ]
    if method == "svi":
        return ([L.DenseBayesByBackprop(hidden, num_examples=n_kl, activation="tanh")] if hidden else []) + [
            L.DenseBayesByBackprop(10, num_examples=n_kl)
        ]
    if method == "dpd":
        if hidden:
            return [K.Dense(hidden, activation="tanh"), L.MCDropout(0.5, gaussian=True), K.Dense(10)]
        return [L.MCDropout(0.2, gaussian=True), K.Dense(10)]
    return ([K.Dense(hidden, activation="tanh")] if hidden else []) + [K.Dense(10)]


def build(method: str, hp: dict, n: int, input_dim: int = 64):
    """The compiled model of ``method`` for candidate ``hp``, to be trained on ``n`` examples.

    ``hp`` keys: hidden, lr, batch_size, epochs, noise_multiplier, optional kl_weight, schedule "cosine",
    clip.
    """
    clip = hp.get("clip", 1.0)
    model = tf.keras.Sequential(
        [tf.keras.Input((input_dim,))] + _layers(method, hp["hidden"], n, hp.get("kl_weight", 1.0))
    )
    common = dict(num_examples=n, batch_size=hp["batch_size"], sampling="poisson")
    steps = hp["epochs"] * int(np.ceil(n / hp["batch_size"] - 1e-9))
    lr = hp["lr"]
    if hp.get("schedule") == "cosine":
        lr = tf.keras.optimizers.schedules.CosineDecay(lr, decay_steps=steps)
    if method == "sgld":
        eta = sgld_learning_rate(hp["noise_multiplier"], clip, n, hp["batch_size"])
        opt = tfdpbnn.DPSGLDOptimizer(clip, learning_rate=eta, **common)
    elif method == "dpvd":
        opt = tfdpbnn.DPVDOptimizer(clip, noise_multiplier=hp["noise_multiplier"], learning_rate=lr, **common)
    else:
        opt = tfdpbnn.DPSGDOptimizer(
            clip, noise_multiplier=hp["noise_multiplier"], learning_rate=lr, **common
        )
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def mc_probs(model, x, method, mc_samples=20):
    """Predictive probabilities: MC average over ``mc_samples`` for the stochastic methods, else one pass."""
    samples = mc_samples if method in STOCHASTIC else 1
    return np.asarray(tfdpbnn.uncertainty.mc_predict(model, x, num_samples=samples, from_logits=True).mean)


def auroc(in_scores, out_scores) -> float:
    """Area under the ROC curve for telling OOD (positive) from in-distribution by score.

    Computed as the Mann-Whitney U / (n_in n_out), ties counted half.
    """
    a, b = np.asarray(out_scores, float), np.asarray(in_scores, float)
    allv = np.concatenate([a, b])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    ranks[order] = np.arange(1, len(allv) + 1)
    for v in np.unique(allv):  # average ranks of ties
        m = allv == v
        if m.sum() > 1:
            ranks[m] = ranks[m].mean()
    return float((ranks[: len(a)].sum() - len(a) * (len(a) + 1) / 2) / (len(a) * len(b)))


def entropy(p):
    """Predictive entropy (nats) of each row of class probabilities ``p``; probabilities floored at 1e-12."""
    return -np.sum(p * np.log(np.clip(p, 1e-12, 1.0)), axis=1)


def evaluate(model, method, x_test, y_test, ood, mc_samples=20) -> dict:
    """Test accuracy, ECE, NLL and the AUROC of predictive entropy against each OOD set.

    Accuracy is reported MC-averaged for the stochastic methods and for one deterministic pass.
    """
    p = mc_probs(model, x_test, method, mc_samples)
    det = np.asarray(tf.nn.softmax(model(x_test, training=False)))
    out = {
        "accuracy": float(np.mean(p.argmax(1) == y_test)),
        "accuracy_deterministic": float(np.mean(det.argmax(1) == y_test)),
        "ece": float(tfdpbnn.expected_calibration_error(p, y_test)),
        "nll": float(-np.mean(np.log(np.clip(p[np.arange(len(y_test)), y_test], 1e-12, 1.0)))),
    }
    h_in = entropy(p)
    for name, xo in ood.items():
        out[f"auroc_{name}"] = auroc(h_in, entropy(mc_probs(model, xo, method, mc_samples)))
    return out


class EMA(tf.keras.callbacks.Callback):
    """Exponential moving average of the trainable weights after every step, loaded into the model at the end.

    Post-processing of the DP iterates; Polyak averaging while t / (t + 1) < decay.
    """

    def __init__(self, decay: float):
        super().__init__()
        self.decay = decay

    def on_train_end(self, logs=None):
        """Load the averaged weights into the model."""
        self.swap_in()

    def on_train_begin(self, logs=None):
        """Start the average at the model's current trainable weights."""
        self.t = 0
        self.avg = [w.numpy() for w in self.model.trainable_variables]

    def on_train_batch_end(self, batch, logs=None):
        """Fold the weights after this step into the average with weight 1 - min(decay, t / (t + 1))."""
        self.t += 1
        d = min(self.decay, self.t / (self.t + 1.0))
        for a, w in zip(self.avg, self.model.trainable_variables, strict=True):
            a *= d
            a += (1.0 - d) * w.numpy()

    def swap_in(self):
        """Assign the averaged weights to the model's trainable variables."""
        for a, w in zip(self.avg, self.model.trainable_variables, strict=True):
            w.assign(a)
