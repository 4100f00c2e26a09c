"""Models whose per-example check is known from their structure: one passed check holds for all of them.

``fit_checks.check_per_example`` runs a model eagerly on a synthetic batch (two forward passes, two
backward passes and the compiled loss four times) to prove that one example's loss depends on no other
example, so that per-example clipping bounds the sensitivity (Abadi et al. 2016). For most models its
outcome depends on their code, which only running them shows. For a model built only of layers that compute
each example from that example alone, whatever their configuration and weights (``_per_example_layers``:
Keras's dense, convolution, pooling, reshaping, dropout and activation layers, ``_KERAS_PER_EXAMPLE``, and
tfdpbnn's variational, Bayes-by-backprop and MC-dropout layers, each called once, on and to tensors with
an axis besides the batch's, with a built-in activation and no activity regularizer), compiled with one
Keras built-in loss, the outcome is a function of the structure alone: the model's and layers' classes
(with their ``call``) and the layers' configurations, the loss (its class, function and configuration) and
the dtypes and shapes of the inputs, labels and outputs (``structure_key``). A check passed for one such
model then holds for every model of the same key, and ``passed`` tells the next one so (a new model of the
same architecture is not run again). A model outside that set, or one that failed its
check, is always checked by running it.
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf

from tfdpbnn import _private_api

#: Keras layer classes (names in ``tf.keras.layers``) whose output for one example is computed from that
#: example's input alone, for every configuration and weights: no statistic over the batch axis, no state
#: written by ``call``, no variable but their own.
_KERAS_PER_EXAMPLE = (
    "InputLayer", "Dense", "Conv1D", "Conv2D", "Conv3D", "MaxPooling1D", "MaxPooling2D", "MaxPooling3D",
    "AveragePooling1D", "AveragePooling2D", "AveragePooling3D", "GlobalAveragePooling1D",
    "GlobalAveragePooling2D", "GlobalAveragePooling3D", "GlobalMaxPooling1D", "GlobalMaxPooling2D",
    "GlobalMaxPooling3D", "Flatten", "Reshape", "Dropout", "Activation", "ReLU",
)

#: The keys of models whose check passed in this process.
_PASSED: set = set()
#: A bound on ``_PASSED`` (distinct architectures in one process); past it, it starts again empty.
_MAX_KEPT = 4096


def _per_example_layers() -> frozenset:
    """The exact classes of ``_KERAS_PER_EXAMPLE`` in the Keras in use, and tfdpbnn's per-example layers."""
    from tfdpbnn.layers import Conv2DVariational, DenseBayesByBackprop, DenseVariational, MCDropout

    found = {getattr(tf.keras.layers, name, None) for name in _KERAS_PER_EXAMPLE}
    found.discard(None)
    return frozenset(found | {Conv2DVariational, DenseBayesByBackprop, DenseVariational, MCDropout})


def _model_classes() -> set:
    """Keras's ``Sequential`` and its functional model class (in the module beside ``Sequential``'s)."""
    package = tf.keras.Sequential.__module__.rsplit(".", 1)[0]
    functional = getattr(sys.modules.get(package + ".functional"), "Functional", None)
    return {tf.keras.Sequential} | ({functional} if isinstance(functional, type) else set())


def _built_in(module, function, defined_in_keras: bool = False) -> bool:
    """Whether ``function`` is the function Keras's ``module`` exports under its name.

    ``defined_in_keras``: or one the module it names (Keras's or tf-keras's) holds under its name (Keras 3's
    ``tf.keras.losses`` exports ``MeanSquaredError`` but not the ``mean_squared_error`` it calls). For
    losses only: the check differentiates a loss with respect to the predictions themselves, so its outcome
    on a loss does not depend on the weights; an activation's does (Keras's own functions include batch
    means), so activations must be the exported ones, each per example.
    """
    name = getattr(function, "__name__", "")
    if not callable(function) or not name:
        return False
    if getattr(module, name, None) is function:
        return True
    home = getattr(function, "__module__", None) or ""
    return defined_in_keras and home.startswith(("keras.", "tf_keras.")) and getattr(
        sys.modules.get(home), name, None) is function


def _layer_known(layer, known: frozenset) -> bool:
    """Whether ``layer`` is known: of a class in ``known``, with none of its own ``call``.

    And called once in the model, on and to tensors of rank 2 or more (an axis besides the batch's), with a
    built-in activation (where it has one) and no activity regularizer.
    """
    if type(layer) not in known or "call" in vars(layer):
        return False
    # An activation over the last axis (softmax) or a layer fed a tensor of the batch axis alone
    # (``Reshape(())``) would work across examples: every input and output keeps an axis besides the batch's.
    try:
        shapes = [tuple(t.shape) for t in tf.nest.flatten([layer.input, layer.output])]
    except (AttributeError, ValueError, RuntimeError, TypeError):  # not connected once (a shared layer)
        return False
    if not shapes or any(len(shape) < 2 for shape in shapes):
        return False
    activation = getattr(layer, "activation", None)
    if activation is not None and not _built_in(tf.keras.activations, activation):
        return False
    return getattr(layer, "activity_regularizer", None) is None


