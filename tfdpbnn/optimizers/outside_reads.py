"""The variables whose values a model's outputs, ``model.losses`` and loss depend on, outside the model.

The per-example check (``fit_checks.check_per_example``) runs the model as it is when the check runs. A
variable the model reads but does not own (a global ``tf.Variable`` in a ``Lambda``, trainable or not, a
metric object's result used in ``call``) is part of what the step computes: set to another value, it can
make the same code mix examples (``x - alpha * mean(x)`` with ``alpha`` set from 0 to 1), or carry a
statistic of the data into every step. So the optimizer keeps each such variable with its value at the
check, checks the model again when a value has changed by the next run's start, and refuses a change during
a run (``fit``: before every batch, after every callback; a custom loop: inside every step; between
``train_on_batch`` calls), unless the user asserted that its values are set without private data
(``DPOptimizerMixin.assert_public_variable``), where a new value is checked before a step uses it.

The reads are found by tracing the forward pass, ``model.losses``, the loss and the losses' gradients once
as a ``tf.function`` (a graph notes every variable read while it is built, trainable or not; an eager
gradient tape notes trainable ones only), and kept when the outputs depend on the value read: the graph is
walked back from its outputs through every input of every operation (a nested function's call too) and,
from a variable reached, through what any operation writes into it. A variable reached only through the
key, counter, algorithm or seed inputs of stateless random draws is kept unless the pass writes it: a
random generator's state (a ``tf.random.Generator``'s, a Keras 3 ``SeedGenerator``'s), which its draws
advance at every step, is not kept; a variable fed to a draw's seed as a gate is. A variable only updated
(an ``add_metric``'s accumulators) is not kept. A model whose outputs depend on a resource that no variable
of the graph names (a lookup table) is checked again at every run's start instead.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.optimizers import state_checks

#: Inputs of stateless random operations through which only the draws' randomness flows.
_RANDOMNESS_INPUTS = frozenset({"seed", "key", "counter", "alg"})


@dataclasses.dataclass(frozen=True)
class OutsideReads:
    """What a model reads outside its own variables.

    ``variables``: those the outputs depend on, compared by the optimizer (constants of the model during a
    run). ``others``: read but not for the outputs, or only through random draws (a generator's state, an
    ``add_metric``'s accumulators). ``complete``: False when the pass could not be traced (a model whose
    layers run only eagerly: ``variables`` then holds the trainable ones an eager gradient tape saw), or
    when the outputs depend on a resource no variable names (a lookup table, a variable read by raw
    operations or in a nested function's gradient): what it holds is not kept, and the optimizer checks
    such a model again at every run's start.
    """

    variables: tuple = ()
    others: tuple = ()
    complete: bool = True


def own_variables(model) -> set:
    """``id``s of ``model``'s variables (a Keras 3 one with what it wraps, a mirrored one with its parts)."""
    own = set()
    for v in model.variables:
        for w in (v, getattr(v, "_value", None)):
            if isinstance(w, tf.distribute.DistributedValues):
                own |= {id(c) for c in w.values}
            if w is not None:
                own.add(id(w))
    return own


def _outside(model, read) -> list:
    own = own_variables(model)
    return [v for v in read if id(v) not in own and not isinstance(v, tf.distribute.DistributedValues)]


def _randomness_input(op, index: int) -> bool:
    """Whether input ``index`` of ``op`` only seeds a stateless random draw (its key, counter, seed)."""
    if not op.type.startswith("Stateless"):
        return False
    names = [arg.name for arg in op.op_def.input_arg]
    return index < len(names) and names[index] in _RANDOMNESS_INPUTS


#: Operations that only read a resource (anything else consuming a resource handle may write it).
_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
                    "VarIsInitializedOp"})


def _writes(handle) -> bool:
    """Whether an operation of the graph may write the resource ``handle`` (an assign, a draw's advance)."""
    return any(op.type not in _READS for op in handle.consumers())


