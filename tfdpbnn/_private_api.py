"""The one place tfdpbnn touches private names of TensorFlow, Keras and tensorflow-privacy.

Every private name tfdpbnn depends on is listed here, each behind a small function, so that a change of a
pinned version breaks in one place with a clear message (``check()`` is run by the test suite):

- ``tf.data``: ``Dataset._input_dataset`` of ``_PrefetchDataset`` and ``_OptionsDataset`` (to find the
  sampling declaration of a dataset that was only prefetched or given options).
- Keras: ``Model._steps_per_execution`` (how many steps one call of the train function runs, so a budget
  stop never overshoots); the compiled-loss container's ``_conform_to_outputs``, ``_built``, ``_losses``,
  ``_loss_weights`` and ``_total_loss_mean`` (to rebuild the unreduced per-example loss and keep Keras's loss
  metric) and ``_user_losses`` (the loss as compiled); ``src.engine.compile_utils.match_dtype_and_rank`` and
  ``src.utils.losses_utils.{apply_mask, get_mask, squeeze_or_expand_dimensions}`` (Keras's own
  weighting of a loss, reused so a per-example loss weighs examples exactly as ``compile`` does). Keras 2
  lives in the ``keras`` package on TensorFlow 2.15 and in ``tf_keras`` on TensorFlow >= 2.16 (where
  ``keras`` is Keras 3): the same internals, under the package that ``tf.keras`` resolved to
  (``tfdpbnn._keras_version``). On Keras 3 the functions below that read Keras internals pass on to the
  Keras 3 adapter, which lists the Keras 3 private names it uses (``tfdpbnn._adapters.keras3``).
- TensorFlow: ``tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`` (whether the step
  being traced is compiled by XLA, which drops ``tf.debugging.Assert``); ``tensorflow.python.ops.
  resource_variable_ops.ResourceVariable`` (the plain eager variable that ``assign_now`` writes by one op).
- tensorflow-privacy: ``_was_dp_gradients_called`` on its vectorized Keras optimizers (set after our own
  DP gradient so its ``apply_gradients`` check passes); and the ``sys.skip_tf_privacy_import`` flag that its
  package ``__init__`` reads (``tensorflow_privacy_module``).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import weakref
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from tfdpbnn import _keras_version

_keras3: Any  # the Keras 3 adapter module, or None on Keras 2
if _keras_version.KERAS_MAJOR == 2:
    compile_utils = importlib.import_module(f"{_keras_version.KERAS_PACKAGE}.src.engine.compile_utils")
    losses_utils = importlib.import_module(f"{_keras_version.KERAS_PACKAGE}.src.utils.losses_utils")
    _keras3 = None
else:
    _keras3 = importlib.import_module("tfdpbnn._adapters.keras3")

#: tf.data classes that neither drop, add, repeat nor reorder the elements of their input dataset.
_ELEMENT_PRESERVING = ("_PrefetchDataset", "_OptionsDataset")


def element_preserving_input(dataset):
    """The input of ``dataset`` if ``dataset`` is a prefetch/with_options of it, else None."""
    if type(dataset).__name__ in _ELEMENT_PRESERVING:
        return getattr(dataset, "_input_dataset", None)
    return None


def attached_attribute(dataset, name):
    """The attribute ``name`` of ``dataset``, or of the dataset it was made from by prefetch/with_options.

    Follows ``element_preserving_input`` through up to 64 such wrappers; None if none has it.
    """
    for _ in range(64):
        if dataset is None:
            return None
        found = getattr(dataset, name, None)
        if found is not None:
            return found
        dataset = element_preserving_input(dataset)
    return None


def compiled_metrics_unbuilt(model) -> bool:
    """Whether ``model``'s compiled metrics still need a first update to be built (False on Keras 2).

    Keras 3's ``CompileMetrics`` is built by its first update, and its ``result()``, which ``fit`` calls at
    its end, fails before that.
    """
    if _keras3 is None:
        return False
    metrics = getattr(model, "_compile_metrics", None)
    return metrics is not None and not metrics.built


#: model -> its ``steps_per_execution`` when its ``fit`` began (``note_fit_steps_per_execution``).
_FIT_STEPS_PER_EXECUTION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_fit_steps_per_execution(model) -> None:
    """Keep ``model``'s ``steps_per_execution`` as its ``fit`` begins (Keras 2 may lower it per epoch)."""
    _FIT_STEPS_PER_EXECUTION[model] = steps_per_execution(model)


