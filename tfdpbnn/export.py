"""SavedModel export with a deterministic and a Monte Carlo serving signature, plus the privacy statement.

``assets/privacy.json`` carries ``"format_version"`` (``PRIVACY_FORMAT_VERSION``). Files without it were
written before the format was versioned (version 0, the same fields as version 1) and read unchanged;
``read_privacy`` refuses a version newer than this release understands and says to upgrade.
"""

from __future__ import annotations

import json
import math
import os

import tensorflow as tf

from tfdpbnn import _adapters
from tfdpbnn._validation import check_open_unit, check_positive_int
from tfdpbnn.layers.noisy import without_dp_noise_keys
from tfdpbnn.layers.sampling import mc_sampling_active, sample_in_trace
from tfdpbnn.uncertainty.conformal import ConformalThreshold
from tfdpbnn.uncertainty.mc import check_task, monte_carlo_summaries
from tfdpbnn.uncertainty.outputs import resolve_from_logits
from tfdpbnn.uncertainty.temperature import TemperatureScaling, scale_probabilities

#: Version of the ``assets/privacy.json`` format written by ``export_saved_model``: 1 is the statement's dict
#: (strict JSON, ``strict_json_value``) plus this key; 0 is the same without the key (tfdpbnn 0.1.0 exports).
PRIVACY_FORMAT_VERSION = 1
#: The key of the format version in ``privacy.json`` (reserved: a ``privacy`` dict may not use it).
PRIVACY_FORMAT_KEY = "format_version"


