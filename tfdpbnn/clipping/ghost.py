"""Fast per-example clipping: one forward pass, one backward pass to recorded taps, ghost norms, book-keeping.

During the engine's forward pass the ``call`` of every layer covered by a registered rule
(``tfdpbnn.clipping.registry``) is temporarily replaced by the rule's ``forward``, which runs the layer's own
``call`` and records its inputs and a "tap" (usually the pre-activation). One ``tape.gradient`` of
``sum_i L_i`` to all taps gives every example's output gradients (row ``i`` only depends on example ``i``).
Each rule turns them into per-example squared norms without per-example gradients (Goodfellow 2015; Li et
al. 2022 ghost clipping), and the clipped sum ``sum_i min(1, C/||g_i||) g_i`` by book-keeping (Bu et al.
2023): the output gradients are scaled by the clip factors and contracted with the inputs
(no second backward pass).
Derivations: docs/fast_clipping.md.
"""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.clipping.jacobian import _regularization_loss, clip_factors, scaled_factors, widest_sum
from tfdpbnn.clipping.registry import ClippingRule, rule_for, unsupported_reason_for
from tfdpbnn.clipping.result import ClippedGradients


class UnsupportedModelError(ValueError):
    """The ghost engine cannot handle this model; ``layers`` names the layers that need a rule."""

    def __init__(self, message: str, layers: list[str]):
        super().__init__(message)
        self.layers = layers


@dataclasses.dataclass
class _Entry:
    layer: tf.keras.layers.Layer
    rule: ClippingRule
    variables: list          # rule.variables(layer)
    wanted: list             # bool per variable: is it in var_list


@dataclasses.dataclass
class _Record:
    entry: _Entry
    taps: list
    context: object


def _walk(model):
    yield model
    yield from model._flatten_layers(include_self=False, recursive=True)


def plan(model, var_list) -> list[_Entry]:
    """The covered layers that own variables of ``var_list``; raises ``UnsupportedModelError`` otherwise."""
    wanted = {id(v) for v in var_list}
    covered = set()
    entries, problems, owners = [], [], {}
    for layer in _walk(model):
        for v in _private_api.own_trainable_weights(layer):
            owners.setdefault(id(v), layer)
        blocked = unsupported_reason_for(layer)
        if blocked is not None:
            problems.append(f"{layer.name} ({type(layer).__name__}: {blocked})")
        rule = rule_for(layer)
        if rule is None or not layer.built:
            continue
        variables = rule.variables(layer)
        flags = [id(v) in wanted for v in variables]
        if not any(flags):
            continue
        reason = rule.unsupported_reason(layer)
        if reason is not None:
            problems.append(f"{layer.name} ({type(layer).__name__}: {reason})")
            continue
        covered.update(id(v) for v in variables)
        entries.append(_Entry(layer, rule, variables, flags))
    uncovered = []
    for v in var_list:
        if id(v) in covered:
            continue
        owner = owners.get(id(v))
        label = f"{owner.name} ({type(owner).__name__})" if owner is not None else f"variable {v.name}"
        if label not in uncovered and not any(p.startswith(f"{owner.name} (") for p in problems if owner):
            uncovered.append(label)
    names = problems + uncovered
    if names:
        raise UnsupportedModelError(
            "no fast clipping rule for layer(s): " + ", ".join(names)
            + " (register one with tfdpbnn.clipping.register_rule)", names)
    return entries


@contextlib.contextmanager
def _recording(entries, records, problems, tape, outside):
    """Replace each covered layer's ``call`` by its rule's ``forward`` (restored on exit).

    ``outside``: a tape that records the variables read outside the covered layers' calls (it stops
    recording inside them).
    """
    saved = []
    for entry in entries:
        layer = entry.layer
        original = layer.call
        had_own = "call" in layer.__dict__

        def wrapped(inputs, *args, _entry=entry, _original=original, **kwargs):
            if _private_api.in_symbolic_call():  # a shape inference of Keras's, not part of the pass
                return _original(inputs, *args, **kwargs)
            reason = _entry.rule.call_unsupported_reason(_entry.layer, inputs, *args, **kwargs)
            if reason is not None:
                problems.append(f"{_entry.layer.name} ({type(_entry.layer).__name__}: {reason})")
                return _original(inputs, *args, **kwargs)
            with outside.stop_recording():
                outputs, taps, context = _entry.rule.forward(_entry.layer, _original, inputs, *args, **kwargs)
            for t in taps:
                tape.watch(t)
            records.append(_Record(_entry, list(taps), context))
            return outputs

        saved.append((layer, had_own, layer.__dict__.get("call")))
        object.__setattr__(layer, "call", wrapped)
    try:
        yield
    finally:
        for layer, had_own, own in saved:
            if had_own:
                object.__setattr__(layer, "call", own)
            else:
                object.__delattr__(layer, "call")


