"""Checks run before DP training starts: what the input's sampling is, and that examples stay separate.

``input_sampling`` decides, from what ``model.fit`` is really given, how the steps about to run are
accounted, and refuses what cannot be accounted (a wrong ``num_examples``, a pipeline whose sampling is
unknown, a sample rate other than the optimizer's). ``check_per_example`` proves on a synthetic batch (no
private data) that one example's loss depends on no other example, so per-example clipping bounds the
sensitivity by C (Abadi et al. 2016): the model's outputs, its ``model.losses`` and the compiled loss are
differentiated across examples and every cross-example derivative must vanish. ``check_compute_dtype``
refuses a mixed-precision dtype policy.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn.data.sampling import find_spec
from tfdpbnn.optimizers import outside_reads

#: Relative size above which a cross-example derivative counts as coupling (exact zeros are expected).
COUPLING_TOLERANCE = 1e-6


def _num_rows(x) -> int | None:
    flat = tf.nest.flatten(x)
    if not flat:
        return None
    first = flat[0]
    shape = getattr(first, "shape", None)
    if shape is None or len(shape) == 0 or shape[0] is None:
        return None
    return int(shape[0])


def input_sampling(optimizer, x, batch_size=None, validation_split=0.0) -> dict:
    """How the coming steps are accounted: ``{"kind", "source", "sample_rate", "num_examples"}``.

    Raises ``ValueError`` for input whose sampling the optimizer's accounting cannot cover.
    """
    n = optimizer.num_examples
    if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        spec = find_spec(x)
        if spec is None:
            raise ValueError(
                "x: tfdpbnn cannot see how this tf.data pipeline draws its batches (it was not made by "
                "tfdpbnn.data.poisson_batches, or a transformation other than prefetch/with_options was "
                "applied after it), so no epsilon can be computed for it. Use "
                "tfdpbnn.data.poisson_batches(x, y, sample_rate=...) (add .prefetch inside or after it), "
                "pass arrays to model.fit, or assert the sampling yourself with "
                "tfdpbnn.data.assert_sampling(dataset, sampling='shuffle' or 'poisson', num_examples=n, "
                "...): the privacy statement then says it is asserted by the user.")
        if spec.num_examples != n:
            raise ValueError(
                f"num_examples: the optimizer accounts for num_examples={n}, but the data's batches are "
                f"drawn from {spec.num_examples} examples; make them equal")
        if spec.kind != optimizer.sampling:
            raise ValueError(
                f"sampling: the optimizer accounts for sampling={optimizer.sampling!r}, but the data's "
                f"batches are {spec.kind!r} ({spec.describe()}); build the optimizer with "
                f"sampling={spec.kind!r} or feed matching batches")
        if spec.kind == "poisson" and not math.isclose(spec.sample_rate, optimizer.sample_rate,
                                                       rel_tol=1e-9):
            raise ValueError(
                f"sample_rate: batches were Poisson-sampled at rate {spec.sample_rate} but the optimizer "
                f"accounts for sample rate {optimizer.sample_rate} (batch_size / num_examples); make them "
                "equal")
        source = "fixed_seed" if spec.fixed_seed else spec.source
        return {"kind": spec.kind, "source": source, "sample_rate": spec.sample_rate, "num_examples": n}
    if x is None or isinstance(x, tf.keras.utils.Sequence) or _num_rows(x) is None:
        raise ValueError(
            f"x: DP training needs arrays or a tf.data.Dataset whose sampling tfdpbnn knows; got "
            f"{type(x).__name__}. Convert a generator or Sequence to tf.data and assert its sampling with "
            "tfdpbnn.data.assert_sampling(...).")
    if optimizer.sampling == "poisson":
        raise ValueError(
            "x: the optimizer was built with sampling='poisson', but model.fit on arrays draws shuffled "
            "fixed-size batches; pass tfdpbnn.data.poisson_batches(x, y, sample_rate=...) or build the "
            "optimizer with sampling='shuffle'")
    rows = _num_rows(x)
    train_rows = int(math.floor(rows * (1.0 - float(validation_split or 0.0))))
    if train_rows != n:
        detail = (f" ({rows} rows, of which model.fit keeps {train_rows} for training after "
                  f"validation_split={validation_split})" if validation_split else "")
        raise ValueError(
            f"num_examples: the optimizer accounts for num_examples={n}, but model.fit trains on "
            f"{train_rows} examples{detail}; make them equal")
    fit_batch = 32 if batch_size is None else int(batch_size)
    if fit_batch > optimizer.batch_size:
        raise ValueError(
            f"batch_size: model.fit uses batches of {fit_batch} but the optimizer divides the noised sum by "
            f"batch_size={optimizer.batch_size}; pass the same batch_size to both")
    return {"kind": "shuffle", "source": "keras_arrays", "sample_rate": None, "num_examples": n}


def _values(dtype, shape, rng: np.random.Generator):
    """Synthetic values of ``dtype``: Gaussian floats, zero integers, False, the string "a"."""
    if dtype.is_floating:
        return tf.constant(rng.normal(size=shape), dtype=dtype)
    if dtype.is_integer or dtype.is_bool:
        return tf.zeros(shape, dtype=dtype)
    if dtype == tf.string:
        return tf.fill(shape, "a")
    raise ValueError(f"x: cannot build a synthetic batch of dtype {dtype.name} to check per-example "
                     "independence; feed float, integer, boolean or string inputs")


def _synthetic(spec_like, rows: int, rng: np.random.Generator):
    """A batch of ``rows`` synthetic values shaped and typed like ``spec_like`` (arrays or TensorSpecs).

    A ragged input (``tf.RaggedTensor`` or ``tf.RaggedTensorSpec`` of ragged rank 1) gets rows of lengths
    1, 2, 3, ...; a sparse input, a ragged rank above 1 or an unknown type is refused, naming it.
    """

    def make(t):
        if isinstance(t, tf.SparseTensor | tf.SparseTensorSpec):
            raise ValueError("x: sparse inputs (tf.SparseTensor) cannot be checked for per-example "
                             "independence by tfdpbnn; feed dense or ragged tensors")
        dtype = tf.as_dtype(t.dtype)
        if isinstance(t, tf.RaggedTensor | tf.RaggedTensorSpec):
            if t.ragged_rank != 1:
                raise ValueError(f"x: ragged inputs of ragged rank {t.ragged_rank} cannot be checked for "
                                 "per-example independence; feed ragged rank 1 (tf.RaggedTensor of shape "
                                 "[batch, None, ...])")
            inner = list(t.shape)[2:]
            if any(s is None for s in inner):
                raise ValueError("x: every dimension after the ragged one must be known to check "
                                 f"per-example independence, got shape {t.shape}")
            lengths = [1 + i % 3 for i in range(rows)]
            flat = _values(dtype, [sum(lengths)] + inner, rng)
            return tf.RaggedTensor.from_row_lengths(flat, lengths, validate=False)
        if not hasattr(t, "shape") or not hasattr(t, "dtype"):
            raise ValueError(f"x: an input of type {type(t).__name__} cannot be checked for per-example "
                             "independence; feed arrays, tensors, ragged tensors, or dicts/lists of them")
        shape = list(t.shape)[1:]
        if any(s is None for s in shape):
            raise ValueError(f"x: every non-batch dimension must be known to check per-example "
                             f"independence, got shape {t.shape}")
        return _values(dtype, [rows] + shape, rng)

    return tf.nest.map_structure(make, spec_like)


def _leaves(xs, half: int):
    """Every input's value tensor and the row from which it belongs to the batch's second half."""
    out = []
    for t in tf.nest.flatten(xs):
        if isinstance(t, tf.RaggedTensor):
            out.append((t.flat_values, int(t.row_splits[half])))
        else:
            out.append((t, half))
    return out


def carries_sample_weights(x) -> bool:
    """Whether ``fit``'s ``x`` is a dataset whose elements carry sample weights (``(x, y, weights)``)."""
    if not isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        return False
    spec = getattr(x, "_tfdpbnn_element_spec", None) or x.element_spec
    return isinstance(spec, tuple) and len(spec) > 2


