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

- during the whole run, ``StateWatch`` (non-trainable state, kept after every callback's ``on_train_begin``
  and compared before every batch, at every epoch's end and after every callback's ``on_train_end``) and
  ``WriteWatch`` (every bit of the trainable variables, written between DP
  steps, checked inside the next step; in custom loops and between ``train_on_batch`` calls the
  non-trainable state too).

A layer whose state was computed from public data is accepted after
``tfdpbnn.preprocessing.assert_public_preprocessing(layer, reason=...)`` (listed under ``asserted_by_user``).
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.preprocessing.checks import declared_state, own_weights
from tfdpbnn.record import attributes
from tfdpbnn.record.preprocessing import state_digest
from tfdpbnn.record.store import same_bytes, variables_identity


def _layers(model):
    seen, out = set(), []
    for layer in [model, *_private_api.sublayers(model)]:
        if not isinstance(layer, tf.keras.metrics.Metric) and id(layer) not in seen:
            seen.add(id(layer))
            out.append(layer)
    return out


def _managed_state(layer) -> list:
    """The variables a tfdpbnn layer names in ``_tfdpbnn_managed_state``: its DP optimizer sets them."""
    return [v for v in (getattr(layer, name, None) for name in getattr(layer, "_tfdpbnn_managed_state", ()))
            if v is not None]


def _address(view) -> int | None:
    """The address of the buffer a read's numpy view shows (None for an empty or non-numeric array)."""
    if not isinstance(view, np.ndarray) or not view.size or view.dtype.kind not in "biufc":
        return None
    return view.__array_interface__["data"][0]


def _values(variables) -> list:
    """A copy of each variable's value (one read, one copy: ``_private_api.read_tensors_and_views``)."""
    return [np.array(view, copy=True) for _, view in _private_api.read_tensors_and_views(variables)]


def same_value(a, b) -> bool:
    """Numbers: every bit the same (``same_bytes``, -0.0 is not 0.0); anything else: ``_equal``."""
    if a.dtype.kind in "biufc" and b.dtype.kind in "biufc" and a.flags.c_contiguous and b.flags.c_contiguous:
        return same_bytes(a, b)
    return _equal(a, b)


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


def check_declared_state(model, public=()) -> list:
    """Refuse layers whose own non-trainable state differs from a fresh copy; return the asserted ones.

    Compares ``declared_state(layer)`` of every layer of ``model`` (tfdpbnn's too: a Bayes-by-Backprop
    prior; not preprocessing layers with ``adapt``, which ``tfdpbnn.preprocessing.check_preprocessing``
    covers) with the same layer
    built from ``get_config()``. Raises ``ValueError`` naming the layer and the variable when they differ,
    when the fresh copy's initial value is random (two fresh copies differ, so nothing can be compared) or
    when no fresh copy can be built (``public``: ids of variables asserted public, not compared); a layer
    asserted public (``assert_public_preprocessing``) on its current
    state is accepted and returned as ``{"layer", "type", "reason"}``.
    """
    asserted = []
    for layer in _layers(model):
        if callable(getattr(layer, "adapt", None)):
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
            if is_public(variable, public):  # asserted public: checked with each of its values instead
                continue
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
    return {id(v): layer for layer in _layers(model) for v in own_weights(layer)}


class VariableSnapshot:
    """The values of every variable of ``model``, to find (and undo) changes made by running it.

    ``outside_dp_update``: only those no DP step may change (``variables_outside_dp_update``, without the
    ids ``public``); ``variables``: these instead (the model's metric objects' around a check's pass).
    """

    def __init__(self, model, outside_dp_update: bool = False, variables=None, public=(), optimizer=None):
        self._model = model
        if variables is not None:
            self._variables = list(variables)
        elif outside_dp_update:  # the DP step updates the others; tfdpbnn layers' own state is the library's
            self._variables = variables_outside_dp_update(model, public, optimizer)
        else:  # weights, not variables: Keras 3's variables also hold the random-number state (SeedGenerator)
            self._variables = [v for v in _private_api.weights(model)
                               if _private_api.is_variable(v) and v.dtype != tf.resource]
        reads = [_private_api.read_tensor_and_view(v) for v in self._variables]
        # One read of each variable held, with its buffer's address: TensorFlow writes no buffer a read
        # still holds (an assignment, an in-place update, an optimizer's or XLA step's, each takes a buffer
        # of its own while another reference exists), so a fresh read in the held buffer has its bytes, and
        # the held read is the snapshot's value (no copy; a read that is a copy already, of a distributed
        # or device variable, is one too).
        self._reads = [tensor for tensor, _ in reads]  # kept for the snapshot's life: its values' buffers
        self._values = [view if _address(view) is not None else np.array(view, copy=True)
                        for _, view in reads]
        self._held = [(tensor, _address(view)) for tensor, view in reads]

    def changed(self) -> list:
        """The variables whose value differs from the snapshot: any bit of a number (``same_bytes``).

        A variable read in the buffer held since the snapshot (or since the last comparison found it equal)
        is unchanged without reading its bytes: a frozen body's weights cost one read each, not a pass over
        them. Any other (a new buffer, a distributed or device variable, whose reads are copies) is compared
        byte by byte.
        """
        found = []
        for i, (v, old) in enumerate(zip(self._variables, self._values, strict=True)):
            tensor, view = _private_api.read_tensor_and_view(v)
            address = _address(view)
            if address is not None and address == self._held[i][1]:
                continue
            if same_value(np.asarray(view), old):
                self._held[i] = (tensor, address)
            else:
                found.append(v)
        return found

    def restore(self, changed=None) -> None:
        """Set the changed variables (``changed``, default all that changed) back to their snapshot values."""
        old = {id(v): value for v, value in zip(self._variables, self._values, strict=True)}
        for v in self.changed() if changed is None else changed:
            v.assign(old[id(v)])

    def refuse_changes(self, during: str, changed=None) -> None:
        """Restore the snapshot; raise ``ValueError`` naming the variables ``during`` changed, if any.

        ``changed``: ``changed()`` as the caller has just found it (else found here).
        """
        changed = self.changed() if changed is None else changed
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


