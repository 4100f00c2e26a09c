"""Checks that no model state carries private data past the DP step.

DP-SGD (Abadi et al. 2016) bounds what the released weight updates say about one example; a variable the
model sets from the data in any other way is released with the weights and covered by no epsilon. Two such
ways are refused before the first DP step:

- ``check_declared_state``: a layer's own non-trainable variables (``add_weight(trainable=False)``, as a
  running mean set in ``build`` or an ``adapt``-like method) that differ from the same layer freshly built
  from its config. Preprocessing layers with ``adapt`` are checked by ``tfdpbnn.preprocessing``; tfdpbnn's
  own layers hold only state the library sets (public batches, priors, weight-noise scales).
- ``VariableSnapshot`` around the synthetic forward pass of ``fit_checks.check_per_example``: any model
  variable that a forward pass in training mode changes (``self.count.assign_add(...)`` or a running mean
  in ``call()``) would change at every DP step outside the mechanism. Keras's random-number state and
  metric variables are not model variables, so dropout, noise layers and ``add_metric`` are unaffected
  (metrics are handled by ``release_training_metrics``).

A layer whose state was computed from public data is accepted after
``tfdpbnn.preprocessing.assert_public_preprocessing(layer, reason=...)`` (listed under ``asserted_by_user``).
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.preprocessing.record import DIGEST_ATTRIBUTE, PUBLIC_ATTRIBUTE, state_digest


def _layers(model):
    seen, out = set(), []
    for layer in [model, *_private_api.sublayers(model)]:
        if not isinstance(layer, tf.keras.metrics.Metric) and id(layer) not in seen:
            seen.add(id(layer))
            out.append(layer)
    return out


def _library_layer(layer) -> bool:
    return type(layer).__module__.startswith("tfdpbnn.")


def _own_weights(layer) -> list:
    """The variables ``layer`` holds itself, not through a sublayer."""
    weights = layer.weights
    if not weights:
        return []
    inner = {id(v) for sub in _private_api.sublayers(layer, recursive=False) for v in sub.weights}
    return [v for v in weights if id(v) not in inner]


def declared_state(layer) -> list:
    """The layer's OWN non-trainable variables (``add_weight(trainable=False)``), not its sublayers'.

    Weights of a frozen layer (``layer.trainable = False``) are trainable variables the user froze, not
    state the layer computes, and are not included.
    """
    created = _private_api.created_non_trainable(layer)
    if created is not None:   # Keras 3
        return [v for v in created if v.dtype != tf.resource]
    if all(getattr(v, "trainable", True) for v in layer.weights):
        return []
    return [v for v in _own_weights(layer) if _private_api.is_variable(v) and not v.trainable
            and v.dtype != tf.resource]


def _values(variables) -> list:
    return [np.array(v.numpy(), copy=True) for v in variables]


def _equal(a, b) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


#: layer -> the state values last found equal to a fresh copy's (checked again only when they change).
_VERIFIED = weakref.WeakKeyDictionary()
#: layer -> (its config, two fresh copies' state): a layer is rebuilt only when its config changes.
_FRESH = weakref.WeakKeyDictionary()


def _fresh_states(layer) -> tuple:
    """The declared state of two copies of ``layer`` built fresh from its config (cached per config)."""
    config = repr(layer.get_config())
    cached = _FRESH.get(layer)
    if cached is not None and cached[0] == config:
        return cached[1]

    def fresh():
        twin = type(layer).from_config(layer.get_config())
        twin.build(_private_api.build_input_shape(layer))
        return _values(declared_state(twin))

    states = (fresh(), fresh())
    _FRESH[layer] = (config, states)
    return states


def _vouched(layer) -> bool:
    return getattr(layer, PUBLIC_ATTRIBUTE, None) is not None and \
        getattr(layer, DIGEST_ATTRIBUTE, None) == state_digest(layer)


def check_declared_state(model) -> list:
    """Refuse layers whose own non-trainable state differs from a fresh copy; return the asserted ones.

    Compares ``declared_state(layer)`` of every layer of ``model`` (not tfdpbnn's layers, not preprocessing
    layers with ``adapt``, which ``tfdpbnn.preprocessing.check_preprocessing`` covers) with the same layer
    built from ``get_config()``. Raises ``ValueError`` naming the layer and the variable when they differ,
    when the fresh copy's initial value is random (two fresh copies differ, so nothing can be compared) or
    when no fresh copy can be built; a layer asserted public (``assert_public_preprocessing``) on its current
    state is accepted and returned as ``{"layer", "type", "reason"}``.
    """
    asserted = []
    for layer in _layers(model):
        if _library_layer(layer) or callable(getattr(layer, "adapt", None)):
            continue
        state = declared_state(layer)
        if not state:
            continue
        if _vouched(layer):
            asserted.append({"layer": layer.name, "type": type(layer).__name__,
                             "reason": getattr(layer, PUBLIC_ATTRIBUTE)})
            continue
        current = _values(state)
        verified = _VERIFIED.get(layer)
        if verified is not None and len(verified) == len(current) and all(
                _equal(a, b) for a, b in zip(current, verified, strict=True)):
            continue  # the same values as the last check found equal to a fresh copy's
        how = ("Assert that it was computed from public data only with tfdpbnn.preprocessing."
               "assert_public_preprocessing(layer, reason=...) (listed under asserted_by_user), or make it a "
               "constant argument of the layer (in its get_config).")
        try:
            fresh, again = _fresh_states(layer)
        except (AttributeError, TypeError, ValueError, RuntimeError, NotImplementedError) as err:
            raise ValueError(
                f"model: layer {layer.name!r} ({type(layer).__name__}) holds non-trainable state "
                f"{[v.name for v in state]} that tfdpbnn cannot compare with its initial value (no fresh "
                f"copy from get_config: {err}); it may have been computed from the private data, which no "
                f"epsilon covers. {how}") from err
        if len(fresh) != len(current):
            raise ValueError(
                f"model: layer {layer.name!r} ({type(layer).__name__}) holds {len(current)} non-trainable "
                f"variables but a fresh copy from its config holds {len(fresh)}; its state may have been "
                f"computed from the private data, which no epsilon covers. {how}")
        for variable, now, new, new_again in zip(state, current, fresh, again, strict=True):
            if not _equal(new, new_again):
                raise ValueError(
                    f"model: variable {variable.name!r} of layer {layer.name!r} ({type(layer).__name__}) is "
                    "non-trainable state with a random initial value, so tfdpbnn cannot check that it was "
                    f"not computed from the private data. {how}")
            if not _equal(now, new):
                raise ValueError(
                    f"model: variable {variable.name!r} of layer {layer.name!r} ({type(layer).__name__}) is "
                    "non-trainable state that differs from the layer's initial value: it was set outside the "
                    "DP step (e.g. from the data's mean in build or an adapt-like method), so the model "
                    f"would release it with its weights and no epsilon covers it. {how}")
        _VERIFIED[layer] = current
    return asserted


def _owners(model) -> dict:
    """``id(variable) -> layer`` for the layer that holds each variable itself."""
    return {id(v): layer for layer in _layers(model) for v in _own_weights(layer)}


class VariableSnapshot:
    """The values of every variable of ``model``, to find (and undo) changes made by running it."""

    def __init__(self, model, outside_dp_update: bool = False):
        self._model = model
        skip = set()
        if outside_dp_update:  # the DP step updates these; tfdpbnn's layers' own state is the library's
            skip = {id(v) for v in model.trainable_variables}
            skip |= {id(v) for layer in _layers(model) if _library_layer(layer) for v in layer.weights}
        # weights, not variables: Keras 3's variables also hold the random-number state (SeedGenerator)
        self._variables = [v for v in model.weights
                           if _private_api.is_variable(v) and v.dtype != tf.resource and id(v) not in skip]
        self._values = _values(self._variables)

    def changed(self) -> list:
        """The variables whose value differs from the snapshot."""
        return [v for v, old in zip(self._variables, self._values, strict=True)
                if not _equal(np.asarray(v.numpy()), old)]

    def restore(self, changed=None) -> None:
        """Set the changed variables (``changed``, default all that changed) back to their snapshot values."""
        old = {id(v): value for v, value in zip(self._variables, self._values, strict=True)}
        for v in self.changed() if changed is None else changed:
            v.assign(old[id(v)])

    def refuse_changes(self, during: str) -> None:
        """Restore the snapshot; raise ``ValueError`` naming the variables ``during`` changed, if any."""
        changed = self.changed()
        self.restore(changed)
        if not changed:
            return
        owners = _owners(self._model)
        names = [f"{v.name!r} of layer {owners[id(v)].name!r} ({type(owners[id(v)]).__name__})"
                 if id(v) in owners else repr(v.name) for v in changed]
        raise ValueError(
            f"model: {during} changed the variable(s) {', '.join(names[:3])}"
            f"{' and more' if len(names) > 3 else ''} (e.g. assign/assign_add in a layer's call(): a counter "
            "or a running mean). Such a variable would be updated from every private batch outside the DP "
            "step (no clipping, no noise) and released with the weights, so no epsilon would cover it. "
            "Compute the statistic with a DP mechanism outside training, or drop the update while training "
            "with a DP optimizer.")


class StateWatch(tf.keras.callbacks.Callback):
    """Refuses a DP ``fit`` whose first step changed a model variable outside the DP update.

    The variables the step may change are the model's trainable variables (the DP update) and tfdpbnn's
    layers' own state (SI-DPSGD's weight-noise scale); any other (a frozen layer's weights, a layer's
    non-trainable state, a variable a ``train_step`` override updates after its DP call) is compared with
    its value before the first batch after that batch, set back, and named in a ``ValueError``.
    """

    def __init__(self):
        super().__init__()
        self._snapshot = None
        self._done = False

    def on_train_begin(self, logs=None):
        """Start watching (the snapshot is taken at the first batch, after every callback's restore)."""
        self._snapshot, self._done = None, False

    def on_train_batch_begin(self, batch, logs=None):
        """Before the first batch: the snapshot of the variables the DP step must not change."""
        if not self._done and self._snapshot is None:
            self._snapshot = VariableSnapshot(self.model, outside_dp_update=True)

    def on_train_batch_end(self, batch, logs=None):
        """After the first batch: restore and refuse what changed."""
        snapshot, self._snapshot = self._snapshot, None
        self._done = True
        if snapshot is not None:
            snapshot.refuse_changes("the first DP step of fit (outside the DP update of the trainable "
                                    "variables)")


__all__ = ["StateWatch", "VariableSnapshot", "check_declared_state", "declared_state"]