def train_step_needs_output(model) -> bool:
    """Whether ``model``'s train function fails on a step that returns no logs.

    Keras 3's TensorFlow trainer wraps every step's outputs in a ``tf.experimental.Optional``, which needs at
    least one tensor; Keras 2's needs one only when a call runs several steps (``steps_per_execution``, as
    ``fit`` began: Keras 2 sets it to the epoch's steps when an epoch has fewer, when the loop is traced).
    """
    configured = max(steps_per_execution(model), _FIT_STEPS_PER_EXECUTION.get(model, 1))
    return _keras3 is not None or configured > 1


def flatten_logs(model, logs):
    """``logs`` (a dict) as ``train_on_batch`` returns them without ``return_dict``.

    A list in the order of ``model``'s metrics, or the one value (Keras's ``flatten_metrics_in_order``).
    """
    if _keras3 is not None:
        return _keras3.flatten_logs(model, logs)
    training = importlib.import_module(f"{_keras_version.KERAS_PACKAGE}.src.engine.training")
    return training.flatten_metrics_in_order(logs, model.metrics_names)


def metric_objects(model) -> list:
    """The metric objects of ``model.metrics``, with containers opened.

    Keras 3 lists the compiled metrics as one ``CompileMetrics`` named ``compile_metrics``, whose ``metrics``
    are the metrics by name (``accuracy``); Keras 2 lists those directly.
    """
    out = []

    def walk(metrics):
        for metric in metrics:
            inner = getattr(metric, "metrics", None)
            if isinstance(inner, list | tuple) and inner and _keras3 is not None:
                walk(inner)
            else:
                out.append(metric)

    walk(model.metrics)
    return out


def sublayers(layer, recursive: bool = True) -> list:
    """The Keras layers inside ``layer`` (Keras's ``_flatten_layers``; much faster than ``submodules``)."""
    return list(layer._flatten_layers(include_self=False, recursive=recursive))


def symbolic_call_inputs(layer) -> list:
    """The inputs of each symbolic call of ``layer`` (Keras's ``_inbound_nodes``), oldest first."""
    return [getattr(node, "input_tensors", None) for node in getattr(layer, "_inbound_nodes", None) or ()]


def graph_calls(model) -> list | None:
    """``(layer, inputs)`` of every call in ``model``'s graph; None for a model without one (subclassed).

    A functional model or a ``Sequential`` with an ``Input`` (on Keras 3, the functional model it holds):
    Keras's ``_nodes_by_depth``, a node's ``layer`` (Keras 2) or ``operation`` (Keras 3).
    """
    graph = getattr(model, "_functional", None) or model
    if not getattr(graph, "_is_graph_network", True):
        return None
    by_depth = getattr(graph, "_nodes_by_depth", None)
    if not by_depth:
        return None
    return [(getattr(node, "layer", None) or getattr(node, "operation", None),
             getattr(node, "input_tensors", None)) for nodes in by_depth.values() for node in nodes]


def build_input_shape(layer):
    """The input shape ``layer`` was built with, or None if not built (or built from several inputs).

    Keras 2's ``_build_input_shape``; on Keras 3 the public ``get_build_config()``.
    """
    if _keras3 is not None:
        return (layer.get_build_config() or {}).get("input_shape")
    return getattr(layer, "_build_input_shape", None)