_SAME_SIZE_INT = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


def _bits(value) -> tf.Tensor:
    """``value``'s bits as integers of the same size (float and complex: a NaN equals itself, -0 is not 0)."""
    value = tf.convert_to_tensor(value)
    if value.dtype.is_complex:
        value = tf.stack([tf.math.real(value), tf.math.imag(value)])
    if value.dtype.is_floating:
        return tf.bitcast(value, _SAME_SIZE_INT[value.dtype.size])
    return value


def _unequal(variable, copy) -> tf.Tensor:
    """Whether any bit of ``variable`` differs from ``copy`` (a scalar bool; exact, no tolerance)."""
    return tf.reduce_any(tf.not_equal(_bits(variable), _bits(copy)))


def _arrays(variables) -> list:
    """The variables' values as read-only numpy views of one fresh read each (no copy), used at once."""
    return [np.asarray(view) for _, view in _private_api.read_tensors_and_views(variables)]


def _changed(variables, copies) -> list:
    """Eager, exact: for each variable, whether any bit differs from its copy (``same_bytes``).

    Read and compared in numpy (about a third of the time of one traced comparison on a 3 MB model).
    """
    return [not same_bytes(a, b) for a, b in zip(_arrays(variables), _arrays(copies), strict=True)]


def _on_read(value, name, any_shape=False):
    """The watch's variable named ``name``, read on the first replica; ``any_shape``: no static shape."""
    return tf.Variable(value, trainable=False, name=name, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                       shape=tf.TensorShape(None) if any_shape else None)


def _any_shape(value):
    """The watch's variable for a copy or flags whose shape follows a model's weights: no static shape.

    All named ``"dp_write_watch"``: TensorFlow keys its eager kernels by a variable's shape and the
    creation's by its name too, so their creation and reads share one kernel per dtype (about 0.4 ms each
    to instantiate again after ``tf.keras.utils.set_random_seed`` clears the kernels).
    """
    return _on_read(value, "dp_write_watch", any_shape=True)


def is_public(variable, public) -> bool:
    """Whether ``variable`` (or the ``tf.Variable`` a Keras 3 one wraps) is among the ids ``public``."""
    return id(variable) in public or id(getattr(variable, "_value", None)) in public


def variables_outside_dp_update(model, public=(), optimizer=None) -> list:
    """The variables of ``model`` that no DP step may change (not trainable, not managed by tfdpbnn).

    Weights, not variables: Keras 3's variables also hold the random-number state (``SeedGenerator``).
    ``public``: ids of variables asserted public (``DPOptimizerMixin.assert_public_variable``), left out
    (the optimizer checks the model again at each of their new values instead). ``optimizer``: the DP
    optimizer of the run; the state a tfdpbnn layer names as managed (a noisy layer's ``noise_stddev``) is
    left out only where that optimizer sets it at every step (``_dp_sets_layer_state``: SI-DPSGD): under
    another one nothing of tfdpbnn writes it, and a value set from the data would leave with the model.
    """
    skip = {id(v) for v in model.trainable_variables}
    if getattr(optimizer, "_dp_sets_layer_state", False):
        skip |= {id(v) for layer in _layers(model) for v in _managed_state(layer)}
    return [v for v in model.weights
            if _private_api.is_variable(v) and v.dtype != tf.resource and id(v) not in skip
            and not is_public(v, public)]