def element_parts(x, y):
    """``(inputs, labels)`` of ``fit``'s ``x`` and ``y``: arrays as given, or a dataset's element specs."""
    if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        # A distributed dataset's element_spec is per replica; tfdpbnn.data.distributed's carry one replica's.
        spec = getattr(x, "_tfdpbnn_element_spec", None) or x.element_spec
        if isinstance(spec, tuple):
            return spec[0], (spec[1] if len(spec) > 1 else None)
        return spec, None
    return x, y


def element_specs(x, y) -> tuple:
    """``element_parts(x, y)`` as type specs: the dtypes and shapes the checks build synthetic batches from.

    Arrays and tensors (symbolic ones too) become ``tf.TensorSpec``s, ragged and sparse ones their specs;
    a dataset's specs and ``None`` stay. The values are not kept.
    """

    def spec(t):
        if t is None or isinstance(t, tf.TypeSpec):
            return t
        if isinstance(t, tf.RaggedTensor | tf.SparseTensor):
            return tf.type_spec_from_value(t)
        if hasattr(t, "shape") and hasattr(t, "dtype"):
            return tf.TensorSpec(t.shape, tf.as_dtype(t.dtype))
        return t  # what the checks refuse, naming it (``_synthetic``)

    return tuple(None if part is None else tf.nest.map_structure(spec, part) for part in element_parts(x, y))


def _host_values(t) -> np.ndarray:
    """The values of a tensor on the host (a ragged tensor's flat values, an ``IndexedSlices``' values)."""
    if isinstance(t, tf.RaggedTensor):
        t = t.flat_values
    if isinstance(t, tf.IndexedSlices):
        t = t.values
    return np.asarray(t)