def created_non_trainable(layer) -> list | None:
    """On Keras 3, the variables ``layer`` itself created non-trainable (``Layer._non_trainable_variables``).

    Freezing a Keras 3 layer (``trainable = False``) marks its weights non-trainable too, so their flag no
    longer tells them from state. None on Keras 2, where it does.
    """
    if _keras3 is None:
        return None
    return list(layer._non_trainable_variables)


def weights(layer) -> list:
    """``layer.weights``, also for a tf-keras model not built yet (a ``Sequential`` with no ``Input``).

    Such a model raises on ``weights`` until its first call builds it; listed instead: what it created
    itself (``Layer._trainable_weights`` and ``_non_trainable_weights``) and its layers' weights so far.
    """
    try:
        return layer.weights
    except ValueError:
        if _keras3 is not None or getattr(layer, "built", True):
            raise
    seen, out = set(), []
    for v in [*layer._trainable_weights, *layer._non_trainable_weights,
              *(w for sub in sublayers(layer, recursive=False) for w in weights(sub))]:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def in_symbolic_call() -> bool:
    """Whether Keras is running a layer on symbolic inputs, only to infer its outputs' shapes.

    A functional model's construction, or a tf-keras ``Sequential`` with no ``Input`` rebuilt for a new
    input shape inside its call: Keras runs the layers' ``call`` in a scratch ``FuncGraph`` of its own,
    named ``<layer>_scratch_graph`` (tf-keras) or ``scratch_graph...`` (Keras 3).
    """
    return "scratch_graph" in getattr(tf.compat.v1.get_default_graph(), "name", "")


def exact_ema_swaps(callbacks) -> None:
    """Keras 3's ``SwapEMAWeights`` among ``callbacks`` swap exactly (``keras3.exact_ema_swaps``)."""
    if _keras3 is not None:
        _keras3.exact_ema_swaps(callbacks)


def steps_per_execution(model) -> int:
    """Steps run by one call of ``model``'s train function (Keras's ``steps_per_execution``), at least 1."""
    value = getattr(model, "_steps_per_execution", None)
    if _keras3 is not None:
        value = _keras3.steps_per_execution(model)
    if value is None:
        return 1
    if is_variable(value):  # Keras 2's variable: one fast read
        return max(1, int(read_numpy(value)))
    try:
        return max(1, int(value.numpy()))
    except AttributeError:
        return max(1, int(value))


def loss_container_parts(container, y_pred, y, sample_weight):
    """``(y_true, sample_weight, losses, loss_weights)`` of a built compiled-loss container, per output."""
    if _keras3 is not None:
        return _keras3.loss_container_parts(container, y_pred, y, sample_weight)
    y_true = container._conform_to_outputs(y_pred, y)
    sample_weight = container._conform_to_outputs(y_pred, sample_weight)
    if not container._built:
        container.build(y_pred)
    return y_true, sample_weight, container._losses, container._loss_weights


def fit_build_context(model):
    """A context for one ``model.fit`` call: on Keras 3 under a strategy, its build reads one replica's batch.

    Keras 3 builds a distributed model from the MEAN of the replicas' parts of the first batch, which fails
    when they differ in size (Poisson batches); ``tfdpbnn._adapters.keras3.build_from_one_replica``. Keras 2
    builds at tracing: nothing to do.
    """
    if _keras3 is not None:
        return _keras3.build_from_one_replica(model)
    return contextlib.nullcontext()


def step_logs(model, logs):
    """A DP train step's ``logs`` as the Keras in use reduces them across workers (Keras 3: ``step_logs``)."""
    if _keras3 is not None:
        return _keras3.step_logs(model, logs)
    return logs


def compiled_loss(model):
    """The compiled-loss container of ``model`` (``model.compile(loss=...)``), or None without a loss."""
    if _keras3 is not None:
        return _keras3.compiled_loss(model)
    return getattr(model, "compiled_loss", None)