def _loss_key(loss) -> tuple | None:
    """What determines a built-in compiled loss (its class, function and configuration), or None."""
    if isinstance(loss, str):
        try:
            function = tf.keras.losses.get(loss)
        except (ValueError, TypeError):  # an unknown name: the check says so
            return None
        if isinstance(function, tf.keras.losses.Loss):  # a class name
            inner = _loss_key(function)
            return None if inner is None else ("name", loss, inner)
        return ("name", loss, function) if _built_in(tf.keras.losses, function, True) else None
    kind = type(loss)
    if not isinstance(loss, tf.keras.losses.Loss) or getattr(tf.keras.losses, kind.__name__,
                                                              None) is not kind:
        return None
    if "call" in vars(loss) or "fn" in vars(loss) and not _built_in(tf.keras.losses, loss.fn, True):
        return None
    try:
        config = json.dumps(loss.get_config(), sort_keys=True)
    except (TypeError, ValueError):
        return None
    # The functions themselves (not their ids, which a new function may reuse once one is collected).
    return ("object", kind, kind.call, getattr(loss, "fn", None), config)


def _spec_key(structure) -> tuple | None:
    """The nesting, dtypes and shapes (the batch axis dropped) of dense arrays, tensors or ``tf.TensorSpec``s.

    None for a ragged or sparse leaf, or one of unknown rank.
    """
    if structure is None:
        return ()
    leaves = []
    for leaf in tf.nest.flatten(structure):
        if isinstance(leaf, tf.RaggedTensor | tf.RaggedTensorSpec | tf.SparseTensor | tf.SparseTensorSpec):
            return None
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        try:
            dims = tuple(shape) if shape is not None else None
            name = tf.as_dtype(dtype).name if dtype is not None else None
        except (ValueError, TypeError):  # an unknown rank, a dtype TensorFlow has not: the check says so
            return None
        if dims is None or name is None or len(dims) == 0:
            return None
        leaves.append((name, dims[1:]))
    # The nesting (a dict's keys, a list or a tuple), whatever the leaves are: arrays, tensors or specs.
    nesting = repr(tf.nest.map_structure(lambda _: None, structure)) if tf.nest.is_nested(structure) else ""
    return (nesting, tuple(leaves))


def structure_key(model, x_like, y_like, submodules) -> tuple | None:
    """The key that determines ``model``'s per-example check, or None if its outcome needs a run.

    ``x_like``, ``y_like``: arrays or specs of the batches' inputs and labels
    (``fit_checks.element_parts``); ``submodules``: ``_private_api.submodules(model)``. A model is known
    from its structure when it is an exact Keras ``Sequential`` or functional model, built, every layer
    known (see the module), with one built-in loss.
    """
    kind = type(model)
    if kind not in _model_classes():
        return None
    if not model.built or not model.variables or "call" in vars(model):
        return None
    known = _per_example_layers()
    # Metrics (Keras 2 layers, and modules of a compiled model) take no part in the forward pass.
    layers = [m for m in submodules if isinstance(m, tf.keras.layers.Layer)
              and not isinstance(m, tf.keras.metrics.Metric)]
    if not layers or not all(_layer_known(layer, known) for layer in layers):
        return None
    compiled = _private_api.compiled_user_loss(model)  # what the check's per-example loss calls
    if compiled is None or compiled is not getattr(model, "loss", None):
        return None
    loss = _loss_key(compiled)
    inputs, labels = _spec_key(x_like), _spec_key(y_like)
    outputs = _spec_key(model.outputs) if getattr(model, "outputs", None) else None
    if loss is None or inputs is None or labels is None or outputs is None or len(model.outputs) != 1:
        return None
    # The classes with their call functions (a class whose call was replaced is another structure) and the
    # layers' configurations (an attribute set after the model was built, as a Reshape's target shape).
    configs = []
    for layer in layers:
        try:
            config = {k: v for k, v in layer.get_config().items() if k != "name"}
            configs.append(json.dumps(config, sort_keys=True, default=repr))
        except (NotImplementedError, TypeError, ValueError):
            return None
    return (kind, kind.call, tuple((type(layer), type(layer).call) for layer in layers), tuple(configs), loss,
            inputs, labels, outputs)


def passed(key) -> bool:
    """Whether a model of ``key`` (``structure_key``; None: not known) passed its check in this process."""
    return key is not None and key in _PASSED


def note_passed(key) -> None:
    """Keep ``key`` as passed (after ``check_per_example`` passed, reading no variable but the model's)."""
    if key is None:
        return
    if len(_PASSED) >= _MAX_KEPT:
        _PASSED.clear()
    _PASSED.add(key)