def _max_abs(tensors) -> float:
    """The largest absolute value over ``tensors`` (numpy on the host: the checks' values are small)."""
    values = []
    for t in tf.nest.flatten(tensors):
        if t is None:
            continue
        a = _host_values(t)
        values.append(float(np.max(np.abs(a))) if a.size else -math.inf)
    return max(values) if values else 0.0


def _embedding_names(model) -> list[str]:
    """Names of the ``Embedding`` layers of ``model`` (nested ones included)."""
    return [layer.name for layer in _private_api.submodules(model)
            if isinstance(layer, tf.keras.layers.Embedding)]


def _call_synthetic(model, xs, float_inputs):
    """``model(xs, training=True)``; float inputs that reach an ``Embedding`` get a ``ValueError`` saying so.

    An ``Embedding`` casts float ids to integers; the synthetic Gaussian floats of the check then become
    out-of-range ids and TensorFlow raises a bare ``InvalidArgumentError`` from the gather. Float ids are
    refused with the fix instead: the check needs float inputs to be features it can differentiate.
    """
    try:
        return model(xs, training=True)
    except tf.errors.InvalidArgumentError as err:
        embeddings = _embedding_names(model)
        if embeddings and float_inputs:
            dtypes = sorted({t.dtype.name for t in float_inputs})
            raise ValueError(
                f"x: the model's Embedding layer(s) {embeddings} are fed {'/'.join(dtypes)} ids; feed "
                "token ids as integers (e.g. x.astype('int32'), tf.cast(x, tf.int32), and "
                "tf.keras.Input(shape, dtype='int32')). tfdpbnn's pre-fit check treats float inputs as "
                "features and differentiates through them, which float ids do not allow.") from err
        raise


