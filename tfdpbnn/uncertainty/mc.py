"""Monte Carlo predictive distribution and its uncertainty decomposition.

Classification (Depeweg et al. 2018; Gal 2016 sec. 3.3): with S samples p_s(y | x),
    predictive mean  p(y|x) = 1/S sum_s p_s,   predictive entropy H[p(y|x)],
    expected entropy (aleatoric) 1/S sum_s H[p_s],   mutual information (epistemic) = difference (>= 0).
A one-unit (binary) output is Bernoulli: p_s = [1 - q_s, q_s] with q_s = sigmoid(logit) or the probability
itself, so ``mean`` is [n, 2] (column 1: probability of label 1) and the entropies are Bernoulli entropies.
Regression with a ``HeteroscedasticHead`` (mean mu_s, log-variance log v_s; Kendall & Gal 2017 eq. 9):
    mean = 1/S sum mu_s,  epistemic variance = 1/S sum mu_s^2 - mean^2,  aleatoric variance = 1/S sum v_s.
Samples come from the stochastic layers of ``tfdpbnn.layers`` (switched on by ``mc_sampling()``) or from a
list of weight snapshots (posterior samples, e.g. collected by DP-SGLD, Zhang et al. (2022, sec. 3.1)).
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
import weakref

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn._validation import check_positive_int
from tfdpbnn.layers.sampling import mc_sampling
from tfdpbnn.uncertainty.outputs import resolve_from_logits, to_probabilities
from tfdpbnn.uncertainty.regression import split_mean_log_variance

TASKS = ("classification", "regression")
#: outputs of the classification summary / regression summary, in order.
CLASSIFICATION_KEYS = ("mean", "predictive_entropy", "mutual_information", "expected_entropy")
REGRESSION_KEYS = ("mean", "epistemic_variance", "aleatoric_variance", "variance")


@dataclasses.dataclass
class MCPrediction:
    """Result of ``mc_predict``; classification fields or regression fields are None for the other task."""

    mean: np.ndarray
    num_samples: int
    predictive_entropy: np.ndarray | None = None
    mutual_information: np.ndarray | None = None
    expected_entropy: np.ndarray | None = None
    epistemic_variance: np.ndarray | None = None
    aleatoric_variance: np.ndarray | None = None
    variance: np.ndarray | None = None

    def as_dict(self):
        """The non-None array fields as a dict."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and k != "num_samples"}

    def __getitem__(self, key):
        return self.as_dict()[key]


