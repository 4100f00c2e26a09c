"""Whether a classifier outputs logits or probabilities: read from an argument or the model's last activation.

Entropies, mutual information and calibration errors are defined on probability vectors. Computing them on
logits gives NaN (log of a negative number) or numbers outside their range (an ECE above 1), without an
error. So every consumer here either knows what the outputs are or refuses:

* ``from_logits=True``: softmax is applied first.
* ``from_logits=False``: the outputs must be probability vectors; a graph assertion fails otherwise.
* ``from_logits=None`` (default of ``mc_predict`` and ``export_saved_model``): read from the model's output
  layer: a ``softmax`` activation (or a ``Softmax`` layer) means probabilities, a linear one means logits,
  a one-unit ``sigmoid`` means a Bernoulli probability; anything else raises ``ValueError`` asking for
  ``from_logits``.

Binary models: an output with one unit is a Bernoulli model of the positive class (label 1). Its logit z
(``from_logits=True``) becomes p = sigmoid(z), a probability p is checked to lie in [0, 1], and both are
returned as the two-class distribution [1 - p, p], so entropies, mutual information, ECE/MCE and reliability
diagrams are those of the Bernoulli distribution (a softmax over one logit would always be 1).
"""

from __future__ import annotations

import tensorflow as tf

#: non-negative entries and rows summing to 1 within this tolerance count as probability vectors.
SUM_TOLERANCE = 1e-3


def _activation_name(layer):
    if isinstance(layer, tf.keras.layers.Softmax):
        return "softmax"
    act = getattr(layer, "activation", None)
    if act is None:
        return None
    return getattr(act, "__name__", None)


def _pass_through_types():
    from tfdpbnn.layers.normalization import DropPublicBatch

    return (DropPublicBatch, tf.keras.layers.Flatten, tf.keras.layers.Reshape, tf.keras.layers.Dropout)


def output_layer(model):
    """The layer that produces ``model``'s single output; None if it cannot be determined.

    Row-selecting/reshaping layers (``DropPublicBatch``, ``Flatten``, ``Reshape``, Keras ``Dropout``) are
    skipped.
    """
    layers = list(getattr(model, "layers", None) or [])
    outputs = getattr(model, "outputs", None)
    if not layers or not outputs or len(outputs) != 1:  # subclassed models have no known output layer
        return None
    index = len(layers) - 1
    layer = layers[index]
    while isinstance(layer, _pass_through_types()) and index > 0:
        previous = [candidate for candidate in layers[:index] if _output_of(candidate) is _input_of(layer)]
        if len(previous) != 1:
            return None
        layer = previous[0]
        index = layers.index(layer)
    return layer


def _input_of(layer):
    try:
        return layer.input
    except (AttributeError, ValueError):
        return None


def _output_of(layer):
    try:
        return layer.output
    except (AttributeError, ValueError):
        return object()


def _output_width(model):
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1 or tf.TensorShape(outputs[0].shape).rank is None:
        return None
    return outputs[0].shape[-1]


def resolve_from_logits(model, from_logits):
    """Return True if ``model`` outputs logits, False if probabilities (see the module docstring).

    An explicit ``from_logits`` that contradicts the output layer's activation raises ``ValueError``; so does
    a one-unit softmax (always 1) and a sigmoid over several units (independent labels, not a distribution).
    """
    if from_logits is not None and not isinstance(from_logits, bool):
        raise ValueError(f"from_logits must be True, False or None (read from the model), got "
                         f"{from_logits!r}")
    name = _activation_name(output_layer(model)) if model is not None else None
    width = _output_width(model) if model is not None else None
    if name == "softmax" and width == 1:
        raise ValueError("model: a softmax over one output unit is always 1; for a binary model use a linear "
                         "output (logit, from_logits=True) or a sigmoid (probability of label 1)")
    if name == "sigmoid" and width not in (1, None):
        raise ValueError(f"model: a sigmoid over {width} output units models independent labels, not one "
                         "class distribution; use a softmax (or linear logits) for classification")
    inferred = {"softmax": False, "linear": True, "sigmoid": False if width == 1 else None}.get(name)
    if from_logits is None:
        if inferred is None:
            raise ValueError("from_logits: cannot tell whether the model outputs logits or probabilities "
                             f"(output layer activation: {name!r}); pass from_logits=True for logits or "
                             "from_logits=False for probability vectors")
        return inferred
    if inferred is not None and inferred != from_logits:
        kind = "logits (linear activation)" if inferred else f"probabilities ({name})"
        raise ValueError(f"from_logits={from_logits} contradicts the model's output layer, which outputs "
                         f"{kind}; pass from_logits={inferred} or None")
    return from_logits


def assert_probabilities(outputs, name="model outputs"):
    """Graph assertion that ``outputs`` [..., C] are probability vectors; returns ``outputs``.

    One unit (C = 1): a Bernoulli probability in [0, 1], returned as [1 - p, p] (module docstring).
    """
    outputs = tf.convert_to_tensor(outputs)
    tol = tf.cast(SUM_TOLERANCE, outputs.dtype)
    if outputs.shape[-1] == 1:
        message = f"{name}: expected a probability in [0, 1] (one-unit Bernoulli output); for a logit pass " \
                  "from_logits=True"
        checks = [tf.debugging.assert_greater_equal(outputs, -tol * 1e-3, message=message),
                  tf.debugging.assert_less_equal(outputs, 1 + tol * 1e-3, message=message)]
        with tf.control_dependencies(checks):
            p = tf.clip_by_value(outputs, 0.0, 1.0)  # only float rounding passes the checks above
            return tf.concat([1.0 - p, p], axis=-1)
    message = (f"{name}: expected probability vectors (entries >= 0, rows summing to 1 within "
               f"{SUM_TOLERANCE}); for logits pass from_logits=True")
    checks = [
        tf.debugging.assert_greater_equal(outputs, -tol * 1e-3, message=message),
        tf.debugging.assert_less_equal(tf.abs(tf.reduce_sum(outputs, axis=-1) - 1), tol, message=message),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(outputs)


def to_probabilities(outputs, from_logits, name="model outputs"):
    """Softmax of logits, or checked probability vectors (``assert_probabilities``).

    One unit: [1 - p, p] with p = sigmoid(logit) or the checked probability (module docstring).
    """
    outputs = tf.convert_to_tensor(outputs)
    if from_logits and outputs.shape[-1] == 1:
        return tf.concat([tf.math.sigmoid(-outputs), tf.math.sigmoid(outputs)], axis=-1)
    if from_logits:
        return tf.nn.softmax(outputs, axis=-1)
    return assert_probabilities(outputs, name)
