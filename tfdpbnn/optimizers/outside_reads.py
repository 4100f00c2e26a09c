"""The variables a model's forward pass, ``model.losses`` and loss read that are not the model's own.

The per-example check (``fit_checks.check_per_example``) runs the model as it is when the check runs. A
variable the model reads but does not own (a global ``tf.Variable`` in a ``Lambda``, trainable or not) is
part of what the step computes: set to another value, it can make the same code mix examples (``x - alpha *
mean(x)`` with ``alpha`` set from 0 to 1), or carry a statistic of the data into every step. So the optimizer
keeps each such variable with its value at the check, checks the model again when a value has changed by
the next run's start, and refuses a change during a run (``DPTrainingMonitor`` in ``fit``, the write
check's constants in a custom loop and between ``train_on_batch`` calls).

The reads are listed by tracing the forward pass, ``model.losses`` and the loss once as a
``tf.function`` (a graph notes every variable read while it is built, trainable or not; an eager gradient
tape notes trainable ones only). A ``tf.random.Generator``'s state, which only the generator's own draws
read and advance (data-independent), is listed apart and not compared: it changes at every draw.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.optimizers import state_checks

#: Operations that read and advance a ``tf.random.Generator``'s state, and nothing else.
_RANDOM_STATE_OPS = frozenset({
    "RngReadAndSkip", "RngSkip", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
    "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulTruncatedNormal",
    "StatefulRandomBinomial",
})


@dataclasses.dataclass(frozen=True)
class OutsideReads:
    """What a model reads outside its own variables.

    ``variables``: compared by the optimizer (a constant of the model during a run). ``random_state``: the
    states of random generators, read by their draws only. ``complete``: False when the pass could not be
    traced (a model whose layers run only eagerly): ``variables`` then holds the trainable ones an eager
    gradient tape saw, and non-trainable reads are not known.
    """

    variables: tuple = ()
    random_state: tuple = ()
    complete: bool = True


def own_variables(model) -> set:
    """``id``s of ``model``'s variables and its metrics' (a Keras 3 variable counts with what it wraps).

    Metric objects (``add_metric``, a layer's own ``Mean``) are updated by the forward pass at every step;
    what they hold of the private batches is ``release_training_metrics``' business.
    """
    metrics = [v for metric in _private_api.metric_objects(model) for v in metric.variables]
    return {id(w) for v in [*model.variables, *metrics] for w in (v, getattr(v, "_value", None))
            if w is not None}


def _outside(model, read) -> list:
    own = own_variables(model)
    return [v for v in read if id(v) not in own and not isinstance(v, tf.distribute.DistributedValues)]


def _random_state_only(graph, variables) -> set:
    """``id``s of ``variables`` whose handle, in ``graph``, feeds only a random generator's operations."""
    inner = {id(outer): placeholder for outer, placeholder in graph.captures}
    found = set()
    for v in variables:
        placeholder = inner.get(id(getattr(v, "handle", None)))
        consumers = [] if placeholder is None else placeholder.consumers()
        if consumers and all(op.type in _RANDOM_STATE_OPS for op in consumers):
            found.add(id(v))
    return found


def traced_reads(model, loss_fn, xs, ys) -> OutsideReads | None:
    """The variables ``model(xs, training=True)``, ``model.losses`` and ``loss_fn`` read outside the model.

    ``xs``, ``ys``: a synthetic batch (``ys`` may be None, ``loss_fn`` too). Traced once as a
    ``tf.function`` (nothing runs). Returns None when the pass cannot be traced.
    """
    def step(x, y):
        y_pred = model(x, training=True)
        terms = [tf.convert_to_tensor(r) for r in model.losses]
        if y is not None and loss_fn is not None:
            terms.append(tf.convert_to_tensor(loss_fn(y, y_pred, None)))
        return y_pred, terms

    try:
        graph = tf.function(step).get_concrete_function(xs, ys).graph
    except Exception:  # noqa: BLE001 - a model that runs only eagerly (numpy in a layer's call)
        return None
    outside = _outside(model, graph.variables)
    random_state = _random_state_only(graph, outside)
    return OutsideReads(variables=tuple(v for v in outside if id(v) not in random_state),
                        random_state=tuple(v for v in outside if id(v) in random_state))


def eager_reads(model, tape_variables) -> OutsideReads:
    """The fallback when the pass cannot be traced: the trainable variables outside the model a tape saw."""
    return OutsideReads(variables=tuple(_outside(model, tape_variables)), complete=False)


def values(variables) -> list:
    """``(variable, a copy of its value)`` for each of ``variables``."""
    return [(v, np.array(_private_api.read_numpy(v), copy=True)) for v in variables]


def changed(pairs) -> list:
    """The variables of ``(variable, value)`` pairs whose value now differs from the one kept (every bit)."""
    return [v for v, before in pairs
            if not state_checks.same_value(np.asarray(_private_api.read_numpy(v)), before)]


__all__ = ["OutsideReads", "changed", "eager_reads", "own_variables", "traced_reads", "values"]
