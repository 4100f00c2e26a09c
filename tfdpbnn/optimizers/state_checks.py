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

- during the whole run, ``StateWatch`` (non-trainable state, at every epoch's end and at the end) and
  ``WriteWatch`` (trainable variables written between DP steps, checked inside the next step).

A layer whose state was computed from public data is accepted after
``tfdpbnn.preprocessing.assert_public_preprocessing(layer, reason=...)`` (listed under ``asserted_by_user``).
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.record import attributes
from tfdpbnn.record.preprocessing import state_digest


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
    return attributes.public_preprocessing(layer) is not None and \
        attributes.preprocessing_digest(layer) == state_digest(layer)


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
                             "reason": attributes.public_preprocessing(layer)})
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


def _sums_of_squares(variables) -> tf.Tensor:
    """[sum v^2 of each variable] (float32): what the DP step wrote, to compare with later."""
    return tf.stack([tf.reduce_sum(tf.square(tf.cast(tf.convert_to_tensor(v), tf.float32)))
                     for v in variables])


def _differs(now, stored) -> tf.Tensor:
    """Which sums of squares differ beyond the rounding of a reduction's order (relative 1e-6)."""
    return tf.abs(now - stored) > 1e-6 * tf.abs(stored) + 1e-30


def _on_read(value, name):
    return tf.Variable(value, trainable=False, name=name, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class WriteWatch:
    """What the DP step wrote to the trainable variables, to find writes made outside it during a run.

    The step knows what it wrote: after every ``apply_gradients`` of a DP optimizer, ``after_write`` keeps the
    sum of squares of every variable it updated (float32, one vector for the run); before the next one,
    ``before_write`` compares them with the variables' values, inside the traced step, and refuses the step
    (``InvalidArgumentError`` naming the variables) when any was changed in between: by a callback that
    writes a weight between batches, a custom loop's ``assign``, anything but the DP update. A write that
    also set the optimizer's step counter back (a checkpoint of the model and its optimizer restored: earlier
    weights of a recorded run, whose rewound steps the privacy record counts again) is accepted. The
    variables live in this plain (not trackable) object, as the noise key's, so no checkpoint holds them.
    Each run (``new_run``: every ``fit``, ``train_on_batch``, ``begin_training``) starts unarmed: weights set
    before its first step (``load_weights``, a ``BackupAndRestore`` restore) are the per-record ledger's
    business. A variable found written stays in ``written`` for the optimizer's life: its statement then
    gives no guarantee. A sum of squares does not identify a tensor: a write that keeps it (a permutation
    or sign flips of a weight's values) is not seen.
    """

    def __init__(self):
        self._variables, self._index = [], {}
        self._tainted = []
        self._compiled_check = None  # changed_since_write's comparison, traced once per set of variables
        with tf.init_scope():
            self._armed = _on_read(False, "dp_write_watch_armed")
            self._step = _on_read(tf.constant(-1, tf.int64), "dp_write_watch_step")
            self._stored = self._flags = None

    def new_run(self, variables) -> None:
        """Start a run over ``variables`` (the model's trainable variables): unarmed until the first write."""
        self._tainted.extend(n for n in self.written() if n not in self._tainted)
        variables = list(variables)
        with tf.init_scope():
            if self._stored is None or [id(v) for v in variables] != [id(v) for v in self._variables] or any(
                    a is not b for a, b in zip(variables, self._variables, strict=True)):
                self._variables = variables
                self._index = {id(v): i for i, v in enumerate(variables)}
                self._stored = _on_read(tf.zeros([len(variables)], tf.float32), "dp_write_watch")
                self._flags = _on_read(tf.zeros([len(variables)], tf.float32), "dp_write_watch_flags")
                self._compiled_check = None
            else:  # numpy zeros, no value read back: one op each (new_run runs at every fit)
                zeros = np.zeros([len(variables)], np.float32)
                self._stored.assign(zeros, read_value=False)
                if np.any(_private_api.read_numpy(self._flags)):
                    self._flags.assign(zeros, read_value=False)
            self._armed.assign(False, read_value=False)

    def disarm(self) -> None:
        """Skip the check at the next step (a tool that sets the weights on purpose: the privacy audits)."""
        with tf.init_scope():
            self._armed.assign(False)

    def _held(self, variables) -> list:
        return [(v, self._index[id(v)]) for v in variables
                if id(v) in self._index and self._variables[self._index[id(v)]] is v]

    def before_write(self, variables, iterations) -> list:
        """Inside the step, before the update: refuse it if a variable changed since the last DP write.

        ``iterations``: the optimizer's step counter (a restore that set it back is accepted, see above).
        """
        held = self._held(variables)
        if not held:
            return []
        index = tf.constant([[i] for _, i in held], tf.int32)
        old = tf.gather_nd(tf.convert_to_tensor(self._stored), index)
        same_step = tf.equal(tf.cast(tf.convert_to_tensor(iterations), tf.int64), self._step)
        written = tf.logical_and(tf.logical_and(tf.convert_to_tensor(self._armed), same_step),
                                 _differs(_sums_of_squares([v for v, _ in held]), old))
        flags = tf.convert_to_tensor(self._flags)
        mark = self._flags.assign(tf.tensor_scatter_nd_max(flags, index, tf.cast(written, tf.float32)))
        names = tf.constant([v.name for v, _ in held])
        with tf.control_dependencies([mark]):
            return [tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(written)),
                ["these variables were changed outside the DP step during DP training (after the last DP "
                 "update, before this one: a callback or code between steps wrote them). No epsilon covers "
                 "what they carry; the step is refused. Change weights only through the DP optimizer while "
                 "training, or between runs:", tf.boolean_mask(names, written)], summarize=3)]

    def after_write(self, variables, iterations) -> None:
        """Inside the step, after the update: keep the sums of squares the DP step wrote; arm the check."""
        held = self._held(variables)
        if not held:
            return
        index = tf.constant([[i] for _, i in held], tf.int32)
        self._stored.assign(tf.tensor_scatter_nd_update(tf.convert_to_tensor(self._stored), index,
                                                        _sums_of_squares([v for v, _ in held])))
        self._step.assign(tf.cast(tf.convert_to_tensor(iterations), tf.int64))
        self._armed.assign(True)

    def last_written_state(self) -> tuple:
        """The sums of squares the last DP write left (eager): a key for the model state it produced."""
        return () if self._stored is None else tuple(_private_api.read_numpy(self._stored).tolist())

    def changed_since_write(self, iterations) -> list:
        """Eager: the watched variables whose values differ from the last DP write's (armed, same step)."""
        step = _private_api.read_numpy(iterations) if _private_api.is_variable(iterations) \
            else tf.convert_to_tensor(iterations).numpy()
        if self._stored is None or not bool(_private_api.read_numpy(self._armed)) or \
                int(step) != int(_private_api.read_numpy(self._step)):
            return []
        if self._compiled_check is None:
            # The same sums and comparison as the DP step's (one traced call instead of a few eager ops per
            # variable); the variables and the stored sums are captured, so it is traced once per set.
            variables, stored = self._variables, self._stored
            self._compiled_check = tf.function(
                lambda: _differs(_sums_of_squares(variables), tf.convert_to_tensor(stored)), autograph=False)
        written = self._compiled_check().numpy()
        return [v.name for v, w in zip(self._variables, written, strict=True) if w]

    def state(self) -> tuple:
        """The sums of squares of the watched variables now (eager): a key for the model state."""
        return () if not self._variables else tuple(_sums_of_squares(self._variables).numpy().tolist())

    def written(self) -> list:
        """Names of the variables found written outside the DP step (this run's and earlier runs')."""
        flags = [] if self._flags is None else _private_api.read_numpy(self._flags)
        now = [v.name for v, f in zip(self._variables, flags, strict=True) if f > 0] if len(flags) else []
        return list(self._tainted) + [n for n in now if n not in self._tainted]

    def taint(self, names) -> None:
        """Record ``names`` as written outside the DP step (a check outside the traced step found them)."""
        self._tainted.extend(n for n in names if n not in self._tainted)