class WriteWatch:
    """What the DP step wrote to the model's variables, to find writes made outside it during a run.

    The step knows what it wrote: after every ``apply_gradients`` of a DP optimizer, ``after_write`` keeps an
    exact copy of every variable it updated; before the next one, ``before_write`` compares every bit of the
    variables with their copies, inside the traced step, and refuses the step (``InvalidArgumentError``
    naming the variables) when any was changed in between: by a callback that writes a weight between
    batches, a custom loop's ``assign``, anything but the DP update (a permutation or sign flip of a
    weight's values too: nothing but the same bits passes). A write that also set the optimizer's step
    counter back (a checkpoint of the model and its optimizer restored: earlier weights of a recorded run,
    whose rewound steps the privacy record counts again) is accepted. The variables live in this plain (not
    trackable) object, as the noise key's, so no checkpoint holds them; the copies double the memory of the
    watched weights. Each run (``new_run``: every ``fit``, ``train_on_batch``, ``begin_training``) starts
    unarmed: weights set before its first step (``load_weights``, a ``BackupAndRestore`` restore) are the
    per-record ledger's business.

    ``constants`` (``new_run``): variables no DP step may change (``variables_outside_dp_update``: a layer's
    non-trainable state, a frozen layer's weights; and the variables the model reads but does not own,
    ``tfdpbnn.optimizers.outside_reads``), copied when the run starts and compared at every step
    of a custom loop, and again when the next ``train_on_batch`` call starts (``model.fit`` compares them at
    every epoch end with ``StateWatch``, which also sets them back).

    Under XLA (``jit_compile=True``) the failing assertion is dropped and the step runs; the variable's flag
    is set all the same, so ``StateWatch`` refuses the run at that batch's end (``refuse_written``), a
    ``train_on_batch`` call when it returns, and the statement gives no guarantee. A variable found written
    stays in ``written`` for the optimizer's life: its statement then gives no guarantee. A new set of
    variables (a layer made non-trainable) gets new flags (a variable keeps its copy); a step traced before
    keeps writing the old flags, which ``written`` reads too.
    """

    def __init__(self):
        self._variables, self._index, self._copies = [], {}, []
        self._constants, self._constant_copies = [], []
        self._tainted = []
        self._retired = []  # (watched variables, flags) of earlier sets of variables (see new_run)
        self._copy_of = {}  # id(variable) -> (variable, its copy)
        self._kind = None  # the kind of the last run ("fit", "custom_loop", "train_on_batch")
        self._released = set()  # keys (``state``) of the weights an epoch's end released (``note_epoch_end``)
        self._post_processing = {}  # key of asserted weights -> the reason (``assert_post_processing``)
        self._asserted_used = []  # reasons of the assertions that accepted a write
        self._state_verified = False  # just found equal to its copies (state_changed_since_write)
        # The optimizer's own state per variable (``watch_state``): compared from each run's start on.
        self._state, self._state_copies, self._state_flags = [], [], None
        with tf.init_scope():
            self._armed = _on_read(False, "dp_write_watch_armed")
            self._check_constants = _on_read(False, "dp_write_watch_constants")
            self._step = _on_read(tf.constant(-1, tf.int64), "dp_write_watch_step")
            self._state_step = _on_read(tf.constant(-1, tf.int64), "dp_write_watch_state_step")
            self._flags = None

    def new_run(self, variables, constants=(), kind="fit", state=(), writes=None) -> None:
        """Start a run over ``variables`` (the model's trainable variables): unarmed until the first write.

        ``constants``: variables no step of the run may change (see the class), copied now; the steps of
        a ``"custom_loop"`` or ``"train_on_batch"`` run (``kind``) compare them, those of a ``"fit"`` do not
        (``StateWatch`` does, and sets them back). See also ``refuse_changed_constants``. ``state``: the
        optimizer's own state per variable (``watch_state``), compared from now on: its first step refuses
        a change made before it (a callback's ``on_train_begin``) unless the count of DP writes ``writes``
        (the optimizer's variable) has moved since (a restore of the optimizer).
        """
        self._new_state_run(state, writes)
        values = self._flag_values()  # read once: for the names below, and to reset the flags set
        self._tainted.extend(n for n in self._flagged(values) if n not in self._tainted)
        variables, constants = list(variables), list(constants)
        with tf.init_scope():
            self._kind = kind
            if self._flags is None or not _same(variables, self._variables) or not _same(constants,
                                                                                       self._constants):
                if self._flags is not None:  # a step traced earlier still writes these flags
                    self._retired.append((self._variables + self._constants, self._flags))
                self._variables = variables
                self._index = {id(v): i for i, v in enumerate(variables)}
                self._copies = [self._copy_for(v, lambda v: tf.zeros(v.shape, v.dtype)) for v in variables]
                self._constants = constants
                self._constant_copies = [_any_shape(tf.convert_to_tensor(v)) for v in constants]
                self._flags = _any_shape(tf.zeros([len(variables) + len(constants)], tf.float32))
            else:
                for v, copy in zip(constants, self._constant_copies, strict=True):
                    copy.assign(v, read_value=False)
            for _, flags in self._flag_sets():
                read = values.get(id(flags))  # flags made just now are zeros
                if read is not None and np.any(read):
                    _private_api.assign_now(flags, np.zeros_like(read))
            _private_api.assign_now(self._check_constants, np.bool_(kind != "fit"))
            _private_api.assign_now(self._armed, np.bool_(False))

    def watch_state(self, variables, writes) -> None:
        """Watch the optimizer's own state per variable (``variables``: slots, Keras 3's EMA averages).

        Only the DP step may write it: a momentum or an Adam moment set from the data between two steps
        goes into every later update, unclipped and without noise. Each DP write keeps an exact copy of it
        (``after_write``) and the next one compares every bit (``before_write``), as for the weights; a run's
        first step compares it with its value at the run's start (``new_run``). Each variable gets one
        copy for the watch's life; a new set of variables gets new flags (a step traced before keeps
        writing the old ones, which ``written`` reads too), and is compared from the count of DP writes
        ``writes`` (the optimizer's variable) as it is now. Called at a run's start and at every trace of a
        DP write (Keras 2 creates an optimizer's slots in its first update: they are watched from the step
        that created them, before which no code could write them).
        """
        variables = [v for v in variables if v is not None]
        if _same(variables, self._state) and (self._state_flags is not None or not variables):
            return  # the same set, or none before and none now
        with tf.init_scope():
            if self._state_flags is not None:
                self._retired.append((self._state, self._state_flags))
            self._state = variables
            self._state_copies = [self._copy_for(v, tf.convert_to_tensor) for v in variables]
            self._state_flags = _any_shape(tf.zeros([len(variables)], tf.float32))
            if writes is not None:
                _private_api.assign_now(self._state_step, np.int64(int(_private_api.read_numpy(writes))))

    def _copy_for(self, variable, initial):
        """The watch's one copy of ``variable``, shared by the traced steps; made as ``initial(variable)``."""
        held = self._copy_of.get(id(variable))
        if held is None or held[0] is not variable:
            held = self._copy_of[id(variable)] = (variable, _any_shape(initial(variable)))
        return held[1]

    def _flag_sets(self) -> list:
        """``(watched variables, flags)`` of every set of flags: earlier sets, the weights', the state's."""
        return [*self._retired, (self._variables + self._constants, self._flags),
                (self._state, self._state_flags)]

    def _new_state_run(self, state, writes) -> None:
        """``new_run``'s part for the optimizer's state: its copies as they are now, compared from now on."""
        state = [v for v in state if v is not None]
        if not state and not self._state:
            return
        verified = self._state_verified
        self._state_verified = False
        with tf.init_scope():
            known = self._state_flags is not None and _same(state, self._state)
            self.watch_state(state, None)
            if not (known and verified):  # not just found equal (state_changed_since_write)
                for v, copy in zip(self._state, self._state_copies, strict=True):
                    copy.assign(v, read_value=False)
            step = -1 if writes is None else int(_private_api.read_numpy(writes))
            _private_api.assign_now(self._state_step, np.int64(step))

    def state_changed_since_write(self, writes) -> list:
        """Eager: names of the optimizer's state variables that differ from their copies (same write count).

        The copies are the last DP write's, or the run's start's before its first write. ``writes``: the
        optimizer's count of DP writes; one that moved since (a restore of the optimizer) compares nothing.
        """
        self._state_verified = False
        if not self._state or int(_private_api.read_numpy(writes)) != int(
                _private_api.read_numpy(self._state_step)):
            return []
        changed = [v.name for v, w in zip(self._state, _changed(self._state, self._state_copies),
                                          strict=True) if w]
        self._state_verified = not changed
        return changed

    def refuse_changed_constants(self, constants) -> None:
        """Before a ``train_on_batch`` call: the last run's constants must hold their values if it was one.

        Consecutive ``train_on_batch`` calls are one DP run fed batch by batch: a variable no DP step may
        change (``constants``, the same variables as the last call's) that changed between them raises
        ``ValueError`` naming it, and the statement gives no guarantee.
        """
        constants = list(constants)
        if self._kind != "train_on_batch" or not _same(constants, self._constants):
            return
        with tf.init_scope():
            changed = [v.name for v, c in zip(constants, self._constant_copies, strict=True)
                       if not _equal(_numpy(v), _numpy(c))]
        if changed:
            self.taint(changed)
            raise ValueError(
                f"model: variable(s) {changed[:3]} changed between two train_on_batch calls of a DP run, "
                "outside the DP update (a layer's non-trainable state, a frozen layer's weights, or a "
                "variable the model reads but does not own). No epsilon covers what they carry; the "
                "optimizer's privacy statement now says guarantee: false. Change them only before DP "
                "training.")

    def disarm(self) -> None:
        """Skip the checks at the next step (the audits set the weights and optimizer state on purpose)."""
        with tf.init_scope():
            self._armed.assign(False)
            self._state_step.assign(-1)

    def _held(self, variables) -> list:
        """The indices of every watched variable when the write covers any of them (else none).

        A write that updates some of the watched weights (``minimize`` over one layer's variables) keeps a
        copy of all of them, and the next write compares all: a weight no DP write updates must not change
        between them either (its copy is its value at the last write, not one it never had).
        """
        if any(id(v) in self._index and self._variables[self._index[id(v)]] is v for v in variables):
            return list(range(len(self._variables)))
        return []

    def before_write(self, variables, iterations) -> list:
        """Inside the step, before the update: refuse it if a variable changed since the last DP write.

        ``iterations``: the optimizer's count of DP writes (a restore that set it back is accepted, see
        above). Also compares the run's constants with their copies from its start, and the optimizer's
        state (``watch_state``) with the last DP write's copies (the run's start's before its first write).
        """
        held = self._held(variables)
        step = tf.cast(tf.convert_to_tensor(iterations), tf.int64)
        written, marks, names = [], [], []
        if held or self._constants:
            armed = tf.logical_and(tf.convert_to_tensor(self._armed),
                                   tf.equal(step, tf.convert_to_tensor(self._step)))
            parts = []
            if held:
                parts.append(tf.logical_and(armed, tf.stack(
                    [_unequal(self._variables[i], self._copies[i]) for i in held])))
            if self._constants:
                parts.append(tf.logical_and(tf.convert_to_tensor(self._check_constants), tf.stack(
                    [_unequal(v, c) for v, c in zip(self._constants, self._constant_copies, strict=True)])))
            found = parts[0] if len(parts) == 1 else tf.concat(parts, axis=0)
            where = held + list(range(len(self._variables), len(self._variables) + len(self._constants)))
            marks.append(self._mark(self._flags, found, where, len(self._variables) + len(self._constants)))
            written.append(found)
            names += [self._variables[i].name for i in held] + [v.name for v in self._constants]
        if self._state:
            found = tf.logical_and(tf.equal(step, tf.convert_to_tensor(self._state_step)), tf.stack(
                [_unequal(v, c) for v, c in zip(self._state, self._state_copies, strict=True)]))
            every = list(range(len(self._state)))
            marks.append(self._mark(self._state_flags, found, every, len(self._state)))
            written.append(found)
            names += [v.name for v in self._state]
        if not written:
            return []
        if _private_api.in_xla_context():  # XLA drops assertions (and has no string gather): the flags stay
            return marks
        written = written[0] if len(written) == 1 else tf.concat(written, axis=0)

        def refuse():  # built into the graph's failing branch only: nothing gathered at a clean step
            return tf.debugging.Assert(
                False,
                ["these variables were changed outside the DP step during DP training (after the last DP "
                 "update, before this one: a callback or code between steps wrote them). No epsilon covers "
                 "what they carry; the step is refused. Change weights only through the DP optimizer while "
                 "training, or between runs:", tf.boolean_mask(tf.constant(names), written)], summarize=3)

        with tf.control_dependencies(marks):
            return [tf.cond(tf.reduce_any(written), lambda: _after(refuse), lambda: tf.constant(True))]

    @staticmethod
    def _mark(flags, found, where, size):
        """Set ``flags`` at indices ``where`` (of ``size``) where ``found`` is true; the assignment."""
        found = tf.cast(found, tf.float32)
        if where == list(range(size)):  # every flag
            return flags.assign(tf.maximum(tf.convert_to_tensor(flags), found))
        return flags.assign(tf.tensor_scatter_nd_max(
            tf.convert_to_tensor(flags), tf.constant([[i] for i in where], tf.int32), found))

    def after_write(self, variables, iterations) -> None:
        """Inside the step, after the update: keep a copy of what the DP step wrote; arm the check."""
        held = self._held(variables)
        step = tf.cast(tf.convert_to_tensor(iterations), tf.int64)
        if self._state:
            for v, copy in zip(self._state, self._state_copies, strict=True):
                copy.assign(v, read_value=False)
            self._state_step.assign(step)
        if not held:
            return
        for i in held:
            self._copies[i].assign(self._variables[i], read_value=False)
        self._step.assign(step)
        self._armed.assign(True)

    def last_written_state(self) -> str:
        """A key of every bit of the weights the last DP write left (eager; ``variables_identity``).

        For a model whose weights are all trainable it is the weights' identity the privacy record writes
        (``weights_fingerprint`` without "weights:"), computed once for both: at an epoch's end the record's
        snapshot that follows finds the same bytes by their quick digests instead of hashing them again.
        """
        if not self._copies:
            return ""
        return variables_identity(self._copies)

    def state(self) -> str:
        """The same key for the watched variables' values now (eager)."""
        if not self._variables:
            return ""
        return variables_identity(self._variables)

    def changed_since_write(self, iterations) -> list:
        """Eager: the watched variables whose values differ from the last DP write's (armed, same step)."""
        step = _private_api.read_numpy(iterations) if _private_api.is_variable(iterations) \
            else tf.convert_to_tensor(iterations).numpy()
        if self._flags is None or not self._variables or not bool(_private_api.read_numpy(self._armed)) \
                or int(step) != int(_private_api.read_numpy(self._step)):
            return []
        written = _changed(self._variables, self._copies)
        return [v.name for v, w in zip(self._variables, written, strict=True) if w]

    def non_finite(self) -> list:
        """Eager: names of the watched variables holding a NaN or an infinity.

        One record with a NaN or infinite value (a feature, a label, a loss) makes its gradient, and so the
        noised sum and every later weight, NaN, which the same data set without it does not: such weights
        tell the two apart, so no epsilon holds for them (the statement says so).
        """
        return [v.name for v in self._variables
                if not np.all(np.isfinite(np.asarray(_private_api.read_numpy(v))))]

    def note_epoch_end(self) -> str:
        """Remember the weights the last DP write left as an epoch's end (released); return their key."""
        key = self.last_written_state()
        self._released.add(key)
        return key

    def note_post_processing(self) -> None:
        """Accept the watched weights as they are now: a tfdpbnn function wrote them from DP releases only.

        SI-DPSGD's ``release_weights`` (one sample around the DP-trained means), ``IterateAverage.swap_in``
        (the average of the DP iterates): post-processing, as an epoch end's weights.
        """
        self._released.add(self.state())

    def assert_post_processing(self, reason: str) -> None:
        """The user's assertion that the watched weights as they are now were written without private data."""
        self._post_processing[self.state()] = reason

    def post_processing_assertions(self) -> list:
        """The reasons of the assertions that accepted a write (for the statement's ``asserted_by_user``)."""
        return list(self._asserted_used)

    def written_after_run(self, iterations, recognised, now=None) -> tuple[list, str | None]:
        """Eager: trainable variables written since the last DP write of a run that has ended, and how known.

        Returns ``(names, None)`` when the watched weights are neither the last DP write's (at the same step
        counter: a restore that set it back is the record's business), an epoch end's, nor weights that
        ``recognised()`` (the record) knows; ``(names, reason)`` when the user asserted these weights
        (``assert_post_processing``); ``([], None)`` otherwise. ``now``: ``(variables, key)``, the key
        (``state``) of ``variables``' values as the caller has just computed it; when ``variables`` are the
        watched ones and the key is an epoch end's, the answer is ``([], None)`` without comparing the
        variables with the last write's copies (unchanged or not, they are an epoch end's).
        """
        if now is not None and _same(list(now[0]), self._variables) and now[1] in self._released:
            return [], None
        changed = self.changed_since_write(iterations)
        if not changed:
            return [], None
        key = self.state()
        if key in self._released or recognised():
            return [], None
        reason = self._post_processing.get(key)
        if reason is not None and reason not in self._asserted_used:
            self._asserted_used.append(reason)
        return changed, reason

    def refuse_written_between_runs(self, iterations, recognised, now=None) -> None:
        """Before a ``train_on_batch`` call: refuse trainable weights written since the last DP write.

        Consecutive DP calls are one run fed batch by batch: the last call's DP write must reach this call's
        step untouched, unless the weights are an epoch end's, ones the record knows (``load_weights`` of a
        recorded checkpoint), the optimizer's step counter was set back (a restore), or the user asserted
        them (``assert_post_processing``). Otherwise ``ValueError`` naming the variables, and the statement
        gives no guarantee. ``now``: as in ``written_after_run``.
        """
        changed, asserted = self.written_after_run(iterations, recognised, now)
        if changed and asserted is None:
            self.taint(changed)
            raise ValueError(
                f"model: trainable variable(s) {changed[:3]} changed after the last DP write of this "
                "optimizer (between two DP calls: train_on_batch, fit), outside the DP update, to values "
                "that are neither that write's, an epoch end's, nor weights the privacy record holds. No "
                "epsilon covers what they carry; the optimizer's privacy statement now says guarantee: "
                "false. If the change used no private data, say so first with "
                "optimizer.assert_post_processing(reason=...) (listed under asserted_by_user).")
        state = self.state_changed_since_write(iterations)
        # Accepted with weights that changed too and passed above: a restore of the model and its optimizer.
        if state and not self.changed_since_write(iterations):
            self.taint(state)
            raise ValueError(
                f"optimizer: its variable(s) {state[:3]} (state the DP step keeps per weight: a momentum, "
                "Adam's moments, an EMA average) changed since its last DP write, outside the DP step, while "
                "the weights did not. The next DP update would carry what they hold, unclipped and without "
                "noise; no epsilon covers it, and the optimizer's privacy statement now says guarantee: "
                "false. Change an optimizer's variables only by restoring the model and the optimizer "
                "together.")

    def _flagged(self, values=None) -> list:
        """Names of the variables the steps flagged since the run started (every set of variables).

        ``values``: {id(flags): the flags as just read} (``_flag_values``), else each set of flags is read.
        """
        found = []
        for watched, flags in self._flag_sets():
            if flags is not None:
                read = values[id(flags)] if values is not None else _private_api.read_numpy(flags)
                found += [v.name for v, f in zip(watched, read, strict=True) if f > 0 and v.name not in found]
        return found

    def _flag_values(self) -> dict:
        """{id(flags): values} of every set of flags, each read once."""
        return {id(flags): _private_api.read_numpy(flags) for _, flags in self._flag_sets()
                if flags is not None}

    def written(self) -> list:
        """Names of the variables found written outside the DP step (this run's and earlier runs')."""
        return list(self._tainted) + [n for n in self._flagged() if n not in self._tainted]

    def refuse_written(self, when: str) -> None:
        """Raise ``ValueError`` naming the variables this run's steps found written.

        For steps compiled by XLA, whose failing assertion was dropped: the step ran on, its flag was set.
        """
        flagged = self._flagged()
        if flagged:
            raise ValueError(
                f"model: variable(s) {flagged[:3]} were changed outside the DP step during DP training "
                f"(found {when}; the step's own refusal was dropped, as XLA drops assertions). No epsilon "
                "covers what they carry; the optimizer's privacy statement now says guarantee: false.")

    def taint(self, names) -> None:
        """Record ``names`` as written outside the DP step (a check outside the traced step found them)."""
        self._tainted.extend(n for n in names if n not in self._tainted)


