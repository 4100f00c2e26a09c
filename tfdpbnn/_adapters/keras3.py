"""The Keras 3 adapter (TensorFlow backend): optimizer base classes of tfdpbnn's own, and Keras 3 internals.

tensorflow-privacy has no Keras 3 optimizers, so tfdpbnn's DP optimizers subclass ``keras.optimizers.SGD`` /
``Adam`` through ``DPSGDBase`` / ``DPAdamBase``. These only accept the constructor arguments the shared
``DPOptimizerMixin`` passes to a tensorflow-privacy base (the clip bound and noise multiplier are the mixin's
own variables; nothing here touches a gradient) and give the two names the shared code uses on a Keras 2
optimizer: ``add_weight`` (a non-trainable optimizer variable, saved by ``model.save`` in creation order)
and ``_decayed_lr`` (the current learning rate). The DP step itself is ``DPOptimizerMixin.dp_train_step``,
which the ``fit`` dispatch (``tfdpbnn.optimizers.keras_integration``) runs in place of Keras 3's
``TensorFlowTrainer.train_step``.

The Keras 3 private names tfdpbnn needs are here, each behind one function (``check()`` is run by the test
suite): ``Trainer._compile_loss`` (the ``CompileLoss`` of ``model.compile(loss=...)``) with its ``built``,
``build`` and ``_flat_losses`` (to rebuild the unreduced per-example loss) and ``_user_loss`` (the loss
as compiled), ``Trainer._loss_tracker`` (the
``loss`` metric), ``keras.src.backend.common.masking.get_keras_mask`` and
``keras.src.losses.loss.squeeze_or_expand_to_same_rank`` (Keras's alignment of loss
values and sample weights), ``Optimizer._get_variable_index`` with Adam's ``_momentums`` /
``_velocities`` (the optimizer slots the traced-step audit reads, ``optimizer_slot``),
``Trainer._flatten_metrics_in_order`` (``train_on_batch``'s list of logs), ``TensorFlowTrainer``'s
``_distribute_strategy`` and ``_maybe_symbolic_build`` (``fit``'s build of the model from its first batch
under a ``tf.distribute`` strategy, ``build_from_one_replica``) and the trainer module's
``_collective_all_reduce_multi_worker`` (when ``fit`` reduces a step's logs across workers, ``step_logs``),
``ModelCheckpoint``'s and ``BackupAndRestore``'s ``_should_save_on_batch`` (the batches where they save
the weights, ``saves_after_batch``), and ``SwapEMAWeights``'s ``_tf_swap_variables`` and
``_backend_swap_variables`` (an exact swap, ``exact_ema_swaps``).
"""

from __future__ import annotations

import contextlib
import importlib

import keras
import numpy as np
import tensorflow as tf


def _internal(name: str):
    """A Keras 3 internal module, imported at first use.

    Importing this module under Keras 2 (as ``pkgutil.walk_packages`` over tfdpbnn does) then fails nowhere.
    """
    return importlib.import_module(name)


_AGGREGATIONS = {tf.VariableAggregation.ONLY_FIRST_REPLICA: "only_first_replica",
                 tf.VariableAggregation.NONE: "none", tf.VariableAggregation.SUM: "sum",
                 tf.VariableAggregation.MEAN: "mean"}