class StateWatch(tf.keras.callbacks.Callback):
    """Refuses a DP ``fit`` in which a model variable changed outside the DP update, at any time of the run.

    The variables the step may change are the model's trainable variables (the DP update) and tfdpbnn's
    layers' own state (SI-DPSGD's weight-noise scale); any other (a frozen layer's weights, a layer's
    non-trainable state, a variable a ``train_step`` override or a callback updates) is compared with its
    value before the first batch after that batch, at every epoch's end and at the end of ``fit``, set back,
    and named in a ``ValueError``. Writes to the trainable variables between steps are refused by the next
    step (``WriteWatch``); after the last step, at the end of ``fit``, unless the weights are those of an
    epoch's end (``EarlyStopping(restore_best_weights=True)``: post-processing). A callback's
    ``on_train_end`` runs after this check: what it writes is code outside the run.
    """

    def __init__(self):
        super().__init__()
        self._snapshot = None
        self._done = False
        self._outside = None
        self._states = set()

    def on_train_begin(self, logs=None):
        """Start watching (the snapshot is taken at the first batch, after every callback's restore)."""
        self._snapshot, self._done, self._outside, self._states = None, False, None, set()

    def on_train_batch_begin(self, batch, logs=None):
        """Before the first batch: the snapshot of the variables the DP step must not change."""
        if not self._done and self._snapshot is None:
            self._snapshot = VariableSnapshot(self.model, outside_dp_update=True)

    def on_train_batch_end(self, batch, logs=None):
        """After the first batch: restore and refuse what changed; keep the snapshot for the run's checks."""
        snapshot, self._snapshot = self._snapshot, None
        self._done = True
        if snapshot is not None:
            snapshot.refuse_changes("the first DP step of fit (outside the DP update of the trainable "
                                    "variables)")
            self._outside = snapshot

    def _watch(self):
        return getattr(self.model.optimizer, "_dp_write_watch", None)

    def _refuse_outside(self, when: str) -> None:
        """Refuse a change of the variables outside the DP update since the first batch (named, restored)."""
        if self._outside is None:
            return
        changed = self._outside.changed()
        watch = self._watch()
        if changed and watch is not None:
            watch.taint([v.name for v in changed])
        self._outside.refuse_changes(f"a callback or code run during DP fit ({when}; outside the DP update "
                                     "of the trainable variables)")

    def on_epoch_end(self, epoch, logs=None):
        """Refuse non-trainable state changed during the epoch; remember the epoch's trainable state."""
        self._refuse_outside(f"found at the end of epoch {epoch}")
        watch = self._watch()
        if watch is not None and self._done:  # the state the epoch's last DP step wrote (read, not computed)
            self._states.add(watch.last_written_state())

    def on_train_end(self, logs=None):
        """Refuse state changed after the last DP step, unless set back to an epoch's end (as EarlyStopping).

        Weights set to those at an earlier epoch's end are post-processing of what the DP steps released.
        """
        self._refuse_outside("found at the end of fit")
        watch = self._watch()
        if watch is None or not self._done:
            return
        changed = watch.changed_since_write(self.model.optimizer.iterations)
        if changed and watch.state() not in self._states:
            watch.taint(changed)
            raise ValueError(
                f"model: variable(s) {changed[:3]} changed after the last DP step of fit (a callback wrote "
                "them, e.g. in on_epoch_end), to values that are neither that step's nor an epoch end's. No "
                "epsilon covers what they carry, and the optimizer's privacy statement now says "
                "guarantee: false. Change weights only through the DP optimizer while training.")


__all__ = ["StateWatch", "VariableSnapshot", "WriteWatch", "check_declared_state", "declared_state"]