def check_task(task):
    """Return ``task`` if it is one of ``TASKS``, else raise ``ValueError``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    return task


def sample_statistics(outputs, task, from_logits=False):
    """Per-sample terms whose sums over samples give the summaries (float64 tensors).

    classification: (p, H[p]); regression: (mu, mu^2, exp(log-variance)).
    """
    outputs = tf.cast(outputs, tf.float64)
    if task == "classification":
        probs = to_probabilities(outputs, from_logits)
        entropy = -tf.reduce_sum(tf.math.xlogy(probs, probs), axis=-1)
        return probs, entropy
    mean, log_var = split_mean_log_variance(outputs)
    return mean, tf.square(mean), tf.exp(log_var)


def summaries(sums, num_samples, task):
    """Turn the sums of ``sample_statistics`` over ``num_samples`` samples into the summary dict (tensors)."""
    s = tf.cast(num_samples, tf.float64)
    if task == "classification":
        mean = sums[0] / s
        expected_entropy = sums[1] / s
        predictive_entropy = -tf.reduce_sum(tf.math.xlogy(mean, mean), axis=-1)
        # MI >= 0 mathematically (Jensen); max() only removes float rounding of order 1e-16.
        mutual_information = tf.maximum(predictive_entropy - expected_entropy, 0.0)
        return {"mean": mean, "predictive_entropy": predictive_entropy,
                "mutual_information": mutual_information, "expected_entropy": expected_entropy}
    mean = sums[0] / s
    epistemic = tf.maximum(sums[1] / s - tf.square(mean), 0.0)  # rounding only, as above
    aleatoric = sums[2] / s
    return {"mean": mean, "epistemic_variance": epistemic, "aleatoric_variance": aleatoric,
            "variance": epistemic + aleatoric}


def monte_carlo_summaries(model, x, num_samples, task, from_logits=False):
    """Graph-friendly core: ``num_samples`` runs of ``model(x, training=False)``, summarized.

    The runs happen in a ``tf.while_loop``; returns the ``summaries`` dict. Call (or trace) it inside
    ``mc_sampling()`` to sample.
    """
    tf.debugging.assert_greater_equal(num_samples, 1, message="num_samples must be >= 1")
    first = sample_statistics(model(x, training=False), task, from_logits)

    def body(i, *sums):
        stats = sample_statistics(model(x, training=False), task, from_logits)
        return (i + 1,) + tuple(a + b for a, b in zip(sums, stats, strict=True))

    loop = tf.while_loop(lambda i, *_: i < num_samples, body, (tf.constant(1),) + tuple(first))
    return summaries(list(loop[1:]), num_samples, task)


def _batches(x, batch_size):
    """Input batches of ``x``: slices of ``batch_size`` examples, or the elements of a batched dataset.

    For a dataset whose elements are (x, y) or (x, y, sample_weight) tuples (as in ``model.fit``), the
    first component.
    """
    if isinstance(x, tf.data.Dataset):
        if int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            raise ValueError("x: the dataset is infinite (e.g. .repeat()); pass a finite, batched dataset")
        for element in x:
            yield element[0] if isinstance(element, tuple) and len(element) in (2, 3) else element
        return
    n = int(np.shape(tf.nest.flatten(x)[0])[0])
    if n < 1:
        raise ValueError("x must contain at least one example")
    for start in range(0, n, batch_size):
        yield tf.nest.map_structure(lambda a, s=start: a[s:s + batch_size], x)


#: Keras layers that are the identity at inference, so they add no randomness under ``mc_sampling()``.
KERAS_INFERENCE_IDENTITY = (tf.keras.layers.Dropout, tf.keras.layers.GaussianDropout,
                            tf.keras.layers.GaussianNoise, tf.keras.layers.AlphaDropout)


def _warn_if_not_stochastic(model):
    from tfdpbnn.layers import (
        Conv2DVariational,
        DenseBayesByBackprop,
        DenseVariational,
        MCDropout,
        NoisyConv2D,
        NoisyDense,
    )

    modules = list(_private_api.submodules(model))
    keras_noise = sorted({type(m).__name__ for m in modules if isinstance(m, KERAS_INFERENCE_IDENTITY)})
    sampling = (MCDropout, NoisyDense, NoisyConv2D, DenseBayesByBackprop, DenseVariational, Conv2DVariational)
    if keras_noise:
        warnings.warn(f"mc_predict: the model's Keras layers {keras_noise} are the identity at inference, so "
                      "they add no randomness to the MC samples; use tfdpbnn.layers.MCDropout (rate, "
                      "gaussian=...) for MC dropout", UserWarning, stacklevel=3)
    if not any(isinstance(m, sampling) for m in modules):
        warnings.warn("mc_predict: the model has no tfdpbnn stochastic layer (MCDropout, DenseVariational, "
                      "Conv2DVariational, DenseBayesByBackprop, NoisyDense, NoisyConv2D), so all samples are "
                      "equal and mutual_information is 0; use such layers or pass weight_snapshots",
                      UserWarning, stacklevel=3)


#: per model, its traced MC and forward functions keyed by (kind, task, from_logits): one tf.function per
#: model and setting, reused across calls (a fresh one per call would retrace every time). Weak keys: the
#: functions reach the model through a weak reference, so caching does not keep a model alive.
_FUNCTIONS = weakref.WeakKeyDictionary()


def traced_function(model, kind, task, from_logits):
    """The cached ``tf.function`` of ``model`` for ``kind`` "mc" or "forward".

    "mc": ``monte_carlo_summaries`` of a batch and a sample count (call it inside ``mc_sampling()``);
    "forward": ``model(x, training=False)``. ``reduce_retracing=True`` relaxes the batch dimension after a
    second shape, so batches of any size reuse at most a few traces
    (``fn.experimental_get_tracing_count()`` counts them).
    """
    per_model = _FUNCTIONS.setdefault(model, {})
    key = (kind, task, bool(from_logits))
    if key not in per_model:
        ref = weakref.ref(model)
        if kind == "mc":
            def fn(xb, s):
                return monte_carlo_summaries(ref(), xb, s, task, from_logits)
        else:
            def fn(xb):
                return ref()(xb, training=False)
        per_model[key] = tf.function(fn, reduce_retracing=True)
    return per_model[key]


def mc_predict(model, x, num_samples=None, batch_size=256, task="classification", from_logits=None,
               weight_snapshots=None):
    """Monte Carlo prediction of ``model`` on ``x`` (see the module docstring for the formulas).

    Args:
      model: a Keras model. With ``weight_snapshots=None`` its stochastic ``tfdpbnn.layers`` are sampled
        (``mc_sampling()``, ``training=False``); ``num_samples`` defaults to 30. Keras ``Dropout`` layers
        are the identity at inference and add nothing (a ``UserWarning`` says so; use ``MCDropout``).
      x: inputs (array, tensor, or a nest of them with a common first axis), or a finite batched
        ``tf.data.Dataset`` of inputs or of (x, y[, sample_weight]) tuples (labels are ignored).
      num_samples: integer >= 1 (must be None or len(weight_snapshots) when snapshots are given).
      batch_size: examples per forward pass for arrays (a dataset keeps its own batches); memory is
        O(batch_size) for the passes plus the [n, C] results.
      task: "classification" or "regression" (outputs are ``HeteroscedasticHead`` [mean, log-variance]).
      from_logits: classification only: True if the model outputs logits (softmax is applied; sigmoid for
        one unit), False for probability vectors (checked; for one unit, a probability of label 1), None to
        read it from the output layer's activation (``tfdpbnn.uncertainty.outputs.resolve_from_logits``;
        softmax, linear or one-unit sigmoid, else ``ValueError``). A one-unit model's ``mean`` is [n, 2].
      weight_snapshots: optional list of weight lists as returned by ``model.get_weights()``; each is one
        posterior sample evaluated deterministically. The model's weights are restored afterwards. A
        dataset ``x`` is read once and its batches are kept in memory to evaluate every snapshot.
    Returns an ``MCPrediction`` (numpy float64 arrays).
    """
    check_task(task)
    batch_size = check_positive_int("batch_size", batch_size)
    from_logits = resolve_from_logits(model, from_logits) if task == "classification" else False
    if weight_snapshots is not None:
        if not isinstance(weight_snapshots, list | tuple) or not weight_snapshots:
            raise ValueError("weight_snapshots must be a non-empty list of weight lists "
                             "(as returned by model.get_weights())")
        if num_samples is not None and num_samples != len(weight_snapshots):
            raise ValueError(f"num_samples must be None or len(weight_snapshots) = {len(weight_snapshots)}, "
                             f"got {num_samples!r}")
        num_samples = len(weight_snapshots)
    elif num_samples is None:
        num_samples = 30
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")

    results = []
    if weight_snapshots is None:
        if num_samples > 1:
            _warn_if_not_stochastic(model)
        run = traced_function(model, "mc", task, from_logits)
        with mc_sampling():  # traced inside the context: the stochastic layers sample
            for xb in _batches(x, batch_size):
                results.append(run(xb, tf.constant(int(num_samples))))
    else:
        forward = traced_function(model, "forward", task, from_logits)
        batches = list(_batches(x, batch_size))
        original = model.get_weights()
        batch_sums = [None] * len(batches)
        try:
            for snapshot in weight_snapshots:
                try:
                    model.set_weights(snapshot)
                except ValueError as err:
                    raise ValueError(f"weight_snapshots: a snapshot does not fit the model: {err}") from err
                for b, xb in enumerate(batches):
                    stats = sample_statistics(forward(xb), task, from_logits)
                    batch_sums[b] = stats if batch_sums[b] is None else [
                        a + c for a, c in zip(batch_sums[b], stats, strict=True)]
        finally:
            model.set_weights(original)
        results = [summaries(s, num_samples, task) for s in batch_sums]
    if not results:
        raise ValueError("x must contain at least one example")
    merged = {k: np.concatenate([r[k].numpy() for r in results], axis=0) for k in results[0]}
    return MCPrediction(num_samples=int(num_samples), **merged)
