"""Find preprocessing layers whose state was computed from data, before the first DP step.

A layer counts as data-derived when it has an ``adapt`` method and either reports ``is_adapted`` (Keras 2;
on Keras 3, which has no such flag, ``_adapted`` reads the vocabulary and bin boundaries) or holds a
non-trainable variable that differs from the same layer freshly built from its config (e.g. state assigned
by hand, or restored from a file). ``Hashing`` and layers built with explicit constants (``Normalization(
mean=..., variance=...)``, ``StringLookup(vocabulary=...)``) are not adapted: their constants are the
user's, like any weight given to the model. A data-derived layer is accepted only with a DP adapt record
(``tfdpbnn.preprocessing.private_adapt_normalization``) or the user's assertion that the data were public
(``assert_public_preprocessing``); otherwise DP training is refused.

``declared_state`` (a layer's own non-trainable variables) is the state that ``assert_public_preprocessing``
accepts on a layer without ``adapt`` and that ``tfdpbnn.optimizers.state_checks`` compares with a fresh copy.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.record import attributes
from tfdpbnn.record.preprocessing import recognised, state_digest


def _layers(model, submodules=None):
    """``model`` and its layers, less the inner layers of a layer with ``adapt``.

    Those (``TextVectorization``'s lookup layer) hold that layer's state, which is judged with it.
    """
    layers = [model, *(_private_api.submodules(model) if submodules is None else submodules)]
    seen = {id(inner) for layer in layers if callable(getattr(layer, "adapt", None))
            for inner in _private_api.submodules(layer) if inner is not layer}
    out = []
    for layer in layers:
        if isinstance(layer, tf.keras.layers.Layer) and id(layer) not in seen:
            seen.add(id(layer))
            out.append(layer)
    return out


def own_weights(layer) -> list:
    """The variables ``layer`` holds itself, not through a sublayer."""
    weights = _private_api.weights(layer)
    if not weights:
        return []
    inner = {id(v) for sub in _private_api.sublayers(layer, recursive=False)
             for v in _private_api.weights(sub)}
    return [v for v in weights if id(v) not in inner]


def declared_state(layer) -> list:
    """The layer's OWN non-trainable variables (``add_weight(trainable=False)``), not its sublayers'.

    Weights of a frozen layer (``layer.trainable = False``) are trainable variables the user froze, not
    state the layer computes, and are not included; neither are the variables a tfdpbnn layer names in
    ``_tfdpbnn_managed_state`` (a noisy layer's noise std, which its DP optimizer sets).
    """
    managed = {id(getattr(layer, name, None)) for name in getattr(layer, "_tfdpbnn_managed_state", ())}
    created = _private_api.created_non_trainable(layer)
    if created is not None:   # Keras 3
        return [v for v in created if v.dtype != tf.resource and id(v) not in managed]
    if all(getattr(v, "trainable", True) for v in _private_api.weights(layer)):
        return []
    return [v for v in own_weights(layer) if _private_api.is_variable(v) and not v.trainable
            and v.dtype != tf.resource and id(v) not in managed]


def _state_variables(layer) -> list:
    """The layer's non-trainable ``tf.Variable``s (a lookup layer's vocabulary handle is not one)."""
    return [v for v in layer.non_trainable_variables
            if _private_api.is_variable(v) and v.dtype != tf.resource]


def _differs_from_fresh(layer) -> bool:
    """Whether a non-trainable variable of ``layer`` differs from a twin built from its config."""
    state = _state_variables(layer)
    if not state:
        return False
    try:
        twin = type(layer).from_config(layer.get_config())
        twin.build(layer.input_shape if hasattr(layer, "input_shape") else None)
        fresh = _state_variables(twin)
    except (AttributeError, TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"model: the preprocessing layer {layer.name!r} ({type(layer).__name__}) holds non-trainable "
            f"state that tfdpbnn cannot compare with its initial value ({err}); it may have been computed "
            "from the private data. Assert that it was not with tfdpbnn.preprocessing."
            "assert_public_preprocessing(layer, reason=...)") from err
    if len(fresh) != len(state):
        return True
    return any(a.shape != b.shape or not np.array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
               for a, b in zip(state, fresh, strict=True))


def _vocabulary(layer) -> list[str]:
    return [str(token) for token in layer.get_vocabulary()]


def _adapted(layer) -> bool:
    """Whether ``layer``'s own state says it was computed by ``adapt``.

    Keras 2 layers report it (``is_adapted``). Keras 3 layers have no such flag and keep a vocabulary or bin
    boundaries outside their variables: a layer with ``get_vocabulary`` (``StringLookup``, ``IntegerLookup``,
    ``TextVectorization``) counts as adapted when its vocabulary differs from that of a twin built from its
    config (which holds only a vocabulary given to the constructor); a ``Discretization`` when it holds bin
    boundaries beside ``num_bins`` (the constructor takes one or the other; ``adapt`` sets both).
    """
    flag = getattr(layer, "is_adapted", None)
    if flag is not None:
        return bool(flag)
    if getattr(layer, "num_bins", None) is not None and getattr(layer, "bin_boundaries", None) is not None:
        return True
    if callable(getattr(layer, "get_vocabulary", None)):
        try:
            twin = type(layer).from_config(layer.get_config())
            return _vocabulary(layer) != _vocabulary(twin)
        except (AttributeError, TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"model: the preprocessing layer {layer.name!r} ({type(layer).__name__}) holds a vocabulary "
                f"that tfdpbnn cannot compare with the one it was built with ({err}); it may have been "
                "computed from the private data. Assert that it was not with tfdpbnn.preprocessing."
                "assert_public_preprocessing(layer, reason=...)") from err
    return False


def data_derived_layers(model) -> list:
    """The layers of ``model`` with an ``adapt`` method whose state was computed from data (module)."""
    out = []
    for layer in _layers(model):
        if not callable(getattr(layer, "adapt", None)):
            continue
        if _adapted(layer) or _differs_from_fresh(layer):
            out.append(layer)
    return out


def _vouching(layer, digest: str, held=()):
    """What vouches for ``layer``'s state ``digest``: a ``PreprocessingRecord``, a public reason, or None.

    The layer's own DP record or public assertion made on this state, else a record of ``held`` (an
    optimizer's) made on it, which is then attached to the layer.
    """
    record = attributes.preprocessing_record(layer)
    if record is not None and record.state_digest == digest:
        return record
    reason = attributes.public_preprocessing(layer)
    if reason is not None and attributes.preprocessing_digest(layer) == digest:
        return reason
    record = recognised(digest, held, look_in_store=False)
    if record is not None:
        attributes.set_preprocessing_record(layer, record)
    return record


def _scan(model, neighboring, submodules, held, refuse: bool) -> dict:
    found: dict = {"dp": [], "asserted_public": []}
    for layer in _layers(model, submodules):
        if not callable(getattr(layer, "adapt", None)):
            continue
        digest = state_digest(layer)
        vouch = _vouching(layer, digest, held)
        if vouch is None:
            if not (_adapted(layer) or _differs_from_fresh(layer)):
                continue
            # The state by value: a DP release the privacy record store kept under its digest (the layer
            # of a loaded model, or of a clone given the weights).
            vouch = recognised(digest)
            if vouch is not None:
                attributes.set_preprocessing_record(layer, vouch)
            elif refuse:
                _refuse(layer)
            else:
                continue
        if isinstance(vouch, str):
            found["asserted_public"].append({"layer": layer.name, "type": type(layer).__name__,
                                             "reason": vouch, "state_digest": digest})
            continue
        if refuse and neighboring is not None and vouch.neighboring != neighboring:
            raise ValueError(
                f"neighboring: the preprocessing layer {layer.name!r} was adapted privately under "
                f"{vouch.neighboring!r} but the optimizer trains under {neighboring!r}; adapt it again "
                f"with neighboring={neighboring!r} so that the two can be composed")
        if refuse:
            _check_rows(model, layer, vouch)
        found["dp"].append(vouch)
    return found


def _call_values(inputs, leading: int = 1):
    """The most values one example feeds a layer in one symbolic call of ``inputs``; None without a shape.

    ``leading``: the axes before one example's values (1: the batch; 2: the batch and a ``TimeDistributed``
    call's time steps, for one step's values). ``math.inf`` for an axis of unknown length.
    """
    sizes = []
    for tensor in tf.nest.flatten(inputs):
        shape = getattr(tensor, "shape", None)
        if shape is None or len(shape) < leading:
            continue
        dims = list(shape)[leading:]
        sizes.append(math.inf if any(d is None for d in dims) else int(np.prod(dims, dtype=np.int64)))
    return max(sizes) if sizes else None


def _values_within(model, layer, largest, seen=None):
    """The values one example feeds ``layer`` over all its calls in ``model``'s graph, and their number.

    A call of a nested model with a graph counts that model's calls of ``layer`` (a model called twice, twice
    over); a ``TimeDistributed`` holding ``layer`` (or wrapping it) counts its steps (axis 1 of its input)
    times the wrapped layer's count per step, and an unknown number of steps as ``math.inf`` values; a call
    of another layer holding ``layer`` (a subclassed block, whose calls cannot be read) counts as one call
    of ``largest`` values (its largest symbolic call anywhere). ``(0, 0)`` for a model whose graph cannot
    be read.
    """
    seen = {} if seen is None else seen
    if id(model) in seen:
        return seen[id(model)]
    total, calls = 0, 0
    for called, inputs in _private_api.graph_calls(model) or ():
        if called is layer:
            values = _call_values(inputs)
            total, calls = total + (largest if values is None else values), calls + 1
        elif isinstance(called, tf.keras.layers.TimeDistributed) and (
                called.layer is layer or any(inner is layer for inner in _private_api.sublayers(called))):
            values, count = _per_step_values(called, inputs, layer, largest, seen)
            steps = _timesteps(inputs)
            total = total + (math.inf if steps is None else values * steps)
            calls = calls + (count if steps is None else count * steps)
        elif isinstance(called, tf.keras.layers.Layer) and any(
                inner is layer for inner in _private_api.sublayers(called)):
            if _private_api.graph_calls(called) is not None:
                values, count = _values_within(called, layer, largest, seen)
            else:
                values, count = largest, 1
            total, calls = total + values, calls + count
    seen[id(model)] = (total, calls)
    return total, calls


def _timesteps(inputs):
    """The length of axis 1 (the time steps) of a ``TimeDistributed`` call's input; None when unknown."""
    tensors = [t for t in tf.nest.flatten(inputs) if getattr(t, "shape", None) is not None]
    if not tensors or len(tensors[0].shape) < 2 or tensors[0].shape[1] is None:
        return None
    return int(tensors[0].shape[1])