def read_privacy(path) -> dict:
    """The privacy record of an export: ``<path>/assets/privacy.json`` (or ``path`` itself, a JSON file).

    Returns the dict as written (strict JSON: an infinite value is ``null`` plus ``<key>_is_infinite``),
    with ``"format_version"`` set to 0 for a file written before the format was versioned. Raises
    ``FileNotFoundError`` when the export has no privacy record and ``ValueError`` for a format version this
    release does not know (upgrade tfdpbnn to read it).
    """
    path = os.fspath(path)
    file = path if os.path.isfile(path) else os.path.join(path, "assets", "privacy.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"path: no privacy record at {file} (export_saved_model writes one with "
                                "every export; an earlier tfdpbnn wrote none for a model without a DP "
                                "optimizer: export it again)")
    with open(file, encoding="utf-8") as fh:
        record = json.load(fh)
    if not isinstance(record, dict):
        raise ValueError(f"path: {file} holds a JSON {type(record).__name__}, not a privacy record")
    version = record.setdefault(PRIVACY_FORMAT_KEY, 0)
    if version not in range(PRIVACY_FORMAT_VERSION + 1) or isinstance(version, bool | float):
        raise ValueError(f"path: {file} has {PRIVACY_FORMAT_KEY} {version!r}; this tfdpbnn reads versions 0 "
                         f"to {PRIVACY_FORMAT_VERSION}. It was written by a newer tfdpbnn: upgrade "
                         "(pip install --upgrade tfdpbnn) to read it")
    return record


def _input_spec(model, input_signature):
    if input_signature is not None:
        if not isinstance(input_signature, tf.TensorSpec):
            raise ValueError(f"input_signature must be a tf.TensorSpec, got {input_signature!r}")
        return tf.TensorSpec(input_signature.shape, input_signature.dtype, name="x")
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError("input_signature: the model has no known inputs (subclassed model): pass "
                         "input_signature=tf.TensorSpec([None, ...], tf.float32)")
    if len(inputs) != 1:
        raise ValueError(f"model: export_saved_model supports single-input models, got {len(inputs)} inputs")
    return tf.TensorSpec(inputs[0].shape, inputs[0].dtype, name="x")


def strict_json_value(value, name="privacy"):
    """``value`` with every infinite float made strict JSON (RFC 8259 has no Infinity or NaN).

    In a dict, ``key: inf`` becomes ``key: null`` plus ``key_is_infinite: true`` (e.g. epsilon at noise 0:
    no privacy); ``-inf`` also sets ``key_is_infinite: "negative"``; in a list an infinity becomes the string
    "inf" / "-inf". NaN is refused with ``ValueError`` (a NaN guarantee is a bug, not a value).
    """
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if isinstance(item, float) and math.isinf(item):
                out[key] = None
                out[f"{key}_is_infinite"] = True if item > 0 else "negative"
            else:
                out[key] = strict_json_value(item, f"{name}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v)
                else strict_json_value(v, f"{name}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} is NaN, which is not JSON and not a privacy guarantee")
    return value


def _statement(model, privacy, delta, releases):
    """The statement to write: ``privacy``, else the optimizer's, else that of the weights' record.

    ``releases`` (calibration, prediction sets) are recorded on the DP optimizer that states the training
    (``record_release``), so its ``epsilon`` composes them; a private one it has not recorded (with the
    records it read) is refused (``refuse_unrecorded_releases``).
    """
    from tfdpbnn.optimizers.base import DPOptimizerMixin
    from tfdpbnn.optimizers.weights_statement import weights_statement
    from tfdpbnn.record.private_release import refuse_unrecorded_releases
    from tfdpbnn.record.statement import no_record_statement

    if delta is not None:
        if privacy is not None:
            raise ValueError("delta: the statement is privacy= as given; delta applies only to the statement "
                             "export_saved_model builds (privacy=None)")
        delta = check_open_unit("delta", delta)
    if privacy is not None:
        return privacy
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, DPOptimizerMixin):
        refuse_unrecorded_releases(optimizer, releases, "the model's DP optimizer")
        for release in releases:
            optimizer.record_release(release)
        # A tfdpbnn optimizer states the record of this model's weights (see privacy_statement).
        return optimizer.privacy_statement(delta=delta, model=model)
    statement = getattr(optimizer, "privacy_statement", None)
    if callable(statement):  # another optimizer that states its own privacy
        if delta is not None:
            raise ValueError(f"delta: the model's optimizer ({type(optimizer).__name__}) states its own "
                             "privacy (privacy_statement()); delta applies to a tfdpbnn statement only")
        record_release = getattr(optimizer, "record_release", None)
        if callable(record_release):
            for release in releases:
                record_release(release)
        stated = statement()
        if stated is not None:
            return stated
    # No DP optimizer: what the record store (or a DP optimizer of this process) knows of these weights.
    found = weights_statement(model, delta, releases)
    return no_record_statement(model, delta) if found is None else found


def _privacy_dict(model, privacy, delta=None, releases=()):
    """The statement to write (``_statement``) as strict JSON text."""
    privacy = _statement(model, privacy, delta, releases)
    if not isinstance(privacy, dict):
        raise ValueError(f"privacy must be a dict (JSON-serializable) or None, got {type(privacy).__name__}")
    if PRIVACY_FORMAT_KEY in privacy:
        raise ValueError(f"privacy: the key {PRIVACY_FORMAT_KEY!r} is reserved for the file's format version "
                         f"(written as {PRIVACY_FORMAT_VERSION}); rename it")
    try:
        return json.dumps(strict_json_value(privacy), indent=2, sort_keys=True, allow_nan=False)
    except TypeError as err:
        raise ValueError(f"privacy must be JSON-serializable: {err}") from err


def _check_calibration(calibration, prediction_sets, task):
    if calibration is not None and not isinstance(calibration, TemperatureScaling):
        raise ValueError("calibration must be None or a TemperatureScaling (tfdpbnn.uncertainty."
                         f"fit_temperature or fit_temperature_private), got {type(calibration).__name__}")
    if prediction_sets is not None and not isinstance(prediction_sets, ConformalThreshold):
        raise ValueError("prediction_sets must be None or a ConformalThreshold (tfdpbnn.uncertainty."
                         "conformal_threshold or private_conformal_threshold), got "
                         f"{type(prediction_sets).__name__}")
    if task != "classification" and (calibration is not None or prediction_sets is not None):
        raise ValueError("calibration and prediction_sets apply to task='classification' only")
    return [item.as_dict() for item in (calibration, prediction_sets) if item is not None]


def _with_calibration(privacy_json, records):
    """``privacy_json`` with the calibration records listed under "calibration"."""
    if not records:
        return privacy_json
    privacy = json.loads(privacy_json)
    privacy["calibration"] = strict_json_value(records, "calibration")
    return json.dumps(privacy, indent=2, sort_keys=True, allow_nan=False)


def _input_transform(spec, input_scale, input_offset):
    """``(scale, offset)`` as float32 constants broadcastable to one input (None: identity), and a record."""
    import numpy as np

    values = []
    for name, value in (("input_scale", input_scale), ("input_offset", input_offset)):
        if value is None:
            values.append(None)
            continue
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be a number or an array of numbers, got {value!r}") from err
        if not np.all(np.isfinite(array)):
            raise ValueError(f"{name} must be finite, got {value!r}")
        if name == "input_scale" and np.any(array == 0):
            raise ValueError(f"input_scale must be nonzero (it would erase the input), got {value!r}")
        feature_shape = tuple(spec.shape[1:])
        known = tuple(1 if d is None else d for d in feature_shape)
        try:
            fits = array.ndim <= len(feature_shape) and np.broadcast_shapes(array.shape, known) == known
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{name} of shape {array.shape} does not broadcast to one input of shape "
                             f"{feature_shape}")
        values.append(array)
    if values == [None, None]:
        return None, None
    record = {"scale": 1.0 if values[0] is None else values[0].tolist(),
              "offset": 0.0 if values[1] is None else values[1].tolist(),
              "formula": "model input = scale * x + offset, applied by every signature"}
    return values, record