def check_per_example(model, per_example_loss_fn, x, y=None, rows: int = 6, seed: int = 0,
                      list_reads: bool = True) -> outside_reads.OutsideReads | None:
    """Raise ``ValueError`` if one example's loss can depend on another example of the batch.

    On a synthetic batch (Gaussian floats, zero integers, constant strings: no private data is read), with
    ``training=True``: the outputs of the first half of the batch, ``model.losses`` and the compiled
    per-example loss of the first half must have zero derivative with respect to the other half's float
    inputs and predictions, and the compiled loss must return one value per example. Integer, boolean and
    string inputs have no derivative: changing the second half of them must move neither the first half's
    outputs nor ``model.losses`` (``_check_discrete_inputs``).

    Returns ``outside_reads.OutsideReads``: the variables the forward pass, ``model.losses`` and the loss
    read that are not ``model``'s own (a global ``tf.Variable`` in a ``Lambda``, trainable or not), listed
    by tracing them once (``outside_reads.traced_reads``). The DP step does not train them and the check's
    outcome holds for their values now, so the optimizer checks the model again when one has changed by a
    run's start and refuses a change during a run (under a ``tf.distribute`` strategy too: a mirrored
    variable of the model's counts with its components). ``list_reads=False``: not listed, None returned.
    """
    x_like, y_like = element_parts(x, y)
    rng = np.random.default_rng(seed)
    xs = _synthetic(x_like, rows, rng)
    ys = None if y_like is None else _synthetic(y_like, rows, rng)
    half = rows // 2
    float_leaves = [(t, split) for t, split in _leaves(xs, half) if t.dtype.is_floating]
    float_inputs = [t for t, _ in float_leaves]
    # What the outputs read outside the model, listed before the passes where the model is built (else after
    # the first pass builds it): a pass that changes one of them is refused below.
    reads = outside_reads.traced_reads(model, per_example_loss_fn, xs, ys) \
        if list_reads and model.built and model.variables else None
    before = outside_reads.values(reads.variables) if reads is not None else []
    weights = []  # one random direction per output, drawn at the first pass and kept for any later one

    def run_pass():
        """A training-mode pass on ``xs`` under a persistent tape: (tape, its tensors by name)."""
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(float_inputs)
            y_pred = _call_synthetic(model, xs, float_inputs)
            tape.watch(tf.nest.flatten(y_pred))
            outputs = [tf.reshape(tf.cast(o, tf.float32), [rows, -1]) for o in tf.nest.flatten(y_pred)]
            if not weights:
                weights.extend(tf.constant(rng.normal(size=o.shape), tf.float32) for o in outputs)
            first_half = tf.add_n([tf.reduce_sum(o[:half] * w[:half]) for o, w in zip(outputs, weights,
                                                                                       strict=True)])
            reg = tf.add_n([tf.reduce_sum(tf.cast(r, tf.float32)) for r in model.losses]) if model.losses \
                else None
            per_example = loss_half = None
            if ys is not None and per_example_loss_fn is not None:
                per_example = tf.convert_to_tensor(per_example_loss_fn(ys, y_pred, None))
                if per_example.shape.rank == 1 and per_example.shape[0] == rows:
                    loss_half = tf.reduce_sum(per_example[:half])
        return tape, dict(y_pred=y_pred, outputs=outputs, first_half=first_half, reg=reg,
                          per_example=per_example, loss_half=loss_half, inputs=float_inputs,
                          preds=tf.nest.flatten(y_pred))

    current = run_pass()

    def gradient(target, sources):
        """The gradient of pass tensor ``target`` by pass tensors ``sources`` (zeros where not reached).

        A ``tf.py_function`` keeps its eager gradient for one backward pass only: a second backward pass
        through it gets a new pass of its own.
        """
        nonlocal current
        try:
            return current[0].gradient(current[1][target], current[1][sources],
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO)
        except tf.errors.UnknownError as error:
            if "KeyError: b'pyfunc_" not in str(error):
                raise
        current = run_pass()
        return current[0].gradient(current[1][target], current[1][sources],
                                   unconnected_gradients=tf.UnconnectedGradients.ZERO)

    y_pred, outputs, reg, per_example, loss_half = (current[1][k] for k in (
        "y_pred", "outputs", "reg", "per_example", "loss_half"))
    if float_inputs:
        # One backward pass: an input the outputs do not reach gets zeros, which change no maximum.
        gradients = gradient("first_half", "inputs")
        own = _max_abs(gradients)
        cross = [g[split:] for g, (_, split) in zip(gradients, float_leaves, strict=True)]
        if _max_abs(cross) > COUPLING_TOLERANCE * max(own, 1.0):
            raise ValueError(
                "model: a layer mixes examples of the batch in training (one example's output depends on "
                "another example's input, e.g. batch statistics, or a Lambda over the batch axis), so "
                "per-example clipping does not bound the sensitivity and DP training would not be private. "
                "Use per-example layers (tfdpbnn.layers.PublicBatchNormalization for batch norm).")
        if reg is not None:
            dependence = _max_abs(gradient("reg", "inputs"))
            if dependence > 0.0:
                raise ValueError(
                    "model: model.losses depends on the input data (an add_loss on activations, or an "
                    "activity regularizer). DP optimizers add model.losses unclipped, so it must be "
                    "data-independent (weights only: KL terms, priors, weight decay); put a data-dependent "
                    "term into the compiled per-example loss instead.")
    if per_example is not None:
        if loss_half is None:
            raise ValueError(
                f"loss: the compiled loss returned shape {per_example.shape} for a batch of {rows} "
                "examples; DP training needs one loss per example (a loss that already reduces over the "
                "batch cannot be clipped per example). Use a tf.keras.losses.Loss or a function "
                "f(y_true, y_pred) that returns one value per example.")
        cross = gradient("loss_half", "preds")
        own = _max_abs([g[:half] for g in cross])
        if _max_abs([g[half:] for g in cross]) > COUPLING_TOLERANCE * max(own, 1.0):
            raise ValueError(
                "loss: one example's compiled loss depends on other examples' predictions (e.g. a batch "
                "mean inside the loss), so per-example clipping does not bound the sensitivity. Use a loss "
                "computed per example.")
        _check_loss_values(per_example_loss_fn, ys, y_pred, per_example, rows, half)
    distributed = tf.distribute.has_strategy() or getattr(model, "distribute_strategy",
                                                          None) not in (None, tf.distribute.get_strategy())
    tape_variables = [] if distributed else current[0].watched_variables()
    del current
    if float_inputs:
        _check_float_inputs_by_value(model, xs, rows, half, outputs, reg)
    discrete = [t for t, _ in _leaves(xs, half) if not t.dtype.is_floating]
    if discrete:
        _check_discrete_inputs(model, xs, rows, half)
    moved = outside_reads.changed(before)
    if moved:
        for v, value in before:
            v.assign(value)
        raise ValueError(
            f"model: a forward pass in training mode (on a synthetic batch) changed the variable(s) "
            f"{[v.name for v in moved][:3]}, which the model's outputs read but the model does not own (a "
            "global tf.Variable, a metric object's result, assigned in a layer's call()). Each DP step would "
            "then update it outside the DP mechanism and read it back, carrying one batch into the next "
            "(no clipping, no noise), so no epsilon would cover it. Drop the update while training with a "
            "DP optimizer.")
    if not list_reads:
        return None
    if reads is None:
        reads = outside_reads.traced_reads(model, per_example_loss_fn, xs, ys)
    return reads if reads is not None else outside_reads.eager_reads(model, tape_variables)