def _one_row_per_example(squared, per_example_loss, layer):
    """``squared`` (a layer's per-row squared norms), refused unless it has one row per example.

    The rules read a layer's input row by row as the batch's examples. A layer called on a tensor whose
    first axis merges the batch with another (Keras 2's ``TimeDistributed``, a reshape of ``[B, T, D]`` to
    ``[B * T, D]`` before a ``Dense``, two views concatenated along the batch axis) has several rows per
    example: each would be clipped to C alone, and one example could move the clipped sum by T * C.
    Rows known to differ at the trace: ``UnsupportedModelError`` (the jacobian path, which clips each
    example's whole gradient). Rows not known then: checked at every step, where a mismatch fails the step
    (an assertion naming the layer, and a reshape to the examples' count that fails under XLA too).
    """
    rows, examples = squared.shape[:1], per_example_loss.shape[:1]
    if rows.rank and examples.rank and rows[0] is not None and examples[0] is not None:
        if rows[0] != examples[0]:
            raise UnsupportedModelError(
                f"layer {layer.name} is called on {rows[0]} rows for {examples[0]} examples (its input's "
                "first axis merges the batch with another), so its rows are not the examples", [layer.name])
        return squared
    if not _private_api.in_xla_context():
        check = tf.debugging.assert_equal(
            tf.shape(squared)[0], tf.shape(per_example_loss)[0],
            message=f"layer {layer.name}: called on a tensor whose first axis is not the batch's (several "
                    "rows per example: TimeDistributed on Keras 2, a reshape merging the batch with another "
                    "axis, views concatenated along the batch): the ghost engine would clip each row alone. "
                    "Use clipping_method='jacobian' on the DP optimizer")
        with tf.control_dependencies([check]):
            squared = tf.identity(squared)
    return tf.reshape(squared, tf.shape(per_example_loss))


def _refuse_variables_read_elsewhere(entries, outside) -> None:
    """Refuse a covered variable that the forward pass also reads outside its layer's call.

    A rule reads its layer's per-example gradients at the layer's taps, so a weight that another layer (or
    the model's own ``call``) reads too, a kernel tied to an output projection, would have the gradient of
    that other use left out of both its per-example norm and the clipped sum: the step would train on part
    of the gradient. The jacobian path differentiates every use.
    """
    read = {id(v) for v in outside.watched_variables()}
    names = []
    for entry in entries:
        variables = [v for v, flag in zip(entry.variables, entry.wanted, strict=True) if flag]
        if any(id(v) in read for v in _private_api.tf_variables(variables)) and entry.layer.name not in names:
            names.append(entry.layer.name)
    if names:
        raise UnsupportedModelError(
            "weights of layer(s) " + ", ".join(names) + " are also read outside those layers' calls (tied "
            "weights), whose gradient the layers' rules do not see", names)


def ghost_clipped_gradients(model, x, y, sample_weight, per_example_loss_fn, l2_norm_clip, var_list,
                            training=True, entries=None, sum_scale=None) -> ClippedGradients:
    """The ``ClippedGradients`` of ``clipped_gradients`` by ghost norms and book-keeping.

    ``sum_scale`` (optional scalar) multiplies the clipped sum; it is folded into the clip factors, so it
    costs nothing (``clipped_gradients``).

    Raises ``UnsupportedModelError`` if a variable of ``var_list`` has no rule or a covered layer runs more
    than once in the forward pass (shared layers).
    """
    if entries is None:
        entries = plan(model, var_list)
    records: list[_Record] = []
    problems: list[str] = []
    with tf.GradientTape(persistent=True) as tape:
        with tf.GradientTape() as outside, _recording(entries, records, problems, tape, outside):
            y_pred = model(x, training=training)
        per_example_loss = per_example_loss_fn(y, y_pred, sample_weight)
        regularization_loss = _regularization_loss(model)
        total = tf.reduce_sum(per_example_loss)
    if problems:
        raise UnsupportedModelError("no fast clipping rule for this call of layer(s): " + ", ".join(problems),
                                    problems)
    _refuse_variables_read_elsewhere(entries, outside)
    seen = {}
    for r in records:
        seen[id(r.entry.layer)] = seen.get(id(r.entry.layer), 0) + 1
    shared = [r.entry.layer.name for r in records if seen[id(r.entry.layer)] > 1]
    if shared:
        names = sorted(set(shared))
        raise UnsupportedModelError(
            "layer(s) called more than once per forward pass (shared weights): " + ", ".join(names), names)
    taps = [t for r in records for t in r.taps]
    tap_grads = tape.gradient(total, taps, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    if model.losses:
        regularization_grads = tape.gradient(
            regularization_loss, _private_api.tf_variables(var_list),
            unconnected_gradients=tf.UnconnectedGradients.ZERO)
    else:
        regularization_grads = [tf.zeros_like(v) for v in var_list]
    del tape

    grads_per_record, k = [], 0
    for r in records:
        grads_per_record.append(tap_grads[k:k + len(r.taps)])
        k += len(r.taps)
    squared = []
    for r, grads in zip(records, grads_per_record, strict=True):
        for flag, sq in zip(r.entry.wanted, r.entry.rule.squared_norms(r.entry.layer, r.context, grads),
                            strict=True):
            if flag and sq is not None:
                squared.append(_one_row_per_example(sq, per_example_loss, r.entry.layer))
    norms = tf.sqrt(widest_sum(squared)) if squared else tf.zeros_like(per_example_loss)
    factors = scaled_factors(clip_factors(norms, l2_norm_clip), sum_scale)
    sums = {}
    for r, grads in zip(records, grads_per_record, strict=True):
        # A model mixing float32 and float64 layers: each layer's sums in its own dtype.
        dtypes = [g.dtype for g in grads if g is not None and g.dtype.is_floating]
        own = tf.cast(factors, dtypes[0]) if dtypes else factors
        results = r.entry.rule.clipped_sums(r.entry.layer, r.context, grads, own)
        for v, flag, s in zip(r.entry.variables, r.entry.wanted, results, strict=True):
            if flag and s is not None:
                sums[id(v)] = tf.reshape(tf.cast(s, v.dtype), v.shape)
    clipped_sum = [sums[id(v)] if id(v) in sums else tf.zeros_like(v) for v in var_list]
    return ClippedGradients(
        clipped_sum=clipped_sum,
        regularization_grads=regularization_grads,
        per_example_loss=per_example_loss,
        per_example_norms=norms,
        regularization_loss=regularization_loss,
        y_pred=y_pred,
    )