def compiled_user_loss(model):
    """The loss ``model.compile`` was given, as the compiled-loss container holds it (None without a loss)."""
    if _keras3 is not None:
        return _keras3.compiled_user_loss(model)
    return getattr(getattr(model, "compiled_loss", None), "_user_losses", None)


def total_loss_metric(model):
    """Keras's running-mean ``loss`` metric of ``model``'s compiled loss, or None."""
    if _keras3 is not None:
        return _keras3.total_loss_metric(model)
    return getattr(getattr(model, "compiled_loss", None), "_total_loss_mean", None)


def weigh_like_keras(y_t, y_p, sw):
    """Keras's dtype/rank matching and masking of one output's ``(y_true, y_pred, sample_weight)``."""
    if _keras3 is not None:
        return _keras3.weigh_like_keras(y_t, y_p, sw)
    y_t, y_p, sw = compile_utils.match_dtype_and_rank(y_t, y_p, sw)
    sw = losses_utils.apply_mask(y_p, sw, losses_utils.get_mask(y_p))
    return y_t, y_p, sw


def squeeze_or_expand(values, sample_weight):
    """Keras's alignment of per-element loss values and sample weights: ``(values, sample_weight)``."""
    if _keras3 is not None:
        return _keras3.squeeze_or_expand(values, sample_weight)
    values, _, sample_weight = losses_utils.squeeze_or_expand_dimensions(values, None, sample_weight)
    return values, sample_weight


def submodules(model):
    """Every layer inside ``model``, recursively.

    On Keras 2 (a ``tf.Module``) the modules ``model.submodules`` gives, in its order (``_module_walk``); on
    Keras 3, whose layers are not ``tf.Module``s, ``Layer._flatten_layers`` without the model itself.
    """
    if isinstance(model, tf.Module):
        return _module_walk(model)
    found = getattr(model, "submodules", None)
    if found is not None:
        return found
    flatten = getattr(model, "_flatten_layers", None)
    return () if flatten is None else tuple(flatten(include_self=False, recursive=True))


#: Types ``tf.nest`` treats as leaves that ``_module_leaves`` passes without calling it.
_PLAIN_LEAVES = frozenset({bool, int, float, complex, str, bytes, type(None)})


def _module_leaves(value) -> list:
    """``tf.nest.flatten(value)``, with plain lists and tuples unpacked and plain scalars passed here."""
    kind = type(value)
    if kind in _PLAIN_LEAVES:
        return [value]
    if kind is list or kind is tuple:
        return [leaf for item in value for leaf in _module_leaves(item)]
    return tf.nest.flatten(value)


def _module_walk(root) -> tuple:
    """``root.submodules``: the same modules in the same order, several times faster.

    ``tf.Module``'s walk: every attribute not in ``_TF_MODULE_IGNORED_PROPERTIES``, by sorted name, flattened
    by ``tf.nest`` (here without a ``tf.nest`` call for plain scalars, lists and tuples); a module's own
    attributes before its submodules'; each object once. It runs before every DP ``fit``.
    """
    seen = {id(root)}
    found = []
    stack: list[int] = []

    def walk(module, recursive):
        below = []
        ignored = module._TF_MODULE_IGNORED_PROPERTIES
        attributes = vars(module)
        for key in sorted(attributes):
            if key in ignored:
                continue
            for leaf in _module_leaves(attributes[key]):
                if id(leaf) in seen:
                    continue
                seen.add(id(leaf))
                if isinstance(leaf, tf.Module):
                    found.append(leaf)
                    if recursive:
                        below.append(leaf)
        stack.append(id(module))
        for inner in below:
            walk(inner, id(inner) not in stack)
        stack.pop()

    walk(root, True)
    return tuple(found)


