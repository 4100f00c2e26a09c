"""The DP gradient mechanism: per-example clipping, one Gaussian draw, a constant scale, and its ``DpEvent``.

One step of DP-SGD (Abadi et al. 2016, Algorithm 1) releases

  g = s (sum_i min(1, C / ||g_i||) g_i + N(0, (sigma C)^2 I))  +  grad(regularization)

where ``g_i`` is the gradient of example i's DATA loss, ``s`` a constant (``1 / B`` with B the EXPECTED batch
size; the division is post-processing) and the regularization (``model.losses``: KL terms, priors) is
data-independent, so it is added after the noise and never clipped. ``DPMechanism`` computes exactly that,
and nothing else: every tfdpbnn optimizer builds its update from it (``optimizer.mechanism``), and custom
training loops and ``train_step`` overrides call it directly. The mechanism's ``step_event`` is the
dp-accounting ``DpEvent`` of one such release, so a loop that composes one event per step into a
``dp_accounting.PrivacyAccountant`` accounts for what it ran.

Data flow of one step (``docs/architecture.md``): batch -> per-example losses -> per-example gradient norms
(``tfdpbnn.clipping``: one rule per layer, the jacobian as the fallback) -> clip factors -> clipped sum ->
one noise draw (``tfdpbnn.privacy.noise``) -> scaled, noised gradient -> update -> ``DpEvent``.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import dp_accounting
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn._audit_hook import audit_bug as _audit_bug
from tfdpbnn._validation import check_choice, check_nonnegative, check_positive, check_sample_rate
from tfdpbnn.clipping import clipped_gradients, jacobian_clipped_sum
from tfdpbnn.clipping.engine import METHODS as CLIPPING_METHODS
from tfdpbnn.clipping.result import ClippedGradients
from tfdpbnn.optimizers.per_example_loss import compiled_per_example_loss_fn
from tfdpbnn.privacy.budget import NEIGHBORING
from tfdpbnn.privacy.noise import (
    NoiseKey,
    check_debug_noise_seed,
    gaussian_noise_like,
    max_radius,
    step_seed,
    tail_reveal_probability,
)
from tfdpbnn.record.ledger import step_event


def _unclipped_layer_sums(model, x, y, sample_weight, loss_fn, var_list, training, scale, layer_type):
    """AUDIT BUG ``unclipped-layer``: the scaled UNCLIPPED gradient sum of ``layer_type`` layers.

    ``scale * sum_i g_i`` for each variable of a layer whose class is named ``layer_type``; None for others.
    """
    owned = {id(v) for layer in _private_api.submodules(model) if type(layer).__name__ == layer_type
             for v in layer.trainable_variables}
    targets = [v for v in var_list if id(v) in owned]
    if not targets:
        raise ValueError(f"unclipped-layer: the model has no trainable {layer_type} layer")
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(loss_fn(y, model(x, training=training), sample_weight))
    grads = tape.gradient(total, targets)
    by_id = {id(v): tf.convert_to_tensor(g) * scale for v, g in zip(targets, grads, strict=True)}
    return [by_id.get(id(v)) for v in var_list]


#: What a mechanism parameter may be: a number, or a scalar tensor/variable (read at every step), or a
#: function of no arguments returning one.
Scalar = Any


def add_regularization(grads, regularization_grads):
    """``g + r`` per variable; ``grads`` unchanged when ``regularization_grads`` is None (no model.losses)."""
    if regularization_grads is None:
        return list(grads)
    return [g + tf.cast(r, g.dtype) for g, r in zip(grads, regularization_grads, strict=True)]


@dataclasses.dataclass
class DPGradients:
    """One step's released gradient, as ``DPMechanism`` returns it.

    Attributes:
      noised_gradients: ``s (sum_i clip(g_i) + z)`` per variable, ``z ~ N(0, (sigma C)^2 I)`` drawn once:
        the privatized data gradient (the only part that depends on the data).
      regularization_gradients: the gradient of ``sum(model.losses)`` per variable (data-independent, not
        clipped), or None when there is none (the loss-vector path, or a model without ``model.losses``).
      clipped: the ``tfdpbnn.clipping.ClippedGradients`` the noise was added to (per-example losses and
        norms, the model's output for metrics).
    """

    noised_gradients: list[tf.Tensor]
    regularization_gradients: list[tf.Tensor] | None
    clipped: ClippedGradients

    @property
    def gradients(self) -> list[tf.Tensor]:
        """DP-SGD's update direction: ``noised_gradients + regularization_gradients``."""
        return add_regularization(self.noised_gradients, self.regularization_gradients)


def _read(value: Scalar) -> tf.Tensor:
    """A mechanism parameter as a float32 scalar tensor (numbers, tensors, variables, callables)."""
    if callable(value) and not _private_api.is_variable(value):
        value = value()
    return tf.cast(value, tf.float32)


def _number(value: Scalar) -> float:
    """A mechanism parameter as a Python float (for the ``DpEvent``), outside any traced function."""
    if callable(value) and not _private_api.is_variable(value):
        value = value()
    if isinstance(value, numbers.Real):
        return float(value)
    with tf.init_scope():
        return float(value.numpy() if _private_api.is_variable(value) else tf.get_static_value(value))


class DPMechanism:
    """The sampled Gaussian mechanism on per-example gradients (Abadi et al. 2016, Algorithm 1).

    Args:
      l2_norm_clip: C > 0, the bound on each example's data-gradient L2 norm.
      noise_multiplier: sigma >= 0; the noise added to the clipped sum is ``N(0, (sigma C)^2 I)``.
      expected_batch_size: B > 0, the expected (Poisson) or fixed batch size; the released gradient is
        divided by it, never by the realized size.
      scale: the constant s the noised sum is multiplied by; default ``1 / expected_batch_size`` (DP-SGD).
        DP-SGLD uses ``n / B`` (Zhang et al. 2022). It is folded into the clip factors, so it costs no pass.
      clipping_method: "auto" (a registered per-layer rule for every variable, else the jacobian with one
        warning), "ghost" or "jacobian" (``tfdpbnn.clipping.clipped_gradients``).
      secure_mode: seed every step's noise from ``os.urandom`` (None: the process-wide
        ``tfdpbnn.privacy.noise.secure_mode()``). Otherwise the noise comes from this mechanism's
        ``noise_key``: a key from ``os.urandom`` (fresh at every ``new_run``) and a step counter, never from a
        seed set in the process, a checkpoint or a config (``tfdpbnn.privacy.noise``).
      debug_noise_seed: None (default), or an integer in [0, 2^63) that makes the noise replayable from it,
        for debugging only: whoever knows the seed can subtract the noise, so no epsilon holds (an
        optimizer's privacy statement then says ``"guarantee": false``). Not with ``secure_mode=True``.
      neighboring: "add_or_remove" (sensitivity C) or "replace_one" (2C), for ``step_event``.
      on_batch: optional ``f(realized_batch_size)`` run inside the step for every clipped batch (the
        optimizers count the examples they really saw with it).

    ``l2_norm_clip``, ``noise_multiplier``, ``expected_batch_size`` and ``scale`` may be numbers, scalar
    tensors or ``tf.Variable`` (read at every step, so an optimizer's restored state is what runs) or
    functions of no arguments returning one.

    Under ``tf.distribute`` (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``) only the replica with
    global id 0 adds the noise, so the all-reduced sum of the replicas' gradients holds exactly one draw.
    """

    def __init__(self, l2_norm_clip: Scalar, noise_multiplier: Scalar, expected_batch_size: Scalar, *,
                 scale: Scalar = None, clipping_method: str = "auto", secure_mode: bool | None = None,
                 debug_noise_seed: int | None = None, neighboring: str = "add_or_remove",
                 on_batch: Callable[[tf.Tensor], None] | None = None) -> None:
        if isinstance(l2_norm_clip, numbers.Real):
            l2_norm_clip = check_positive("l2_norm_clip", l2_norm_clip)
        if isinstance(noise_multiplier, numbers.Real):
            noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        if isinstance(expected_batch_size, numbers.Real):
            expected_batch_size = check_positive("expected_batch_size", expected_batch_size)
        if isinstance(scale, numbers.Real):
            scale = check_positive("scale", scale)
        self.clipping_method = str(check_choice("clipping_method", clipping_method, CLIPPING_METHODS))
        if secure_mode is not None and not isinstance(secure_mode, bool):
            raise ValueError(f"secure_mode must be True, False or None, got {secure_mode!r}")
        debug_noise_seed = check_debug_noise_seed(debug_noise_seed, secure_mode)
        if debug_noise_seed is not None:
            warnings.warn(f"debug_noise_seed={debug_noise_seed}: the DP noise is replayable from this seed, "
                          "so no privacy guarantee holds (debugging only; the privacy statement says so)",
                          UserWarning, stacklevel=2)
        self.neighboring = str(check_choice("neighboring", neighboring, tuple(NEIGHBORING)))
        if on_batch is not None and not callable(on_batch):
            raise ValueError(f"on_batch must be a function of the realized batch size, got {on_batch!r}")
        self._clip = l2_norm_clip
        self._sigma = noise_multiplier
        self._batch = expected_batch_size
        self._scale = scale
        # A replayable seed is the user's explicit choice: the process-wide secure mode does not override it.
        self._secure = False if debug_noise_seed is not None else secure_mode
        self._on_batch = on_batch
        self.noise_key = NoiseKey(debug_noise_seed)
        # id -> tensor of every clipped sum released (``release``), held weakly: an id reused by a new tensor
        # after the old one is gone is not taken for it.
        self._released_sums: weakref.WeakValueDictionary[int, tf.Tensor] = weakref.WeakValueDictionary()

    @property
    def noise_replayable(self) -> bool:
        """Whether this mechanism's noise is replayable from ``debug_noise_seed`` (then: no guarantee)."""
        return self.noise_key.replayable

    def noise_seed(self) -> tf.Tensor:
        """A fresh [2] int64 seed from this mechanism's noise source, made where it is called (in the step).

        The key and counter (``noise_key``), or 16 bytes of ``os.urandom`` in secure mode; for noise drawn
        beside the release (SI-DPSGD's weight noise).
        """
        return step_seed(self._secure, self.noise_key)

    @staticmethod
    def noise_bounds(noise_multiplier: float) -> dict:
        """The Gaussian sampler's radius cut, for the privacy statement (``tfdpbnn.privacy.noise``).

        ``max_abs_noise_over_sigma_c``: no coordinate of the noise exceeds it times sigma C;
        ``tail_reveal_probability_per_step``: the per-step probability that the cut reveals an example at
        ``noise_multiplier`` (1 without noise).
        """
        return {"max_abs_noise_over_sigma_c": max_radius(),
                "tail_reveal_probability_per_step": (
                    tail_reveal_probability(noise_multiplier) if noise_multiplier > 0 else 1.0)}

    def new_run(self) -> None:
        """Start a new run: a fresh noise key from ``os.urandom`` (``NoiseKey.new_run``).

        The optimizers call it at every ``fit``, ``train_on_batch`` and ``begin_training``; a custom loop may
        call it before each run (the key drawn when the mechanism was built serves until then).
        """
        self.noise_key.new_run()

    # ------------------------------------------------------------------------------------ parameters
    @property
    def l2_norm_clip(self) -> float:
        """C, as a Python float."""
        return _number(self._clip)

    @property
    def noise_multiplier(self) -> float:
        """Sigma, as a Python float."""
        return _number(self._sigma)

    def scale(self) -> tf.Tensor:
        """The constant s the clipped sum and the noise are multiplied by (float32 scalar tensor)."""
        if self._scale is None:
            return 1.0 / _read(self._batch)
        return _read(self._scale)

    def noise_stddev(self) -> tf.Tensor:
        """``sigma C s``: the standard deviation of the noise on each coordinate of the released gradient."""
        return _read(self._sigma) * _read(self._clip) * self.scale()

    # -------------------------------------------------------------------------------------- clipping
    def clip_model(self, model: tf.keras.Model, x, y, sample_weight=None, *, loss_fn=None, var_list=None,
                   training: bool = True) -> ClippedGradients:
        """Run ``model`` on one batch and return the scaled, per-example-clipped data-gradient sum.

        ``loss_fn(y, y_pred, sample_weight) -> [batch]`` gives the per-example DATA losses (default: the
        model's compiled loss, unreduced: ``compiled_per_example_loss_fn``);
        ``model.losses`` are the data-independent regularization, differentiated beside it and never
        clipped. No noise is added here: ``release`` adds it.
        """
        if loss_fn is None:
            loss_fn = compiled_per_example_loss_fn(model)
        clip = _read(self._clip)
        if _audit_bug("clip-1.5x"):  # AUDIT BUG: examples clipped to a multiple of the C the noise assumes
            clip = clip * _audit_bug("clip-1.5x")
        if _audit_bug("double-count"):  # AUDIT BUG: the batch's last example counted twice
            x, y, sample_weight = tf.nest.map_structure(
                lambda a: a if a is None else tf.concat([a, a[-1:]], 0), (x, y, sample_weight))
        result = clipped_gradients(model, x, y, sample_weight, loss_fn, clip, var_list=var_list,
                                   training=training, method=self.clipping_method, sum_scale=self.scale())
        layer_type = _audit_bug("unclipped-layer")
        if layer_type:
            variables = model.trainable_variables if var_list is None else list(var_list)
            raw = _unclipped_layer_sums(model, x, y, sample_weight, loss_fn, variables, training,
                                        self.scale(), layer_type)
            result = dataclasses.replace(result, clipped_sum=[
                g if r is None else r for g, r in zip(result.clipped_sum, raw, strict=True)])
        if not model.losses:
            result = dataclasses.replace(result, regularization_grads=None)
        self._count(result.per_example_loss)
        return result

    def clip_losses(self, per_example_loss, var_list, tape: tf.GradientTape) -> ClippedGradients:
        """The scaled, clipped sum of the gradients of ``per_example_loss`` ``[batch]`` recorded on ``tape``.

        Every term of ``per_example_loss`` is clipped (any regularization added into it too); the per-example
        gradients come from ``tape.jacobian``, so this works for any model and loss.
        """
        per_example_loss = tf.convert_to_tensor(per_example_loss)
        if per_example_loss.shape.rank == 0:
            raise ValueError(
                "per_example_loss: got an already-reduced scalar loss, which cannot be clipped per example. "
                "Pass the vector of shape [batch], e.g. tf.keras.losses.SparseCategoricalCrossentropy("
                "reduction='none')(y, y_pred).")
        var_list = tf.nest.flatten(var_list)
        scaled_sum, norms = jacobian_clipped_sum(per_example_loss, tape, var_list, _read(self._clip),
                                                 sum_scale=self.scale())
        loss = per_example_loss
        if loss.shape.rank is not None and loss.shape.rank > 1:
            loss = tf.reduce_mean(tf.reshape(loss, [tf.shape(loss)[0], -1]), axis=1)
        self._count(loss)
        return ClippedGradients(y_pred=None, clipped_sum=scaled_sum, regularization_grads=None,
                                per_example_loss=loss, per_example_norms=norms,
                                regularization_loss=tf.constant(0.0))

    def _count(self, per_example_loss) -> None:
        if self._on_batch is not None:
            self._on_batch(tf.shape(per_example_loss)[0])

    # ----------------------------------------------------------------------------------------- noise
    def noise_like(self, tensors) -> list[tf.Tensor]:
        """One draw of ``N(0, (sigma C s)^2)`` shaped like each tensor (one fused draw for all of them)."""
        stddev = self.noise_stddev()
        if _audit_bug("noise-2/3"):  # AUDIT BUG: less noise than the accountant assumes
            stddev = stddev * _audit_bug("noise-2/3")
        if _audit_bug("reused-seed"):  # AUDIT BUG: every draw from the same seed
            return gaussian_noise_like(tensors, stddev, tf.constant([1, 2], tf.int64), across_replicas=True)
        return gaussian_noise_like(tensors, stddev, secure=self._secure, across_replicas=True,
                                   key=self.noise_key)

    def release(self, clipped: ClippedGradients) -> DPGradients:
        """Add the step's one noise draw to a clipped sum from ``clip_model`` or ``clip_losses``.

        A clipped sum is released once: each release is a Gaussian mechanism on the batch, and the ledger
        counts one per clipped batch (``on_batch``), so a second release of the same sum (a fresh draw on
        the same examples, counted nowhere) raises ``ValueError``; clip again for another step.
        """
        # By the sum's tensors, not the container: a copy of it (dataclasses.replace, copy.copy) holds them.
        sums = [t for t in clipped.clipped_sum if isinstance(t, tf.Tensor)]
        if any(self._released_sums.get(id(t)) is t for t in sums):
            raise ValueError(
                "clipped: this clipped sum was released already; each release adds a fresh noise draw on the "
                "same examples, a DP step of its own that the ledger counts once per clipped batch. Clip the "
                "batch again (clip_model, clip_losses) for another step.")
        for t in sums:
            self._released_sums[id(t)] = t
        noise = self.noise_like(clipped.clipped_sum)
        noised = [g + z for g, z in zip(clipped.clipped_sum, noise, strict=True)]
        return DPGradients(noised_gradients=noised, regularization_gradients=clipped.regularization_grads,
                           clipped=clipped)

    def privatize_model(self, model: tf.keras.Model, x, y, sample_weight=None, *, loss_fn=None,
                        var_list=None, training: bool = True) -> DPGradients:
        """``release(clip_model(...))``: one DP step's gradient for ``model`` on one batch."""
        return self.release(self.clip_model(model, x, y, sample_weight, loss_fn=loss_fn, var_list=var_list,
                                            training=training))

    def privatize_losses(self, per_example_loss, var_list, tape: tf.GradientTape) -> DPGradients:
        """``release(clip_losses(...))``: one DP step's gradient from per-example losses on a tape."""
        return self.release(self.clip_losses(per_example_loss, var_list, tape))

    # ------------------------------------------------------------------------------------ accounting
    def step_event(self, sample_rate: float | None = None) -> dp_accounting.DpEvent:
        """The ``DpEvent`` of one release (``tfdpbnn.record.ledger.step_event``).

        With ``sample_rate`` q the batch was Poisson-sampled (each example independently with probability
        q, as ``tfdpbnn.data.poisson_batches`` draws it): ``PoissonSampledDpEvent(q, GaussianDpEvent)``.
        Without it, the event of one participation (no amplification): compose it once per step in which
        an example may appear.
        """
        if sample_rate is not None:
            sample_rate = check_sample_rate("sample_rate", sample_rate)
        return step_event(self.noise_multiplier, self.neighboring, sample_rate)


__all__ = ["DPGradients", "DPMechanism", "add_regularization"]