def _check_loss_values(loss_fn, ys, y_pred, per_example, rows: int, half: int) -> None:
    """Refuse a compiled loss whose first-half values move when only the second half's inputs do.

    The derivative check sees neither labels (integers have no derivative) nor a dependence that has none
    (``tf.stop_gradient`` of a batch statistic): a masked-token loss divided by the batch's count of real
    tokens, or in-batch class weights, passed it. Here the loss is evaluated again with the second half's
    labels changed (integers to 1 and to -1, floats shifted by 1, booleans negated, strings changed) and
    with its predictions shifted by 1; the first half's values must stay (within ``COUPLING_TOLERANCE``).
    A loss that gives other values for the same inputs (random), or that fails or gives non-finite
    values on a changed batch, is left to the derivative check for that change.
    """
    first = per_example[:half]
    labels = tf.nest.flatten(ys)

    def shifted(t):  # a float value plus 1 from the second half on; anything else kept
        return _changed_second_half(t, half, floats=True) if t.dtype.is_floating else t

    changes = [("predictions", ys, tf.nest.map_structure(shifted, y_pred))]
    if any(not t.dtype.is_floating for t in labels):
        changes.append(("labels", _changed_second_half(ys, half, sign=1), y_pred))
    if any(t.dtype.is_integer and not t.dtype.is_unsigned for t in labels):
        changes.append(("labels", _changed_second_half(ys, half, sign=-1), y_pred))
    if any(t.dtype.is_floating for t in labels):
        changes.append(("labels", tf.nest.map_structure(shifted, ys), y_pred))
    for what, changed_labels, preds in changes:
        moved = _loss_values(loss_fn, changed_labels, preds, rows)
        if moved is None or not np.all(np.isfinite(_host_values(moved)[:half])) or _close(
                first, moved[:half]):
            continue
        again = _loss_values(loss_fn, ys, y_pred, rows)  # the same inputs: is the loss a function of them?
        if again is None or not _close(first, again[:half]):
            return  # random: its values are not comparable (left to the derivative check)
        raise ValueError(
            f"loss: one example's compiled loss changes with other examples' {what} (e.g. a loss "
            "normalized by a count or statistic of the batch, such as a masked mean over the batch's "
            "real tokens or in-batch class weights), so per-example clipping does not bound the "
            "sensitivity. Use a loss computed from each example's own label and prediction.")


def _loss_values(loss_fn, ys, y_pred, rows: int):
    """``loss_fn(ys, y_pred, None)`` as float32 per example, or None where it fails or has another shape."""
    try:
        values = tf.convert_to_tensor(loss_fn(ys, y_pred, None))
    except (tf.errors.InvalidArgumentError, ValueError, TypeError):
        return None
    if values.shape.rank != 1 or values.shape[0] != rows:
        return None
    return tf.cast(values, tf.float32)


def _changed_second_half(xs, half: int, sign: int = 1, floats: bool = False):
    """``xs`` with the rows from ``half`` on of every integer, boolean and string input changed.

    ``sign``: integers become 1 (``sign=1``), or -1 (``sign=-1``; unsigned ones 1). ``floats``: float
    inputs are changed too (shifted by 1), else kept.
    """

    def change(t):
        if t.dtype.is_floating and not floats:
            return t
        if not isinstance(t, tf.RaggedTensor) and hasattr(t, "numpy"):  # eager: on the host
            values = t.numpy().copy()
            values[half:] = _other_values(values[half:], sign)
            return tf.constant(values, dtype=t.dtype)
        if isinstance(t, tf.RaggedTensor):
            flat = t.flat_values
            start = t.row_splits[half]
            return t.with_flat_values(tf.where(
                tf.reshape(tf.range(tf.shape(flat)[0]) >= tf.cast(start, tf.int32),
                           [-1] + [1] * (flat.shape.rank - 1)) & tf.ones_like(flat, tf.bool),
                _other(flat, sign), flat))
        rows = tf.range(tf.shape(t)[0])
        mask = tf.reshape(rows >= half, [-1] + [1] * (t.shape.rank - 1))
        return tf.where(tf.broadcast_to(mask, tf.shape(t)), _other(t, sign), t)

    return tf.nest.map_structure(change, xs)


def _other_values(values: np.ndarray, sign: int) -> np.ndarray:
    """``_other`` on the host: the same values for a numpy array."""
    if values.dtype.kind in "SUO":
        return np.full(values.shape, b"b", dtype=object)
    if values.dtype.kind == "f":
        return values + 1
    if values.dtype.kind == "b":
        return ~values
    if sign < 0 and values.dtype.kind == "i":
        return np.full_like(values, -1)
    return np.ones_like(values)


def _other(t, sign: int = 1):
    """Other values of a tensor.

    ``sign`` (1 or -1) for integers (an unsigned integer gets 1), "b" for strings, True for False, the value
    plus 1 for floats.
    """
    if t.dtype == tf.string:
        return tf.fill(tf.shape(t), "b")
    if t.dtype.is_floating:
        return t + tf.ones_like(t)
    if t.dtype.is_bool:
        return tf.logical_not(t)
    if sign < 0 and not t.dtype.is_unsigned:
        return -tf.ones_like(t)
    return tf.ones_like(t)