class _Keras3Base:
    """What the shared optimizer code needs of its Keras base class, on a Keras 3 optimizer."""

    def __init__(self, l2_norm_clip=None, noise_multiplier=None, num_microbatches=None,
                 unconnected_gradients_to_zero=True, **kwargs):
        # l2_norm_clip and noise_multiplier live in DPOptimizerMixin's variables; tensorflow-privacy's
        # microbatching is not offered (every example is its own microbatch).
        if num_microbatches is not None:
            raise ValueError(f"num_microbatches: only per-example clipping (None) is supported, got "
                             f"{num_microbatches!r}")
        super().__init__(**kwargs)

    def __setattr__(self, name, value):
        # tfdpbnn's optimizers set plain Python settings before the base constructor runs (as Keras 2 allows);
        # Keras 3 refuses any attribute until then, so those are set untracked (they hold no variable).
        if "_lock" not in self.__dict__:
            if isinstance(value, keras.Variable | tf.Variable):
                raise ValueError(f"{name}: an optimizer variable must be created after the Keras constructor")
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def add_weight(self, name, shape=(), dtype=None, initializer="zeros", trainable=False,
                   aggregation=tf.VariableAggregation.NONE):
        """A non-trainable optimizer variable (``keras.optimizers.Optimizer.add_variable``)."""
        if trainable:
            raise ValueError(f"trainable: optimizer variable {name!r} cannot be trainable")
        if isinstance(initializer, keras.initializers.Constant):
            # Keras 3's Constant converts a Python float to float32 before the cast to ``dtype``; the
            # accounting variables (float64) keep their value exactly.
            exact = np.asarray(initializer.value, dtype=tf.as_dtype(dtype or "float32").as_numpy_dtype)

            def initializer(shape, dtype=None, _exact=exact):
                return tf.constant(np.broadcast_to(_exact, shape), dtype=dtype)
        return self.add_variable(shape=tuple(shape), initializer=initializer, dtype=dtype,
                                 aggregation=_AGGREGATIONS.get(aggregation, aggregation), name=name)

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        """Keras 3's state per trained variable (a momentum, Adam's moments, an EMA average), noted.

        ``optimizer_state_variables`` lists what this made: the state the DP write watch compares.
        """
        variable = super().add_variable_from_reference(reference_variable, name=name, initializer=initializer)
        self.__dict__.setdefault("_dp_state_variables", []).append(variable)
        return variable

    def finalize_variable_values(self, var_list):
        """Keras 3's end of ``fit``: with ``use_ema``, the average of the DP iterates set into the weights.

        Post-processing of the DP writes, accepted by the write watch once the averages are found as the
        DP steps left them (``DPOptimizerMixin._dp_swap_in_average``).
        """
        finalize = super().finalize_variable_values
        if not self.use_ema:
            return finalize(var_list)
        return self._dp_swap_in_average(lambda: finalize(var_list))

    def load_own_variables(self, store):
        """Keras 3's restore of the optimizer's variables, counting again the steps it takes off the ledger.

        Keras 3's weights files (``load_weights``, ``load_model``, ``BackupAndRestore``) hold the optimizer's
        variables, the ledger's counters among them. Restored into an optimizer that has taken steps, they
        would set its ledger back; the steps after the restore point ran, so they are counted again as
        "rewound" phases (``RunRecord.account_rewind``, as after a ``tf.train.Checkpoint`` restore).
        """
        load = super().load_own_variables
        self._dp_count_rewind(lambda: load(store))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Keras 3's ``apply_gradients``, which calls ``apply``: that call is this one's (see ``apply``)."""
        depth = self.__dict__.get("_dp_applying", 0)
        self.__dict__["_dp_applying"] = depth + 1
        try:
            return super().apply_gradients(grads_and_vars, *args, **kwargs)
        finally:
            self.__dict__["_dp_applying"] = depth

    def apply(self, grads, trainable_variables=None):
        """Keras 3's ``apply(grads, trainable_variables)``, through the DP optimizer's ``apply_gradients``.

        Keras 3's own ``apply_gradients`` calls ``apply``; called directly (a custom loop or a
        ``train_step`` override in the Keras 3 idiom, ``optimizer.apply(grads, model.trainable_variables)``)
        it would update the weights with whatever gradients it is given, past the DP optimizer's check that
        they are the ones its mechanism released, and past the write watch. It takes the same path as
        ``apply_gradients``: gradients the mechanism did not release are refused (``ValueError`` naming
        ``grads_and_vars``), released ones are applied and counted as a DP write.
        """
        if self.__dict__.get("_dp_applying", 0):
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            trainable_variables = getattr(self, "_trainable_variables", None)
            if not trainable_variables:
                raise ValueError("trainable_variables: optimizer.apply(grads) without the variables needs an "
                                 "optimizer built on them; pass optimizer.apply(grads, "
                                 "model.trainable_variables)")
        grads, trainable_variables = list(grads), list(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(f"grads: {len(grads)} gradients for {len(trainable_variables)} "
                             "trainable_variables; pass one gradient per variable")
        self.apply_gradients(list(zip(grads, trainable_variables, strict=True)))

    def minimize(self, loss, var_list, tape=None):
        """Keras 2's ``minimize``, which Keras 3 optimizers lack: ``_compute_gradients``, then apply them.

        ``_compute_gradients`` is the DP optimizer's (per-example clipping of the loss vector, noise).
        """
        grads_and_vars = self._compute_gradients(loss, var_list, tape=tape)
        self.apply_gradients(grads_and_vars)
        return self.iterations

    def _set_hyper(self, name, value):
        """Keras 2's hyperparameter setter, for the learning rate (the one tfdpbnn sets)."""
        if name != "learning_rate":
            raise ValueError(f"name: only 'learning_rate' is set this way on Keras 3, got {name!r}")
        self.learning_rate = value

    def _get_hyper(self, name):
        """Keras 2's hyperparameter getter, for the learning rate."""
        if name != "learning_rate":
            raise ValueError(f"name: only 'learning_rate' is read this way on Keras 3, got {name!r}")
        return self.learning_rate

    def _decayed_lr(self, dtype):
        """The learning rate of the current step (a schedule evaluated at ``iterations``)."""
        return tf.cast(self.learning_rate, dtype)