def _after(op) -> tf.Tensor:
    """``True`` once ``op()`` has run (a ``tf.cond`` branch that holds an assertion)."""
    with tf.control_dependencies([op()]):
        return tf.constant(True)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _numpy(variable):
    return np.asarray(_private_api.read_numpy(variable))


def refuse_changed_noise(model, optimizer, when: str) -> None:
    """Refuse a step about to run with a noise multiplier other than the open phase's (``when``: before it).

    A callback may set the optimizer's noise multiplier (one of ``optimizer.variables`` on Keras 3) for a
    batch and set it back before the epoch's end, where ``tfdpbnn.callbacks.DPTrainingMonitor`` compares
    it: found before the batch (``StateWatch.before_batch``, after every callback's
    ``on_train_batch_begin``), no step ran with it, and the step does not run.
    """
    sigma = optimizer.noise_multiplier
    phase = attributes.ledger_state(optimizer).changed_noise(sigma)
    if phase is None:
        return
    model.stop_training = True
    raise ValueError(
        f"noise_multiplier: the optimizer's noise multiplier was changed during fit ({when}), from "
        f"{phase:g} (the privacy ledger's open phase) to {sigma:g} (a callback "
        "or code writing the optimizer's variables); the next step would not be a step the ledger accounts, "
        "and does not run. Change the noise between fits: each fit opens a phase with the optimizer's noise "
        "multiplier.")