def tf_variables(variables):
    """``variables`` as ``tf.Variable``s (as a ``tf.GradientTape`` takes them with ``unconnected_gradients``).

    Keras 3 variables (``keras.Variable``) wrap a ``tf.Variable`` (their ``value`` on the TensorFlow
    backend), whose dtype the tape can read; Keras 2 variables are ``tf.Variable``s already.
    """
    if _keras3 is None:
        return variables
    return [_keras3.tf_variable(v) for v in variables]


def read_numpy(variable):
    """``variable.numpy()``, read by one ``ReadVariableOp`` when ``variable`` is a plain eager variable.

    The same value as ``variable.numpy()`` (the same op reads it), about four times faster eagerly (no
    tape, handle-data or tracing wrappers): the privacy record reads its ledger variables tens of times per
    ``fit``. A Keras 3 ``keras.Variable`` is read through the ``tf.Variable`` it holds; a distributed variable
    (or anything but a ``tf.Variable``) by its own ``numpy()``.
    """
    inner = _plain_eager(variable)
    if inner is not None:
        return tf.raw_ops.ReadVariableOp(resource=inner.handle, dtype=inner.dtype).numpy()
    return variable.numpy()


def assign_now(variable, value) -> None:
    """``variable.assign(value, read_value=False)``, by one ``AssignVariableOp`` for a plain eager variable.

    The same write as ``assign`` (the same op), about three times faster eagerly (no tape, handle-data or
    tracing wrappers): a run's start resets the noise key and the write watch's flags. Anything but a plain
    eager ``tf.Variable`` (a distributed one, a ``keras.Variable``, in a graph), or a value of another shape
    (than a variable's static shape, where it has one) or dtype kind, goes through ``assign`` with its checks.
    """
    if type(variable) is resource_variable_ops.ResourceVariable and tf.executing_eagerly():
        array = np.asarray(value)
        shape = variable.shape  # a variable made with no static shape takes any (as ``assign`` does)
        if (shape.rank is None or array.shape == tuple(shape)) and np.can_cast(
                array.dtype, variable.dtype.as_numpy_dtype, casting="same_kind"):
            tf.raw_ops.AssignVariableOp(resource=variable.handle,
                                        value=array.astype(variable.dtype.as_numpy_dtype, copy=False))
            return
    variable.assign(value, read_value=False)


def read_view(variable):
    """One fresh read of ``variable`` as a read-only numpy array, without ``numpy()``'s copy.

    The array views the read's buffer (``EagerTensor._numpy``): for a comparison or a hash made at once; copy
    it to keep it. A write to the variable afterwards gets a new buffer (TensorFlow copies a variable's
    buffer on write while a read holds it), but nothing here relies on that. Anything but a plain eager
    ``tf.Variable`` (or a Keras 3 variable holding one) is read by ``read_numpy``.
    """
    return read_tensor_and_view(variable)[1]


def read_tensor_and_view(variable):
    """``(tensor, view)``: one fresh read of ``variable`` as an eager tensor and ``read_view``'s array of it.

    Both hold the same bytes (the view is of the tensor's buffer for a plain eager ``tf.Variable``): a
    comparison of the view and a hash of the tensor see one read. Anything else is read by ``read_numpy``
    and the tensor made from that array.
    """
    inner = _plain_eager(variable)
    if inner is not None:
        return _with_view(tf.raw_ops.ReadVariableOp(resource=inner.handle, dtype=inner.dtype))
    array = read_numpy(variable)
    return tf.constant(array), array