def export_saved_model(model, path, num_samples=30, privacy=None, task="classification", from_logits=None,
                       input_signature=None, calibration=None, prediction_sets=None, input_scale=None,
                       input_offset=None, delta=None):
    """Write ``model`` as a SavedModel at ``path`` with two signatures, reloadable by Keras and TF Serving.

    * ``serving_default(x) -> {"output"}``: deterministic prediction (``training=False``, no sampling).
    * ``mc_predict(x, num_samples) -> {...}``: Monte Carlo prediction traced inside
      ``tfdpbnn.layers.mc_sampling()``, so the stochastic layers sample on every call. ``num_samples`` is an
      int32 scalar >= 1 (a smaller value fails the graph's assertion). Outputs as ``tfdpbnn.uncertainty.mc``:
      classification: mean, predictive_entropy, mutual_information, expected_entropy; regression: mean,
      epistemic_variance, aleatoric_variance, variance (float64).

    ``from_logits`` (classification): True if the model outputs logits (the signature applies softmax),
    False for probability vectors (the signature asserts it), None to read it from the output layer's
    activation (softmax or linear; anything else raises ``ValueError``). The resolved value is written to
    ``mc_predict.json``.

    ``calibration`` (a ``tfdpbnn.uncertainty.TemperatureScaling``) adds the output ``calibrated_mean``
    (the MC mean scaled by its temperature); ``prediction_sets`` (a ``ConformalThreshold``) adds
    ``prediction_set``, a boolean [n, C] mask {y : 1 - p(y | x) <= q} of the calibrated mean when
    ``calibration`` is given (fit the threshold on calibrated probabilities then), else of the mean. Their
    parameters go to ``mc_predict.json``; their privacy costs (event and epsilon) are listed under
    ``"calibration"`` in ``privacy.json`` (written even without a training statement). When the statement
    comes from the model's DP optimizer (``privacy=None``), they are also recorded with
    ``optimizer.record_release``, so the statement's ``epsilon`` composes them with training.

    ``input_scale`` / ``input_offset`` (numbers, or arrays broadcastable to one input): the data-independent
    preprocessing the model was trained on, x -> ``input_scale`` * x + ``input_offset`` (e.g.
    ``input_offset=-0.5`` for inputs centred as x - 0.5). Every signature applies it to the raw ``x`` it is
    given (``serving_default``, ``mc_predict`` and so ``calibrated_mean`` and ``prediction_set``), and it is
    recorded as ``input_transform`` in ``mc_predict.json``; the Keras model reloaded by
    ``tf.keras.models.load_model`` is the bare model and expects transformed inputs.

    ``num_samples`` (integer >= 1) is the recommended default, written with the task to
    ``<path>/assets/mc_predict.json``. The optimizer is not saved (``include_optimizer=False``).
    ``<path>/assets/privacy.json`` is always written, as strict JSON (an infinite epsilon, e.g. at noise 0,
    is written as ``"epsilon": null, "epsilon_is_infinite": true``; see ``strict_json_value``) with
    ``"format_version": PRIVACY_FORMAT_VERSION`` (``read_privacy`` reads it back). It holds ``privacy`` (a
    dict) if given; else ``model.optimizer.privacy_statement()`` (a tfdpbnn DP optimizer's at ``delta``,
    default its own); else, for a model without a DP optimizer (``load_model(compile=False)``, compiled with
    ``"adam"``), the statement a DP optimizer gives for its weights (``tfdpbnn.optimizers.
    weights_statement``: the record the privacy record store holds for them, composed with the calibration;
    ``delta`` is then required unless a DP optimizer of this process trained them), or, when nothing is
    known of the weights, a statement that no privacy record was found (``"no_record"``, ``"guarantee":
    false``, epsilon infinite: no epsilon is claimed). Returns ``path``.
    """
    num_samples = check_positive_int("num_samples", num_samples)
    if mc_sampling_active():
        raise ValueError("export_saved_model: call it outside `with mc_sampling():`; the saved deterministic "
                         "functions would otherwise carry the sampling switch (the mc_predict signature "
                         "samples on its own)")
    check_task(task)
    from_logits = resolve_from_logits(model, from_logits) if task == "classification" else False
    spec = _input_spec(model, input_signature)
    records = _check_calibration(calibration, prediction_sets, task)
    transform, transform_record = _input_transform(spec, input_scale, input_offset)

    def prepare(x):
        if transform is None:
            return x
        scale, offset = transform
        if scale is not None:
            x = x * tf.constant(scale, x.dtype)
        if offset is not None:
            x = x + tf.constant(offset, x.dtype)
        return x
    releases = [release for release in (calibration, prediction_sets) if release is not None]
    privacy_json = _with_calibration(_privacy_dict(model, privacy, delta, releases), records)

    @tf.function(input_signature=[spec])
    def serving_default(x):
        return {"output": model(prepare(x), training=False)}

    def mc(x, n):
        out = monte_carlo_summaries(model, prepare(x), n, task, from_logits)
        probs = out["mean"]
        if calibration is not None:
            probs = out["calibrated_mean"] = scale_probabilities(probs, calibration.temperature)
        if prediction_sets is not None:
            out["prediction_set"] = 1.0 - probs <= tf.cast(prediction_sets.threshold, probs.dtype)
        return out

    mc_fn = tf.function(mc, input_signature=[spec, tf.TensorSpec([], tf.int32, name="num_samples")])
    with without_dp_noise_keys(model):  # the SavedModel holds no DP noise key (layers/noisy.py)
        with sample_in_trace():  # trace here: the traced graph samples whenever it is called
            mc_concrete = mc_fn.get_concrete_function()
        det_concrete = serving_default.get_concrete_function()
        _adapters.current().save_saved_model(model, path, {"serving_default": det_concrete,
                                                           "mc_predict": mc_concrete})
    assets = os.path.join(path, "assets")
    os.makedirs(assets, exist_ok=True)
    with open(os.path.join(assets, "mc_predict.json"), "w") as fh:
        json.dump({"default_num_samples": num_samples, "task": task, "from_logits": bool(from_logits),
                   "temperature": None if calibration is None else calibration.temperature,
                   "prediction_set_threshold": None if prediction_sets is None
                   else prediction_sets.threshold, "input_transform": transform_record}, fh)
    record = dict(json.loads(privacy_json), **{PRIVACY_FORMAT_KEY: PRIVACY_FORMAT_VERSION})
    with open(os.path.join(assets, "privacy.json"), "w") as fh:
        fh.write(json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return path