class StateWatch(tf.keras.callbacks.Callback):
    """Refuses a DP ``fit`` in which a model variable changed outside the DP update, at any time of the run.

    The variables the step may change are the model's trainable variables (the DP update) and tfdpbnn's
    layers' own state (SI-DPSGD's weight-noise scale); any other (a frozen layer's weights, a layer's
    non-trainable state, a variable a ``train_step`` override or a callback updates) is compared with its
    value after every callback's ``on_train_begin`` before every batch (after every callback's
    ``on_train_batch_begin``), at every epoch's end and at the end of ``fit``, set back, and named in a
    ``ValueError`` (the statement's ``guarantee`` false); so are the variables the model reads but does not
    own (``tfdpbnn.optimizers.outside_reads``), before every batch. Writes to the trainable variables
    between steps are refused by the next step (``WriteWatch``; under XLA, whose steps drop the failing
    assertion, at that batch's end); after the last step, at the end of ``fit``, unless the weights are
    those of an epoch's end
    (``EarlyStopping(restore_best_weights=True)``: post-processing). The end-of-``fit`` checks run in
    ``self.end``, a callback placed after every other one (``model.fit`` puts it last), so a write in any
    callback's ``on_train_end`` is seen too.

    ``others_may_write=False`` says that the ``fit`` runs no callback but tfdpbnn's (``model.fit`` passes it
    so when the caller gave none): after the last epoch's end nothing but tfdpbnn's own callbacks runs, so
    the end-of-``fit`` comparison is skipped when the privacy record's final snapshot fingerprinted the
    weights as the bytes of the last DP write at that epoch's end (the same identity,
    ``variables_identity``) and the count of DP writes has not moved since.
    """

    def __init__(self, others_may_write: bool = True):
        super().__init__()
        self._done = False
        self._outside = None
        self._states = set()
        self._jit = False
        self._others_may_write = bool(others_may_write)
        self._epoch_end = None  # (key of the last DP write at the last epoch end, the step counter then)
        self.end = _StateWatchEnd(self)

    def on_train_begin(self, logs=None):
        """Start watching (the snapshot is taken after every callback's ``on_train_begin``: ``self.end``)."""
        self._done, self._outside, self._states = False, None, set()
        self._jit = getattr(self.model, "jit_compile", False) is True
        self._epoch_end = None

    def after_callbacks_began(self):
        """After every callback's ``on_train_begin`` (a restore included): the state no DP step may change.

        The layers' declared state is checked again where a callback other than tfdpbnn's ran
        (``check_declared_state``: it may have set it from the data since the run's start), and the
        variables outside the DP update are kept (``VariableSnapshot``), to be compared before every batch,
        at every epoch's end and at the end.
        """
        public = getattr(self.model.optimizer, "_dp_public_variables", {})
        if self._others_may_write:
            check_declared_state(self.model, public)
        self._outside = VariableSnapshot(self.model, outside_dp_update=True, public=public,
                                         optimizer=self.model.optimizer)

    def before_batch(self, batch):
        """Before every batch, after every callback's ``on_train_batch_begin``: nothing changed since.

        The variables outside the DP update (``_refuse_outside``: set back, named, ``guarantee`` false), the
        optimizer's noise multiplier (``refuse_changed_noise``, where a callback other than tfdpbnn's runs)
        and the variables the model reads but does not own
        (``DPOptimizerMixin._dp_outside_reads_before_step``):
        no step runs with a value the run did not start with (a value set and undone around a batch too).
        """
        self._refuse_outside(f"found before batch {batch}, after every callback's on_train_batch_begin")
        if self._others_may_write:  # a callback may set the noise multiplier for a batch and set it back
            refuse_changed_noise(self.model, self.model.optimizer,
                                 f"found before batch {batch}, after every callback's on_train_batch_begin")
        check = getattr(self.model.optimizer, "_dp_outside_reads_before_step", None)
        if check is not None:
            check(self.model, f"found before batch {batch}, after every callback's on_train_batch_begin")

    def on_train_batch_end(self, batch, logs=None):
        """Note a batch has run; under XLA, refuse the run if the step found a variable written.

        XLA drops the step's own failing assertion: its flag is read here instead.
        """
        if self._jit and self._watch() is not None:
            self._watch().refuse_written(f"after batch {batch}")
        self._done = True

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
                                     "of the trainable variables)", changed)

    def on_epoch_end(self, epoch, logs=None):
        """Refuse non-trainable state changed during the epoch; remember the epoch's trainable state."""
        self._refuse_outside(f"found at the end of epoch {epoch}")
        watch = self._watch()
        if watch is not None and self._done:  # the state the epoch's last DP step wrote (its copy's key)
            if self._jit:
                watch.refuse_written(f"at the end of epoch {epoch}")
            key = watch.note_epoch_end()
            self._states.add(key)
            self._epoch_end = (key, int(_numpy(self.model.optimizer._dp_write_count)))

    def finish(self):
        """Refuse state changed after the last DP step, unless set back to an epoch's end (as EarlyStopping).

        Weights set to those at an earlier epoch's end are post-processing of what the DP steps released.
        Run by ``self.end`` after every other callback's ``on_train_end``.
        """
        self._refuse_outside("found at the end of fit, after every callback's on_train_end")
        refuse_bookkeeping = getattr(self.model.optimizer, "_dp_refuse_bookkeeping_written", None)
        if refuse_bookkeeping is not None:
            try:
                if self._others_may_write:  # else tfdpbnn's monitor compared them last, at its on_train_end
                    refuse_bookkeeping(self.model,
                                       "found at the end of fit, after every callback's on_train_end")
            finally:
                attributes.ledger_state(self.model.optimizer).guard_disarm()
        watch = self._watch()
        if watch is None or not self._done or self._unchanged_since_epoch_end():
            return
        changed = watch.changed_since_write(self.model.optimizer._dp_write_count)
        if changed and watch.state() not in self._states | watch._released:  # or a library post-processing
            watch.taint(changed)
            raise ValueError(
                f"model: variable(s) {changed[:3]} changed after the last DP step of fit (a callback wrote "
                "them, e.g. in on_epoch_end or on_train_end), to values that are neither that step's nor an "
                "epoch end's. No epsilon covers what they carry, and the optimizer's privacy statement now "
                "says guarantee: false. Change weights only through the DP optimizer while training.")

    def _unchanged_since_epoch_end(self) -> bool:
        """Whether the weights are, provably, the last DP write's, as the last epoch's end left them.

        Only for a ``fit`` with no callback but tfdpbnn's (``others_may_write=False``): the privacy record's
        final snapshot (``RunRecord.final_weights``, read in the monitor's ``on_train_end``) fingerprinted
        the model's weights, which are the watched variables themselves in their order (a model whose
        weights are all trainable), with the identity of the very bytes the write check keyed at the last
        epoch's end (the last DP write's copies), no DP write since (the same ``_dp_write_count``), and no
        callback but tfdpbnn's ran in between to write them.
        """
        watch = self._watch()
        if self._others_may_write or self._epoch_end is None or watch is None:
            return False
        key, writes = self._epoch_end
        final = attributes.run_record(self.model.optimizer).final_weights
        return bool(key) and final == "weights:" + key and _same(list(self.model.weights), watch._variables) \
            and int(_numpy(self.model.optimizer._dp_write_count)) == writes


class _StateWatchEnd(tf.keras.callbacks.Callback):
    """``StateWatch``'s checks that follow every other callback (``model.fit`` places it last).

    Its snapshot after every ``on_train_begin``, its comparison after every ``on_train_batch_begin`` and its
    end-of-``fit`` check after every ``on_train_end``.
    """

    def __init__(self, watch):
        super().__init__()
        self._state_watch = watch

    def on_train_begin(self, logs=None):
        """Run ``StateWatch.after_callbacks_began``."""
        self._state_watch.after_callbacks_began()

    def on_train_batch_begin(self, batch, logs=None):
        """Run ``StateWatch.before_batch``."""
        self._state_watch.before_batch(batch)

    def on_train_end(self, logs=None):
        """Run ``StateWatch.finish``."""
        self._state_watch.finish()


__all__ = ["StateWatch", "VariableSnapshot", "WriteWatch", "check_declared_state", "is_public",
           "refuse_changed_noise", "same_value", "variables_outside_dp_update"]