def _reached(graph, through_randomness: bool) -> set:
    """``id``s of the tensors of ``graph`` that its outputs depend on, walked back from them.

    Through every input of every operation, and, from a resource that is reached, through the inputs of
    every operation that consumes it (what is written into a variable reaches what reads it later:
    ``v.assign(alpha)`` then ``v.read_value()``); ``through_randomness=False``: not through the key,
    counter, algorithm and seed inputs of stateless random operations.
    """
    seen, stack = set(), [t for t in graph.outputs if t is not None]
    while stack:
        tensor = stack.pop()
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        op = tensor.op
        for index, source in enumerate(op.inputs):
            if id(source) not in seen and (through_randomness or not _randomness_input(op, index)):
                stack.append(source)
        if tensor.dtype == tf.resource:
            for consumer in tensor.consumers():
                if consumer is not op:
                    stack.extend(source for source in consumer.inputs if id(source) not in seen)
    return seen


def traced_reads(model, loss_fn, xs, ys) -> OutsideReads | None:
    """The variables ``model(xs, training=True)``, ``model.losses`` and ``loss_fn`` read outside the model.

    ``xs``, ``ys``: a synthetic batch (``ys`` may be None, ``loss_fn`` too). Traced once as a
    ``tf.function`` (nothing runs), with the gradients of the losses (of the outputs where there is none)
    with respect to the trainable variables: what the DP step clips (a ``tf.custom_gradient`` may read a
    variable in its gradient alone); without them where they cannot be traced. Returns None when the pass
    cannot be traced.
    """
    def step(x, y, backward):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            terms = [tf.convert_to_tensor(r) for r in model.losses]
            if y is not None and loss_fn is not None:
                terms.append(tf.convert_to_tensor(loss_fn(y, y_pred, None)))
            # What the DP step differentiates: the losses (the outputs where there is no loss).
            flat = [tf.reduce_sum(tf.cast(t, tf.float32)) for t in terms or tf.nest.flatten(y_pred)
                    if t.dtype.is_floating]
        if not backward or not flat:
            return y_pred, terms
        # The gradients too: a tf.custom_gradient's gradient function may read what the forward pass does not.
        gradients = tape.gradient(tf.add_n(flat), _private_api.tf_variables(model.trainable_variables),
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return y_pred, terms, gradients

    graph = None
    for backward in (True, False):  # without the gradients where they cannot be traced (an op without one)
        try:
            traced = tf.function(functools.partial(step, backward=backward))
            graph = traced.get_concrete_function(xs, ys).graph
            break
        except Exception:  # noqa: BLE001, S112 - a model that runs only eagerly (numpy in a layer's call)
            continue
    if graph is None:
        return None
    outside = _outside(model, graph.variables)
    inner = {id(outer): placeholder for outer, placeholder in graph.captures}
    held = {id(v): inner[id(v.handle)] for v in outside if id(getattr(v, "handle", None)) in inner}
    # Kept: what the outputs read other than through random draws' seeds, and what they read through a seed
    # alone but nothing in the pass writes (a gate variable fed to a seed); not a generator's state, which
    # its draws advance (the draws are random: a mixing they gate is the random draws' limit, not this one).
    direct, through_seeds = _reached(graph, False), _reached(graph, True)
    kept = {key for key, handle in held.items()
            if id(handle) in direct or (id(handle) in through_seeds and not _writes(handle))}
    reached = through_seeds
    # A resource the outputs depend on that no variable of the graph names: a lookup table, a variable read by
    # raw operations on its handle or inside a nested function's gradient. Its value cannot be kept.
    named = {id(getattr(v, "handle", None)) for v in graph.variables}
    unnamed = any(outer.dtype == tf.resource and id(outer) not in named and id(placeholder) in reached
                  for outer, placeholder in graph.captures)
    return OutsideReads(variables=tuple(v for v in outside if id(v) in kept),
                        others=tuple(v for v in outside if id(v) not in kept), complete=not unnamed)


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