class DPSGDBase(_Keras3Base, keras.optimizers.SGD):
    """``keras.optimizers.SGD`` as the base of tfdpbnn's SGD-family DP optimizers on Keras 3."""


class DPAdamBase(_Keras3Base, keras.optimizers.Adam):
    """``keras.optimizers.Adam`` as the base of ``DPAdamOptimizer`` on Keras 3."""


def optimizer_bases():
    """``(DPSGDBase, DPAdamBase)``."""
    return DPSGDBase, DPAdamBase


# ---------------------------------------------------------------------------------- Keras 3 internals
def compiled_loss(model):
    """The ``CompileLoss`` of ``model.compile(loss=...)``, or None when compiled without a loss."""
    return getattr(model, "_compile_loss", None)


def compiled_user_loss(model):
    """The loss ``model.compile`` was given, as its ``CompileLoss`` holds it (None without a loss)."""
    return getattr(compiled_loss(model), "_user_loss", None)


def _at(path, structure):
    for key in path:
        structure = structure[key]
    return structure


def loss_container_parts(container, y_pred, y, sample_weight):
    """``(y_true, sample_weight, losses, loss_weights)``, one entry per leaf of ``tf.nest.flatten(y_pred)``.

    ``y`` (and a nested ``sample_weight``) must have ``y_pred``'s structure, or be one tensor for a single
    output; an output without a loss gets ``None``. Other pairings of ``y`` and outputs (which Keras 3's
    ``CompileLoss`` reconciles in several ways) raise ``ValueError``.
    """
    leaves = keras.tree.flatten_with_path(y_pred)
    if [id(leaf) for _, leaf in leaves] != [id(leaf) for leaf in tf.nest.flatten(y_pred)]:
        raise ValueError("model: its outputs' structure flattens differently in Keras and tf.nest; tfdpbnn's "
                         "per-example loss on Keras 3 cannot pair them with their losses")
    single = not tf.nest.is_nested(y_pred)
    # Keras 3's data adapters hand a list of targets on as a tuple: a sequence of the outputs' length is
    # taken in their sequence type (Keras's own CompileLoss pairs them by position too).
    if isinstance(y_pred, list | tuple) and isinstance(y, list | tuple) and len(y) == len(y_pred):
        y = type(y_pred)(y)
        if isinstance(sample_weight, list | tuple) and len(sample_weight) == len(y_pred):
            sample_weight = type(y_pred)(sample_weight)
    if not single:
        try:
            keras.tree.assert_same_structure(y_pred, y)
        except (ValueError, TypeError) as err:
            raise ValueError("y: on Keras 3 tfdpbnn's per-example loss needs the targets in the structure of "
                             f"the model's outputs (the same dict keys or list positions): {err}") from err
    elif tf.nest.is_nested(y) or tf.nest.is_nested(sample_weight):
        raise ValueError("y: the model has one output, so the targets and sample weights must be one tensor "
                         "each")
    if not container.built:
        container.build(y, y_pred)
    by_path = {tuple(entry[0]): entry for entry in container._flat_losses if entry[1] is not None}
    y_true, weights, losses, loss_weights = [], [], [], []
    for path, _ in leaves:
        entry = by_path.pop(tuple(path), None)
        y_true.append(y if single else _at(path, y))
        weights.append(_at(path, sample_weight) if tf.nest.is_nested(sample_weight) else sample_weight)
        losses.append(None if entry is None else entry[1])
        loss_weights.append(None if entry is None else entry[2])
    if by_path:
        raise ValueError(f"model: compiled losses for {sorted(by_path)} match no output of the model")
    return y_true, weights, losses, loss_weights