def _forward(model, xs, rows):
    y_pred = model(xs, training=True)
    outputs = [tf.reshape(tf.cast(o, tf.float32), [rows, -1]) for o in tf.nest.flatten(y_pred)]
    reg = tf.add_n([tf.reduce_sum(tf.cast(r, tf.float32)) for r in model.losses]) if model.losses else None
    return outputs, reg


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    scale = max(1.0, _max_abs(a))
    differences = tf.nest.map_structure(
        lambda u, v: _host_values(u).astype(np.float64) - _host_values(v).astype(np.float64), a, b)
    return _max_abs(differences) <= COUPLING_TOLERANCE * scale


def _check_float_inputs_by_value(model, xs, rows: int, half: int, outputs, reg) -> None:
    """The derivative check's blind spot: a dependence across examples that has no derivative.

    A ``tf.stop_gradient`` of a batch statistic inside the model (``h - stop_gradient(mean(h, 0))``), an
    ``add_loss`` scaled by one, an ``argmax`` or a cast have zero derivative and passed. The second half's
    float inputs are shifted by 1: the first half's outputs (``outputs``, of the pass on ``xs``) and
    ``model.losses`` (``reg``) must not move. Where they move, a second pass on ``xs`` tells a dependence
    from the model's own random draws: what is equal on both passes and moved with the inputs is refused
    (a stochastic output or regularizer is left to the derivative check).
    """
    changed_outputs, changed_reg = _forward(model, _changed_second_half(xs, half, floats=True), rows)
    moved = [not _close(out[:half], changed[:half]) for out, changed in zip(outputs, changed_outputs,
                                                                            strict=True)]
    reg_moved = reg is not None and not _close(reg, changed_reg)
    if not any(moved) and not reg_moved:
        return
    outputs_again, reg_again = _forward(model, xs, rows)
    if reg_moved and _close(reg, reg_again):
        raise ValueError(
            "model: model.losses depends on the input data (an add_loss or activity regularizer whose "
            "dependence on the inputs has no derivative, e.g. through tf.stop_gradient, seen by changing "
            "the inputs). DP optimizers add model.losses unclipped, so it must be data-independent (weights "
            "only: KL terms, priors, weight decay); put a data-dependent term into the compiled per-example "
            "loss instead.")
    for out, again, was_moved in zip(outputs, outputs_again, moved, strict=True):
        if was_moved and _close(out, again):
            raise ValueError(
                "model: a layer mixes examples of the batch in training (one example's output changes "
                "with another example's input through a path without a derivative, e.g. tf.stop_gradient "
                "of a batch statistic), so per-example clipping does not bound the sensitivity and DP "
                "training would not be private. Use per-example layers.")


def _check_discrete_inputs(model, xs, rows: int, half: int) -> None:
    """The per-example proof for integer, boolean and string inputs, which have no derivative.

    The second half of every such input is changed (zeros to ones, "a" to "b", False to True): the first
    half's outputs and ``model.losses`` must not move. Where the model draws random numbers, a comparison
    needs the draws repeated: ``model.losses`` must then be equal on two calls with the same batch, or the
    model is refused (nothing could prove its regularization data-independent); stochastic outputs are
    compared only where two calls with the same batch agree.
    """
    outputs, reg = _forward(model, xs, rows)
    outputs_again, reg_again = _forward(model, xs, rows)
    changed_outputs, changed_reg = _forward(model, _changed_second_half(xs, half), rows)
    if reg is not None:
        if not _close(reg, reg_again):
            raise ValueError(
                "model: model.losses differs between two calls on the same batch of integer/string inputs, "
                "so tfdpbnn cannot prove that it does not depend on the input data (integer and string "
                "inputs have no derivative to check). DP optimizers add model.losses unclipped: make it "
                "deterministic (e.g. an exact KL term) or feed float inputs.")
        if not _close(reg, changed_reg):
            raise ValueError(
                "model: model.losses depends on the input data (an add_loss on activations, or an "
                "activity regularizer, seen by changing integer/string inputs). DP optimizers add "
                "model.losses unclipped, so it must be data-independent (weights only: KL terms, priors, "
                "weight decay); put a data-dependent term into the compiled per-example loss instead.")
    for out, again, changed in zip(outputs, outputs_again, changed_outputs, strict=True):
        if _close(out, again) and not _close(out[:half], changed[:half]):
            raise ValueError(
                "model: a layer mixes examples of the batch in training (one example's output depends on "
                "another example's integer/string input), so per-example clipping does not bound the "
                "sensitivity and DP training would not be private. Use per-example layers.")


class ProbeReached(Exception):  # noqa: N818 - not an error: the probed step reached the mechanism
    """Raised inside a probed ``train_step`` once its per-example loss reached the mechanism and passed."""