def _wrapped_calls(model, layer, seen=None):
    """The per-step values of each call of a ``TimeDistributed(layer)`` in ``model``'s graph (nested too).

    The wrapper calls ``layer`` inside its own call: ``layer`` has no symbolic call of its own there.
    """
    seen = set() if seen is None else seen
    if id(model) in seen:
        return []
    seen.add(id(model))
    sizes = []
    for called, inputs in _private_api.graph_calls(model) or ():
        if isinstance(called, tf.keras.layers.TimeDistributed) and called.layer is layer:
            values = _call_values(inputs, leading=2)
            sizes.append(math.inf if values is None else values)
        elif isinstance(called, tf.keras.layers.Layer):
            nested = called.layer if isinstance(called, tf.keras.layers.TimeDistributed) else called
            if _private_api.graph_calls(nested) is not None:
                sizes.extend(_wrapped_calls(nested, layer, seen))
    return sizes


def _per_step_values(wrapper, inputs, layer, largest, seen):
    """The values one time step feeds ``layer`` through ``wrapper`` (a ``TimeDistributed``), and its calls.

    The wrapped layer is ``layer`` itself (one call of the step's input), a model with a graph (its calls
    of ``layer``), or another layer holding it (one call of ``largest`` values).
    """
    inner = wrapper.layer
    if inner is layer:
        values = _call_values(inputs, leading=2)
        return (largest if values is None else values), 1
    if _private_api.graph_calls(inner) is not None:
        return _values_within(inner, layer, largest, seen)
    return largest, 1