def total_loss_metric(model):
    """Keras 3's running-mean ``loss`` metric of ``model`` (``Trainer._loss_tracker``), or None."""
    return getattr(model, "_loss_tracker", None)


def weigh_like_keras(y_t, y_p, sw):
    """Keras 3's ``Loss.__call__`` preparation: ``y_true`` in ``y_pred``'s dtype; masked outputs refused."""
    if _internal("keras.src.backend.common.masking").get_keras_mask(y_p) is not None:
        raise ValueError("model: its output carries a Keras mask; masked per-example losses are not ported "
                         "to Keras 3 yet (Keras 3 rescales masked losses by the batch's count of valid "
                         "entries, which couples examples)")
    return tf.cast(y_t, y_p.dtype), y_p, sw


def squeeze_or_expand(values, sample_weight):
    """Keras 3's alignment of per-element loss values and sample weights: ``(values, sample_weight)``."""
    return _internal("keras.src.losses.loss").squeeze_or_expand_to_same_rank(
        values, sample_weight)


def steps_per_execution(model):
    """Keras 3's ``model.steps_per_execution`` (a public int), or None."""
    return getattr(model, "steps_per_execution", None)


def flatten_logs(model, logs):
    """``logs`` as ``train_on_batch`` returns them without ``return_dict`` (``_flatten_metrics_in_order``)."""
    return model._flatten_metrics_in_order(logs)


def is_keras_variable(value) -> bool:
    """Whether ``value`` is a ``keras.Variable``."""
    return isinstance(value, keras.Variable)