def refuse_ignored_compute_loss(model, where: str) -> None:
    """Refuse a model whose class overrides ``compute_loss`` where the DP step would ignore it.

    ``dp_train_step`` (what ``fit`` and ``train_on_batch`` run without a ``train_step`` override) clips the
    per-example losses it rebuilds from ``model.compile(loss=...)``; it never calls ``compute_loss``, which
    returns the batch's reduced loss. An override (a term added, the loss scaled or replaced) would train
    another objective than the user's, silently.
    """
    base = getattr(tf.keras.Model, "compute_loss", None)
    if base is None or getattr(type(model), "compute_loss", None) is base:
        return
    raise ValueError(
        f"compute_loss: {type(model).__name__} overrides Model.compute_loss, which {where} does not call: "
        "the DP step clips the per-example losses of the compiled loss (model.compile(loss=...)), so the "
        "override would be ignored. Put the per-example loss in compile(loss=...) (a function of (y_true, "
        "y_pred) with one value per example), or override train_step and hand the per-example loss vector "
        "to optimizer.minimize(loss, var_list, tape=tape).")


def overrides_train_step(model) -> bool:
    """Whether ``model``'s class has its own ``train_step`` (not Keras's, dispatched to ``dp_train_step``)."""
    return not getattr(type(model).train_step, "_tfdpbnn_hook", False)