def _values_per_example(model, layer):
    """How many values one example of ``model`` feeds ``layer``, and over how many calls.

    Read from the symbolic calls of the layer (a functional model, a ``Sequential`` with an ``Input``; a
    ``TimeDistributed`` wrapping it, one call per time step): the sum over its calls within ``model``'s graph
    (nested models included: every call of the layer adds rows of the same release for the same example),
    and never less than its largest single call anywhere;
    ``math.inf`` for an axis of unknown length; None when the layer has no such call.
    """
    sizes = [size for inputs in _private_api.symbolic_call_inputs(layer)
             if (size := _call_values(inputs)) is not None] or _wrapped_calls(model, layer)
    if not sizes:
        return None, 0
    largest = max(sizes)
    total, calls = _values_within(model, layer, largest)
    return (total, calls) if total > largest else (largest, 1)


def _check_rows(model, layer, record) -> None:
    """Refuse a DP release whose rows were not the examples: one example feeding ``layer`` several rows.

    The release counted each row of its ``data`` as a record (``details["values_per_row"]`` values of the
    layer's input make one row); an example that feeds the layer more values than that, in one call (a
    sequence normalized over its last axis, adapted on ``x.reshape(-1, d)``) or over its calls in ``model``
    (one layer adapted on ``np.concatenate([x1, x2])`` and applied to both inputs), is in several rows, and
    the release's sensitivity is that many times the one it was calibrated for.
    """
    details = record.details or {}
    per_row = int(details.get("values_per_row", details.get("num_features", 1)))
    per_example, calls = _values_per_example(model, layer)
    if per_example is None:
        raise ValueError(
            f"model: the preprocessing layer {layer.name!r} ({type(layer).__name__}) holds a DP release "
            f"whose rows were {per_row} value(s) of the layer's input each, but tfdpbnn cannot tell how many "
            "values one training example feeds it: the layer is called where its per-example input cannot be "
            "read (inside the call of a subclassed model or layer, or in a Sequential without an Input). "
            "Call it directly in a functional model or a Sequential built with tf.keras.Input(shape) (e.g. "
            "normalize the inputs before the subclassed layer or model), so that the layer's per-example "
            "input shape is known")
    if per_example > per_row:
        shown = "an unknown number of" if per_example == math.inf else str(per_example)
        over = (f" over its {calls} calls in the model (each call's values are rows of the same release; "
                "e.g. one layer adapted on np.concatenate([x1, x2]) and applied to both inputs, or a layer "
                "inside TimeDistributed, called once per time step)" if calls > 1
                else f" (more than one row: e.g. a sequence adapted on x.reshape(-1, {per_row}))")
        raise ValueError(
            f"model: the preprocessing layer {layer.name!r} ({type(layer).__name__}) was adapted privately "
            f"on rows of {per_row} value(s), each counted as one record, but one training example feeds it "
            f"{shown} values{over}; one example moves the release by several rows' worth and its epsilon "
            f"does not hold (at most {per_row} value(s) per example are allowed). Adapt it with one row per "
            "record (e.g. each example's mean over its time steps, a layer over the whole example, or one "
            "layer per input) or on public data (assert_public_preprocessing)")