def tf_variable(variable):
    """The ``tf.Variable`` a ``keras.Variable`` holds on the TensorFlow backend (anything else as given)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def train_function(model):
    """``fit``'s traced train function of ``model`` (Keras 3's ``make_train_function`` sets it, returns None).

    The optimizer is built first on the model's trainable variables, as ``fit`` does before its first step.
    """
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    model.make_train_function()
    return model.train_function


#: The per-variable slot lists of Keras 3's optimizers, by Keras 2's slot names: Adam's first and second
#: moments (private ``_momentums``, ``_velocities``) and SGD's momentum (public ``momentums``).
_SLOT_LISTS = {"m": "_momentums", "v": "_velocities", "momentum": "momentums"}


def optimizer_slot_names(optimizer) -> list:
    """The names (Keras 2's) of the per-variable slots ``optimizer`` keeps; it must be built."""
    return [name for name, attr in _SLOT_LISTS.items() if getattr(optimizer, attr, None)]


def optimizer_slot(optimizer, variable, name):
    """The optimizer slot ``name`` (``"m"``, ``"v"``, ``"momentum"``) of ``variable`` (Keras 3 lists)."""
    if name not in optimizer_slot_names(optimizer):
        raise ValueError(f"name: {type(optimizer).__name__} keeps no slot {name!r}; it keeps "
                         f"{optimizer_slot_names(optimizer)}")
    return getattr(optimizer, _SLOT_LISTS[name])[optimizer._get_variable_index(variable)]


def build_optimizer_state(optimizer, variables, at_run_start: bool = False) -> None:
    """Build ``optimizer`` on ``variables`` if it is not built (its state per variable), as ``fit`` does.

    ``at_run_start`` too: Keras 3's ``fit`` builds it before the first step, after code of the user's
    (a callback's ``on_train_begin``) may run.
    """
    if not optimizer.built:
        with tf.init_scope():
            optimizer.build(list(variables))


def optimizer_state_variables(optimizer) -> list:
    """The state ``optimizer`` keeps per trained variable (what its ``add_variable_from_reference`` made)."""
    return list(optimizer.__dict__.get("_dp_state_variables", ()))


def variable_name(variable) -> str:
    """A variable's name, unique within a model (Keras 3's ``path``; its ``name`` is the last part only)."""
    return variable.path


def _first_replica(strategy, value):
    """Replica 0's part of a distributed value (its local results' first); anything else as given."""
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


@contextlib.contextmanager
def build_from_one_replica(model):
    """During ``model.fit`` under a ``tf.distribute`` strategy: Keras builds from one replica's batch part.

    Keras 3's ``TensorFlowTrainer.fit`` first builds the model, its compiled loss and metrics and the
    optimizer from the shapes of the first batch, which it gets by reducing the replicas' parts of that
    batch with MEAN (``_maybe_symbolic_build``): one sum of the parts, which fails (``AddN``) as soon as
    the replicas' parts differ in size, as Poisson batches split across replicas do. Here, for this fit,
    that build reads replica 0's part instead (only its shapes are used, symbolically; nothing is reduced
    or released). The DP step itself is untouched. Without a strategy (``_distribute_strategy`` None) Keras
    builds at tracing and nothing changes.
    """
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None:
        yield
        return
    keras_build = model._maybe_symbolic_build

    def build(iterator=None, data_batch=None):
        if iterator is not None and data_batch is None:
            for _, _, batches in iterator:  # Keras's own walk: the epoch iterator's first batch
                data_batch = tf.nest.map_structure(lambda v: _first_replica(strategy, v), next(batches))
                break
        return keras_build(data_batch=data_batch)

    model.__dict__["_maybe_symbolic_build"] = build   # this model only, for this call (no tracking)
    try:
        yield
    finally:
        model.__dict__.pop("_maybe_symbolic_build", None)


def step_logs(model, logs):
    """A train step's ``logs`` in the form Keras 3's ``fit`` reduces across workers.

    Under a multi-worker ``MultiWorkerMirroredStrategy`` Keras 3 reduces each log value of a step with
    ``strategy.reduce("MEAN", value, axis=0)`` (``reduce_per_replica``), which fails for the scalars a train
    step returns (Keras's own steps included); each scalar is given a length-1 axis there, so the reduce is
    the mean of the replicas' values, as Keras 2 takes it. Anywhere else ``logs`` is returned unchanged.
    """
    trainer = _internal("keras.src.backend.tensorflow.trainer")
    if not trainer._collective_all_reduce_multi_worker(model.distribute_strategy):
        return logs
    logs = {k: tf.convert_to_tensor(v) for k, v in logs.items()}
    return {k: tf.reshape(v, [1]) if v.shape.rank == 0 else v for k, v in logs.items()}


def saves_after_batch(callback, batch) -> bool:
    """Whether ``callback``'s ``on_train_batch_end(batch)``, about to run, may save the model's weights.

    ``callback``: a ``ModelCheckpoint`` or ``BackupAndRestore`` with an integer ``save_freq``; Keras's own
    ``_should_save_on_batch`` decides (``keras_batch_save_decision``). True where that is not known (a
    subclass with a batch hook of its own, counters the installed Keras does not have).
    """
    from tfdpbnn._adapters import keras_batch_save_decision

    for base in (keras.callbacks.ModelCheckpoint, keras.callbacks.BackupAndRestore):
        if isinstance(callback, base):
            decided = keras_batch_save_decision(callback, batch, base)
            return True if decided is None else decided
    return True


def exact_ema_swaps(callbacks) -> None:
    """Make each ``keras.callbacks.SwapEMAWeights`` of a DP ``fit`` swap the weights and averages exactly.

    On the TensorFlow backend it swaps them by additions (``a += b; b = a - b; a -= b``), which rounds: the
    weights it swaps back are not the bits the last DP step wrote, and the write watch refuses the next
    step. Its other backends' swap (``_backend_swap_variables``: through a copy) is exact, and is used
    instead (for these callback objects only).
    """
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.SwapEMAWeights):
            callback._tf_swap_variables = callback._backend_swap_variables