def read_tensors_and_views(variables) -> list:
    """``read_tensor_and_view`` of each of ``variables``: the plain eager ones of a device in one operation.

    TensorFlow's ``_ReadVariablesOp`` reads many variables as a ``ReadVariableOp`` each would, the same
    values, but without the copy a ``ReadVariableOp`` makes of a variable that a sparse update has put in
    copy-on-read mode (whose later sparse updates then write the buffer in place): use the views at once,
    as a hash or a comparison does. TensorFlow keys an eager kernel by the shapes of the variables it
    reads, and ``tf.keras.utils.set_random_seed`` clears the kernels: a read of each variable then makes one
    kernel per shape anew (about 0.4 ms each on a 2-core machine), one read of all makes one (about
    0.5 ms). Where the operation fails (a TensorFlow without it, a device without its kernel), each
    variable is read alone, and the process does not try the operation again.
    """
    variables = list(variables)
    reads: list = [None] * len(variables)
    groups: dict = {}
    for i, variable in enumerate(variables):
        inner = _plain_eager(variable)
        if inner is None:
            reads[i] = read_tensor_and_view(variable)
        else:
            groups.setdefault(inner.device, []).append((i, inner))
    for group in groups.values():
        values = _read_together([inner for _, inner in group]) if len(group) > 1 else None
        if values is None:
            values = [tf.raw_ops.ReadVariableOp(resource=v.handle, dtype=v.dtype) for _, v in group]
        for (i, _), value in zip(group, values, strict=True):
            reads[i] = _with_view(value)
    return reads


#: ``[False]`` once ``_ReadVariablesOp`` failed in this process (``read_tensors_and_views``).
_batched_reads = [True]


def _read_together(inner) -> list | None:
    """One ``_ReadVariablesOp`` of the plain eager variables ``inner`` (one device); None where it fails."""
    if not _batched_reads[0]:
        return None
    from tensorflow.python.eager import context, execute

    try:
        dtypes = [v.dtype.as_datatype_enum for v in inner]
        return list(execute.execute(b"_ReadVariablesOp", len(inner), inputs=[v.handle for v in inner],
                                    attrs=("N", len(inner), "dtypes", dtypes), ctx=context.context()))
    except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
        _batched_reads[0] = False
        return None


def _plain_eager(variable):
    """The plain ``tf.Variable`` of ``variable`` (a Keras 3 one's), read eagerly; None for anything else."""
    inner = variable if _keras3 is None else _keras3.tf_variable(variable)
    if isinstance(inner, tf.Variable) and not isinstance(inner, tf.distribute.DistributedValues) \
            and tf.executing_eagerly():
        return inner
    return None


def _with_view(value):
    """``(value, view)``: an eager tensor and a read-only numpy view of its buffer (``read_view``)."""
    array = value._numpy() if hasattr(value, "_numpy") else value.numpy()
    if isinstance(array, np.ndarray):
        array = array.view()
        array.flags.writeable = False
    return value, array


def is_variable(value) -> bool:
    """Whether ``value`` is a variable: a ``tf.Variable``, or on Keras 3 also a ``keras.Variable``."""
    return isinstance(value, tf.Variable) or (_keras3 is not None and _keras3.is_keras_variable(value))


def own_trainable_weights(layer):
    """The trainable variables ``layer`` created itself, not its sublayers'.

    ``_trainable_weights`` on Keras 2, ``_trainable_variables`` on Keras 3.
    """
    own = getattr(layer, "_trainable_weights", None)
    return own if own is not None else layer._trainable_variables


def in_xla_context() -> bool:
    """Whether the graph being traced is compiled by XLA (``jit_compile=True``): XLA drops assertions."""
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def mark_dp_gradients_computed(optimizer) -> None:
    """Tell a tensorflow-privacy vectorized optimizer that the gradient it applies was privatized."""
    optimizer._was_dp_gradients_called = True


#: tensorflow-privacy's vectorized Keras optimizers (the base classes of tfdpbnn's DP optimizers).
VECTORIZED_OPTIMIZERS = "tensorflow_privacy.privacy.optimizers.dp_optimizer_keras_vectorized"