def _refuse(layer):
    vouched_before = (attributes.preprocessing_record(layer) is not None
                      or attributes.public_preprocessing(layer) is not None)
    changed = (" (it changed after its DP adapt or public assertion, e.g. adapt was called again)"
               if vouched_before else "")
    raise ValueError(
        f"model: the preprocessing layer {layer.name!r} ({type(layer).__name__}) holds state "
        f"computed from data{changed}, which the model would carry and release with its weights, and no "
        "epsilon covers it. If it was adapted on public data, say so with "
        "tfdpbnn.preprocessing.assert_public_preprocessing(layer, reason=...) after adapting it (the "
        "privacy statement lists it as asserted by the user); if it was adapted on the private data, "
        "adapt it with a DP mechanism instead (tfdpbnn.preprocessing.private_adapt_normalization(layer, "
        "data, epsilon=..., delta=..., bounds=(lo, hi)) for Normalization, private_discretization for "
        "Discretization), whose epsilon the statement composes with training.")


def check_preprocessing(model, neighboring: str | None = None, submodules=None, held=()) -> dict:
    """Refuse data-derived preprocessing that is neither DP nor asserted public; return what was found.

    Returns ``{"dp": [PreprocessingRecord, ...], "asserted_public": [{"layer", "type", "reason"}, ...]}``.
    A record or an assertion holds only for the state it was made on (``state_digest``). A DP record is
    found on the layer, among ``held`` (the records an optimizer carries, e.g. restored from its saved
    config), or in the privacy record store by the state's digest (a loaded or cloned layer holding a DP
    adapt's state); it is then attached to the layer. Raises ``ValueError`` naming the first layer adapted
    without either (or changed since), and for a DP record under another ``neighboring`` relation than the
    training's (the two could not be composed). ``submodules``: ``model``'s modules
    (``tfdpbnn._private_api.submodules``) when the caller has them.
    """
    return _scan(model, neighboring, submodules, held, refuse=True)