def check() -> None:
    """Raise ``RuntimeError`` naming the Keras 3 internal that the installed Keras no longer provides."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(loss="mse", steps_per_execution=3)
    if steps_per_execution(model) != 3:
        raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s model.steps_per_execution changed; update "
                           "tfdpbnn/_adapters/keras3.py")
    try:
        parts = loss_container_parts(compiled_loss(model), tf.zeros([2, 1]), tf.zeros([2, 1]), None)
        squeeze_or_expand(tf.zeros([2]), tf.ones([2]))
    except (AttributeError, TypeError, ImportError) as err:
        raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s CompileLoss internals changed ({err}); "
                           "update tfdpbnn/_adapters/keras3.py") from err
    trainer = _internal("keras.src.backend.tensorflow.trainer")
    if (not callable(getattr(model, "_maybe_symbolic_build", None))
            or not hasattr(model, "_distribute_strategy")
            or not callable(getattr(trainer, "_collective_all_reduce_multi_worker", None))):
        raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s TensorFlowTrainer._maybe_symbolic_build, "
                           "_distribute_strategy or _collective_all_reduce_multi_worker changed; update "
                           "tfdpbnn/_adapters/keras3.py")
    noted = type("Noted", (_Keras3Base, keras.optimizers.SGD), {})(momentum=0.9)
    build_optimizer_state(noted, [keras.Variable([1.0])])
    state = optimizer_state_variables(noted)
    if len(state) != 1 or state[0] is not noted.momentums[0]:
        raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s optimizers no longer make their state per "
                           "variable through add_variable_from_reference; update tfdpbnn/_adapters/keras3.py")
    swap = keras.callbacks.SwapEMAWeights()
    if not (callable(getattr(swap, "_tf_swap_variables", None))
            and callable(getattr(swap, "_backend_swap_variables", None))):
        raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s SwapEMAWeights._tf_swap_variables or "
                           "_backend_swap_variables changed; update tfdpbnn/_adapters/keras3.py")
    from tfdpbnn._adapters import keras_batch_save_decision

    for base, path in ((keras.callbacks.ModelCheckpoint, "unused.weights.h5"),
                       (keras.callbacks.BackupAndRestore, "unused")):
        if keras_batch_save_decision(base(path, save_freq=2), 0, base) is not False:
            raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s {base.__name__}._should_save_on_batch "
                               "changed; update tfdpbnn/_adapters/keras3.py")
    if not isinstance(parts[2][0], keras.losses.Loss) or total_loss_metric(model) is None \
            or compiled_user_loss(model) != "mse":
        raise RuntimeError(f"tfdpbnn: Keras {keras.__version__}'s CompileLoss._flat_losses or _user_loss, or "
                           "Trainer._loss_tracker changed; update tfdpbnn/_adapters/keras3.py")


def save_saved_model(model, path, signatures):
    """Write ``model`` as a TensorFlow SavedModel with ``signatures`` (``tf.saved_model.save``).

    Keras 3's ``model.save`` writes only ``.keras`` files; here a ``tf.Module`` tracks the ``tf.Variable``
    of every model variable and is saved with the traced signatures, so the SavedModel holds the weights
    and the signatures (no optimizer, as on Keras 2) and loads with ``tf.saved_model.load``.
    """
    module = tf.Module()
    module.model_variables = [tf_variable(v) for v in model.variables]
    tf.saved_model.save(module, path, signatures=signatures)