def tensorflow_privacy_module(name: str):
    """The tensorflow-privacy module ``name``, imported without tensorflow-privacy's estimator code.

    tensorflow-privacy 0.9.0's package ``__init__`` imports its TF1/estimator code
    (``tensorflow_privacy.v1``, ``tensorflow_estimator``), which fails to import on TensorFlow >= 2.16
    (the estimator was removed from TensorFlow; tensorflow-privacy issue "Cannot import tensorflow_privacy
    with TensorFlow 2.16"). Its ``__init__`` skips those imports when ``sys.skip_tf_privacy_import`` is set,
    so the flag is set only while the package is first imported, then removed. tfdpbnn uses only the
    vectorized Keras optimizers and the fast-clipping modules, which need none of it.
    """
    if "tensorflow_privacy" not in sys.modules:
        had_flag = hasattr(sys, "skip_tf_privacy_import")
        setattr(sys, "skip_tf_privacy_import", True)  # noqa: B010 - tensorflow-privacy's own flag on sys
        try:
            importlib.import_module("tensorflow_privacy")
        finally:
            if not had_flag:
                delattr(sys, "skip_tf_privacy_import")
    return importlib.import_module(name)


def _check_xla_context() -> None:
    found = []

    def probe():
        found.append(in_xla_context())
        return tf.constant(0)

    tf.function(probe, jit_compile=True)()
    if found != [True] or in_xla_context():
        raise RuntimeError("tfdpbnn: TensorFlow's control_flow_util.GraphOrParentsInXlaContext no longer "
                           f"finds a jit_compile function; update tfdpbnn/_private_api.py for tensorflow "
                           f"{tf.__version__}")


def check() -> None:
    """Raise ``RuntimeError`` naming the private name that the installed versions no longer provide."""
    _check_xla_context()
    if _keras3 is not None:
        _check_tf_data()
        _keras3.check()
        return
    _check_tf_data()
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    if tuple(build_input_shape(model.layers[0])) != (None, 1) or sublayers(model)[-1] is not model.layers[-1]:
        raise RuntimeError("tfdpbnn: Keras's Layer._build_input_shape changed; update "
                           f"tfdpbnn/_private_api.py for tensorflow {tf.__version__}")
    model.compile(loss="mse", steps_per_execution=3)
    if steps_per_execution(model) != 3:
        raise RuntimeError("tfdpbnn: Keras's Model._steps_per_execution changed; update "
                           f"tfdpbnn/_private_api.py for tensorflow {tf.__version__}")
    y_pred = tf.zeros([2, 1])
    try:
        parts = loss_container_parts(model.compiled_loss, y_pred, tf.zeros([2, 1]), None)
        weigh_like_keras(tf.zeros([2, 1]), y_pred, None)
        squeeze_or_expand(tf.zeros([2]), tf.ones([2]))
    except (AttributeError, TypeError) as err:
        raise RuntimeError(f"tfdpbnn: Keras's compiled-loss internals changed ({err}); update "
                           f"tfdpbnn/_private_api.py for tensorflow {tf.__version__}") from err
    if len(parts[2]) != 1 or total_loss_metric(model) is None or compiled_user_loss(model) != "mse":
        raise RuntimeError("tfdpbnn: Keras's LossesContainer no longer has _losses/_total_loss_mean/"
                           f"_user_losses; update tfdpbnn/_private_api.py for tensorflow {tf.__version__}")
    vectorized = tensorflow_privacy_module(VECTORIZED_OPTIMIZERS)

    with open(vectorized.__file__) as handle:
        source = handle.read()
    if "_was_dp_gradients_called" not in source:
        raise RuntimeError("tfdpbnn: tensorflow-privacy no longer uses _was_dp_gradients_called; update "
                           "tfdpbnn/_private_api.py")


def _check_tf_data() -> None:
    base = tf.data.Dataset.range(3)
    for made in (base.prefetch(1), base.with_options(tf.data.Options())):
        if element_preserving_input(made) is not base:
            raise RuntimeError(
                f"tfdpbnn: tf.data's {type(made).__name__} no longer exposes _input_dataset as "
                f"{_ELEMENT_PRESERVING}; update tfdpbnn/_private_api.py for tensorflow {tf.__version__}")