def preprocessing_releases(model, held=()) -> dict:
    """What ``check_preprocessing`` would find on ``model``, without refusing anything (for a statement)."""
    return _scan(model, None, None, held, refuse=False)


def unvouched_preprocessing(model, found=None) -> list[str]:
    """Names of ``model``'s preprocessing layers holding data-derived state that nothing vouches for.

    For a statement or an export: a layer whose state is neither the one its DP release or public assertion
    was made on (``state_digest``), nor that of a DP release or public assertion in ``found`` (an
    optimizer's ``preprocessing_found``) or of a DP release in the privacy record store: ``adapt``,
    ``assign`` or ``set_weights`` of its state after ``fit``. A layer whose state cannot be compared with
    its initial value is listed too. Nothing is refused or attached to a layer.
    """
    found = found or {}
    held = found.get("dp", ())
    public = {a.get("state_digest") for a in found.get("asserted_public", ()) if isinstance(a, dict)}
    names = []
    for layer in _layers(model):
        if not callable(getattr(layer, "adapt", None)):
            continue
        digest = state_digest(layer)
        record = attributes.preprocessing_record(layer)
        if (record is not None and record.state_digest == digest) or digest in public:
            continue
        if attributes.public_preprocessing(layer) is not None and \
                attributes.preprocessing_digest(layer) == digest:
            continue
        try:
            if not (_adapted(layer) or _differs_from_fresh(layer)):
                continue
        except ValueError:
            names.append(layer.name)
            continue
        if recognised(digest, held) is None:
            names.append(layer.name)
    return names


def assert_public_preprocessing(layer_or_model, reason: str):
    """The USER asserts that ``layer_or_model``'s adapted preprocessing layers saw only public data.

    A layer without ``adapt`` that holds its own non-trainable state (``add_weight(trainable=False)``, set
    from data before training; ``tfdpbnn.optimizers.state_checks``) can be asserted the same way.

    Given a model, every data-derived preprocessing layer in it is marked. ``reason`` (a non-empty string:
    which public data, e.g. "adapted on the public MNIST-5k split") is written to the privacy statement under
    ``asserted_by_user``. tfdpbnn cannot check the claim. Assert after adapting: the assertion holds for the
    state the layer has now (adapting again later voids it). Returns ``layer_or_model``.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"reason must be a non-empty string saying which public data, got {reason!r}")
    if not isinstance(layer_or_model, tf.keras.layers.Layer):
        raise ValueError("layer_or_model must be a Keras layer or model, got "
                         f"{type(layer_or_model).__name__}")
    if isinstance(layer_or_model, tf.keras.Model):
        targets = data_derived_layers(layer_or_model)
        if not targets:
            raise ValueError("layer_or_model: the model has no adapted preprocessing layer to assert about")
    else:
        if not callable(getattr(layer_or_model, "adapt", None)) and not declared_state(layer_or_model):
            raise ValueError(f"layer_or_model: {layer_or_model.name!r} ({type(layer_or_model).__name__}) is "
                             "neither a preprocessing layer (it has no adapt method) nor a layer holding its "
                             "own non-trainable state (add_weight(trainable=False))")
        targets = [layer_or_model]
    for layer in targets:
        attributes.set_public_preprocessing(layer, reason.strip(), state_digest(layer))
    return layer_or_model


__all__ = ["assert_public_preprocessing", "check_preprocessing", "data_derived_layers", "declared_state",
           "own_weights", "preprocessing_releases", "unvouched_preprocessing"]