class LossProbe:
    """The per-example check of a loss vector that reaches the mechanism, on a synthetic batch.

    The float inputs of the synthetic batch are trainable ``tf.Variable``s, so a ``tf.GradientTape`` the
    step opens itself records them when the model reads them. ``__call__(loss, tape)`` differentiates the
    first half of the batch's losses with respect to the inputs: the second half's derivative must vanish
    (one example's loss depends on no other example), and the first half's must not (the loss was computed
    from the batch under that tape, so the check saw it). Raises ``ValueError``, or ``ProbeReached``.
    """

    def __init__(self, x, y=None, rows: int = 6, seed: int = 0, sample_weight: bool = False):
        x_like, y_like = element_parts(x, y)
        rng = np.random.default_rng(seed)
        xs = _synthetic(x_like, rows, rng)
        self.y = None if y_like is None else _synthetic(y_like, rows, rng)
        self.rows, self.half = rows, rows // 2
        # ``sample_weight``: the batch carries per-example weights (fit's sample_weight or class_weight), as
        # watched variables too: a loss normalized by the batch's sum of weights couples the examples.
        self.sample_weight = None if not sample_weight else tf.Variable(
            rng.uniform(0.5, 2.0, rows).astype(np.float32), trainable=True, name="tfdpbnn_probe_weight")

        def watched(t):
            if isinstance(t, tf.Tensor) and t.dtype.is_floating:
                return tf.Variable(t, trainable=True, name="tfdpbnn_probe_input")
            return t

        self.x = tf.nest.map_structure(watched, xs)
        self.inputs = [t for t in tf.nest.flatten(self.x) if isinstance(t, tf.Variable)]
        if self.sample_weight is not None:
            self.inputs.append(self.sample_weight)
        self._tape = None

    @contextlib.contextmanager
    def recording(self):
        """Record, on a tape of the probe's own, what the probed ``train_step`` computes from the inputs."""
        with tf.GradientTape(persistent=True) as tape:
            self._tape = tape
            try:
                yield
            finally:
                self._tape = None

    def check_batch(self, x, where: str) -> None:
        """Refuse a batch handed to ``where`` that is not one row per example of the probed batch.

        A ``train_step`` override that hands ``dp_train_step`` more rows than the batch (an example and its
        augmented copy side by side) or rows that mix examples (mixup) lets one example move the clipped sum
        by more than the clip bound: each row must derive from one example (its first half's rows have zero
        derivative with respect to the second half's inputs).
        """
        leaves = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]
        rows = {int(t.shape[0]) for t in leaves if t.shape.rank and t.shape[0] is not None}
        if rows and rows != {self.rows}:
            raise ValueError(
                f"x: the batch handed to {where} has {sorted(rows)} rows for a batch of {self.rows} examples "
                "(on a synthetic batch); each example must be one row of the clipped sum (an example and a "
                "copy of it in one batch move it by twice the clip bound). Augment each example in place, or "
                "use tfdpbnn's augmentation multiplicity.")
        floats = [t for t in leaves if t.dtype.is_floating and t.shape.rank]
        if self._tape is None or not floats:
            return
        if not tf.executing_eagerly():
            raise ValueError(
                f"model: its train_step calls {where} inside a tf.function (or another traced function) of "
                "its own, where tfdpbnn's check of the batch handed to it (each row one example of the "
                f"step's batch) cannot run. Call {where} in train_step itself (fit traces train_step).")
        with self._tape.stop_recording():
            masks = [tf.broadcast_to(tf.reshape(tf.cast(tf.range(self.rows) < self.half, t.dtype),
                                                [self.rows] + [1] * (t.shape.rank - 1)), tf.shape(t))
                     for t in floats]
            grads = self._tape.gradient(floats, self.inputs, output_gradients=masks,
                                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
        own = _max_abs([g[:self.half] for g in grads])
        cross = _max_abs([g[self.half:] for g in grads])
        if cross > COUPLING_TOLERANCE * max(own, 1.0):
            raise ValueError(
                f"x: the rows of the batch handed to {where} mix examples of the batch (e.g. mixup): on a "
                f"synthetic batch the first half's rows have derivative {cross:.3g} with respect to the "
                "second half's inputs, so one example moves more than one row and per-example clipping does "
                "not bound its influence. Hand the mechanism one row per example.")

    @property
    def data(self):
        """The synthetic batch as ``train_step`` receives it: ``(x, y)``, or ``x`` without targets.

        With sample weights: ``(x, y, sample_weight)``.
        """
        if self.sample_weight is not None:
            return (self.x, self.y, self.sample_weight)
        return self.x if self.y is None else (self.x, self.y)

    def __call__(self, loss, tape, where: str):
        """Check ``loss`` (on ``tape``) handed to ``where``; raises ``ValueError`` or ``ProbeReached``."""
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank == 0 or loss.shape[0] != self.rows:
            raise ValueError(
                f"loss: the loss passed to {where} has shape {loss.shape} for a batch of {self.rows} "
                "examples; DP training needs one loss per example (shape [batch]) to clip per example.")
        mask = tf.cast(tf.range(self.rows) < self.half, loss.dtype)
        mask = tf.broadcast_to(tf.reshape(mask, [self.rows] + [1] * (loss.shape.rank - 1)), tf.shape(loss))
        grads = tape.gradient(loss, self.inputs, output_gradients=mask,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        own = _max_abs([g[:self.half] for g in grads])
        cross = _max_abs([g[self.half:] for g in grads])
        if self._tape is not None:  # the probe's own tape saw the whole step (weights prepared outside yours)
            with self._tape.stop_recording():
                whole = self._tape.gradient(loss, self.inputs, output_gradients=mask,
                                            unconnected_gradients=tf.UnconnectedGradients.ZERO)
            cross = max(cross, _max_abs([g[self.half:] for g in whole]))
        if own == 0.0:
            raise ValueError(
                f"loss: tfdpbnn could not check that the per-example loss passed to {where} keeps examples "
                "separate: on a synthetic batch it does not depend on the batch's float inputs as recorded "
                "by the GradientTape given with it. Compute the model's output and the loss from the batch "
                "inside that tape (with tf.GradientTape() as tape: y_pred = self(x, training=True); ...).")
        if cross > COUPLING_TOLERANCE * max(own, 1.0):
            raise ValueError(
                f"loss: one example's loss passed to {where} depends on other examples of the batch (e.g. a "
                "contrastive loss, or a batch mean inside the loss): on a synthetic batch the first half's "
                f"losses have derivative {cross:.3g} with respect to the second half's inputs. Per-example "
                "clipping then does not bound one example's influence by the clip bound, so DP training "
                "would not be private. Use a loss computed from each example alone.")
        raise ProbeReached(where)



def check_compute_dtype(model, submodules=None) -> None:
    """Refuse a model under a float16/bfloat16 dtype policy (``tf.keras.mixed_precision``), naming it.

    Keras wraps the optimizer of such a model in a ``LossScaleOptimizer`` that applies unscaled gradients
    it computed itself, outside the DP mechanism; and the per-example norms and noise would be float16.
    ``submodules``: ``_private_api.submodules(model)`` when the caller has just walked the model.
    """
    policy = tf.keras.mixed_precision.global_policy()
    names = {policy.name} if policy.compute_dtype in ("float16", "bfloat16") else set()
    for layer in _private_api.submodules(model) if submodules is None else submodules:
        layer_policy = getattr(layer, "dtype_policy", None)
        if layer_policy is not None and getattr(layer_policy, "compute_dtype", None) in ("float16",
                                                                                          "bfloat16"):
            names.add(layer_policy.name)
    if getattr(model, "optimizer", None) is not None and isinstance(
            model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer) and not names:
        raise ValueError(
            f"optimizer: the model is compiled with a LossScaleOptimizer ({type(model.optimizer).__name__}) "
            "around the DP optimizer; it applies the gradients it scaled and unscaled itself, outside the DP "
            "mechanism, and tfdpbnn DP optimizers do not support it. Compile the model with the DP "
            "optimizer itself, under the float32 policy.")
    if names:
        raise ValueError(
            f"dtype policy: the model computes under the mixed-precision policy {sorted(names)} "
            "(tf.keras.mixed_precision); tfdpbnn DP optimizers do not support it (a LossScaleOptimizer "
            "would apply gradients outside the DP mechanism, and per-example norms and noise would lose "
            "precision). "
            "Build and compile the model under tf.keras.mixed_precision.set_global_policy('float32').")


__all__ = ["COUPLING_TOLERANCE", "LossProbe", "ProbeReached", "check_compute_dtype", "check_per_example",
           "input_sampling", "overrides_train_step", "refuse_ignored_compute_loss"]
