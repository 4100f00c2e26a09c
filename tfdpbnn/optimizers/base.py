"""The machinery every tfdpbnn DP optimizer shares (DP-SGD, Abadi et al. 2016, Algorithm 1).

``DPOptimizerMixin`` sits in front of one of tensorflow-privacy's vectorized Keras optimizers
(``VectorizedDPKerasSGDOptimizer``, ``VectorizedDPKerasAdamOptimizer``), so each public optimizer IS one of
them, and replaces their gradient step with:

  g = (sum_i min(1, C/||g_i||) g_i + N(0, (sigma C)^2 I)) / B  +  grad(regularization)

where ``g_i`` is the gradient of example i's DATA loss, ``B`` the EXPECTED batch size (a constant, so the
division is post-processing; docs/soundness.md, finding 4) and the regularization (``model.losses``: KL terms,
priors,
weight decay) is data-independent and never clipped (docs/soundness.md, finding 5). What accounting needs
(sigma, C, the
sample rate, the sampling scheme, the neighboring relation) lives in non-trainable optimizer variables (so
``tf.train.Checkpoint`` and ``model.save`` carry it) and in ``get_config``; the number of steps is
``optimizer.iterations``.
"""

from __future__ import annotations

import math

import tensorflow as tf
from keras.src.engine import data_adapter

from tfdpbnn.clipping import check_per_example_independence, clip_factors, clipped_gradients
from tfdpbnn.clipping.jacobian import scaled_factors
from tfdpbnn.optimizers.noise import gaussian_noise_like
from tfdpbnn.optimizers.per_example_loss import compiled_per_example_loss_fn

SAMPLING = ("shuffle", "poisson")
NEIGHBORING = ("add_or_remove", "replace_one")
from tfdpbnn.clipping.engine import METHODS as CLIPPING_METHODS  # noqa: E402
from tfdpbnn.privacy import available_accountants  # noqa: E402
from tfdpbnn.privacy._checks import (  # noqa: E402
    check_choice,
    check_nonnegative,
    check_nonnegative_int,
    check_open_unit,
    check_positive,
    check_positive_int,
)


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Steps in one epoch: ``ceil(n / B)`` (model.fit's batches on arrays; ``poisson_batches``'s default)."""
    return int(math.ceil(num_examples / batch_size))


def add_regularization(grads, regularization_grads):
    """``g + r`` per variable; ``grads`` unchanged when ``regularization_grads`` is None (no model.losses)."""
    if regularization_grads is None:
        return list(grads)
    return [g + tf.cast(r, g.dtype) for g, r in zip(grads, regularization_grads, strict=True)]


def _check_accountable(accountant, sampling, neighboring, sample_rate) -> None:
    """Refuse a (sampling, neighboring) pair the accountant cannot bound, before any step is taken."""
    import dp_accounting

    from tfdpbnn import privacy

    try:
        privacy.compute_epsilon(1.0, sample_rate, 1, 1e-5, accountant=accountant, neighboring=neighboring,
                                sampling=sampling)
    except dp_accounting.UnsupportedEventError as err:
        raise ValueError(
            f"neighboring: accountant {accountant!r} cannot bound sampling={sampling!r} under "
            f"neighboring={neighboring!r} ({err}); use neighboring='add_or_remove' or sampling='shuffle'"
        ) from err


def _check_data_independent_losses(model) -> None:
    """``model.losses`` skip clipping, so none may depend on the data: refuse activity regularizers."""
    for layer in model.submodules:
        if getattr(layer, "activity_regularizer", None) is not None:
            raise ValueError(
                f"model: layer {layer.name!r} has an activity_regularizer, a loss on the layer's outputs "
                "that depends on the private examples; DP optimizers add model.losses unclipped, so it "
                "would break the guarantee. Remove it (or put the term into the compiled per-example loss).")


class DPOptimizerMixin:
    """DP-SGD step, accounting state and privacy statement shared by every tfdpbnn DP optimizer.

    Args:
      l2_norm_clip: clip bound C > 0 on each example's data-loss gradient norm.
      noise_multiplier: sigma >= 0 (noise std sigma*C on the clipped sum). Give it, OR a budget.
      epsilon, delta: a budget; sigma is then calibrated with ``tfdpbnn.privacy.calibrate_noise`` for
        ``epochs`` epochs of ``ceil(num_examples / batch_size)`` steps. ``delta`` is also the delta the
        privacy statement reports.
      num_examples: n, the training set size (sample rate q = batch_size / n).
      batch_size: the EXPECTED batch size B (Poisson) or the batch size (shuffle); the noised sum is divided
        by it, never by the realized size.
      epochs: training length used for calibration.
      accountant: a ``tfdpbnn.privacy`` accountant name ("rdp" default).
      sampling: "shuffle" (fixed-size shuffled batches, what ``model.fit`` on arrays does; accounted without
        amplification) or "poisson" (``tfdpbnn.data.poisson_batches``).
      neighboring: "add_or_remove" or "replace_one".
      clipping_method: forwarded to ``tfdpbnn.clipping.clipped_gradients``.
      initial_steps: steps already taken (``get_config`` records ``optimizer.iterations`` so a model loaded
        from any save format keeps counting its privacy loss from there).
      base_kwargs: base optimizer arguments whose names clash with ours (Adam's ``epsilon``).
      **kwargs: the base Keras optimizer's arguments (learning_rate, momentum, ...).
    """

    _dp_method = "DP-SGD"
    _DP_KEYS = ("l2_norm_clip", "noise_multiplier", "delta", "num_examples", "batch_size", "epochs",
                "accountant", "sampling", "neighboring", "clipping_method")

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, epsilon=None, delta=None, num_examples=None,
                 batch_size=None, epochs=None, accountant="rdp", sampling="shuffle",
                 neighboring="add_or_remove", clipping_method="auto", initial_steps=0, base_kwargs=None,
                 **kwargs):
        clip = check_positive("l2_norm_clip", l2_norm_clip)
        if batch_size is None:
            raise ValueError("batch_size is required: the expected batch size B the noised sum is divided by")
        batch_size = check_positive_int("batch_size", batch_size)
        if num_examples is None:
            raise ValueError("num_examples is required: the training set size n, for the sample rate B/n")
        num_examples = check_positive_int("num_examples", num_examples)
        if batch_size > num_examples:
            raise ValueError(f"batch_size must be <= num_examples ({num_examples}), got {batch_size}")
        sampling = check_choice("sampling", sampling, SAMPLING)
        neighboring = check_choice("neighboring", neighboring, NEIGHBORING)
        clipping_method = check_choice("clipping_method", clipping_method, CLIPPING_METHODS)
        accountant = check_choice("accountant", accountant, available_accountants())
        if delta is not None:
            delta = check_open_unit("delta", delta)
        if epochs is not None:
            epochs = check_positive_int("epochs", epochs)
        initial_steps = check_nonnegative_int("initial_steps", initial_steps)
        has_budget = epsilon is not None
        if (noise_multiplier is None) == (not has_budget):
            raise ValueError(
                "noise_multiplier and epsilon: give exactly one of them (noise_multiplier=sigma, or a budget "
                f"epsilon=..., delta=... with num_examples, batch_size, epochs); got noise_multiplier="
                f"{noise_multiplier!r}, epsilon={epsilon!r}")
        sample_rate = batch_size / num_examples
        _check_accountable(accountant, sampling, neighboring, sample_rate)
        if has_budget:
            epsilon = check_positive("epsilon", epsilon)
            if delta is None:
                raise ValueError("delta is required with epsilon (a budget is (epsilon, delta)), got None")
            if epochs is None:
                raise ValueError("epochs is required with epsilon: calibration needs the number of steps")
            noise_multiplier = self._calibrate_noise_multiplier(
                epsilon, delta, sample_rate, epochs * steps_per_epoch(num_examples, batch_size), accountant,
                neighboring, sampling)
        noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        self._dp_target_epsilon = epsilon
        super().__init__(l2_norm_clip=clip, noise_multiplier=noise_multiplier, num_microbatches=None,
                         unconnected_gradients_to_zero=True, **kwargs, **(base_kwargs or {}))
        self._dp_static = {"delta": None if delta is None else float(delta), "num_examples": num_examples,
                           "epochs": epochs, "accountant": accountant, "sampling": sampling,
                           "neighboring": neighboring, "clipping_method": clipping_method}
        self._dp_checked_models = set()
        with tf.init_scope():
            self._dp_noise_multiplier = self._dp_variable("dp_noise_multiplier", noise_multiplier)
            self._dp_l2_norm_clip = self._dp_variable("dp_l2_norm_clip", clip)
            self._dp_batch_size = self._dp_variable("dp_batch_size", float(batch_size))
            self._dp_sample_rate = self._dp_variable("dp_sample_rate", sample_rate)
            # Create the step counter now (Keras creates it lazily); a restored optimizer starts from the
            # steps already taken (Keras's SavedModel loader rebuilds optimizers from config only).
            self.iterations.assign(initial_steps)

    # ----------------------------------------------------------------------------------------- state
    def _f32(self, variable):
        """A float64 accounting variable as the float32 the training graph uses."""
        return tf.cast(variable, tf.float32)

    def _dp_variable(self, name, value, dtype=tf.float64):
        return self.add_weight(name, shape=[], dtype=dtype, initializer=tf.keras.initializers.Constant(value),
                               trainable=False)

    def _calibrate_noise_multiplier(self, epsilon, delta, sample_rate, steps, accountant, neighboring,
                                    sampling):
        from tfdpbnn import privacy

        return float(privacy.calibrate_noise(epsilon, delta, sample_rate, steps, accountant=accountant,
                                             neighboring=neighboring, sampling=sampling))

    @property
    def noise_multiplier(self) -> float:
        """sigma: the DP-SGD noise multiplier the accounting uses."""
        return float(self._dp_noise_multiplier.numpy())

    @property
    def l2_norm_clip(self) -> float:
        """C: the per-example clip bound."""
        return float(self._dp_l2_norm_clip.numpy())

    @property
    def batch_size(self) -> int:
        """B: the expected batch size."""
        return int(round(float(self._dp_batch_size.numpy())))

    @property
    def sample_rate(self) -> float:
        """q = B / n."""
        return self.batch_size / self.num_examples

    @property
    def num_examples(self) -> int:
        return self._dp_static["num_examples"]

    @property
    def sampling(self) -> str:
        return self._dp_static["sampling"]

    @property
    def neighboring(self) -> str:
        return self._dp_static["neighboring"]

    @property
    def accountant(self) -> str:
        return self._dp_static["accountant"]

    @property
    def delta(self):
        return self._dp_static["delta"]

    @property
    def steps(self) -> int:
        """Steps taken so far (``optimizer.iterations``)."""
        return int(self.iterations.numpy())

    def get_config(self):
        config = super().get_config()
        config.update(self._dp_static)
        config.update({"l2_norm_clip": self.l2_norm_clip, "noise_multiplier": self.noise_multiplier,
                       "batch_size": self.batch_size, "initial_steps": self.steps})
        return config

    # ------------------------------------------------------------------------------------ accounting
    def _resolve_delta(self, delta):
        delta = self.delta if delta is None else delta
        if delta is None:
            raise ValueError("delta: pass delta=... here or to the optimizer's constructor")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        return float(delta)

    def epsilon_after(self, steps, delta=None, accountant=None) -> float:
        """Epsilon after ``steps`` steps of this optimizer (DP-SGD's subsampled Gaussian, composed)."""
        from tfdpbnn import privacy

        delta = self._resolve_delta(delta)
        accountant = self.accountant if accountant is None else accountant
        if steps <= 0:
            return 0.0
        sigma = self.noise_multiplier
        if sigma == 0:
            return math.inf
        return float(privacy.compute_epsilon(sigma, self.sample_rate, int(steps), delta,
                                             accountant=accountant, neighboring=self.neighboring,
                                             sampling=self.sampling))

    def epsilon(self, delta=None, accountant=None) -> float:
        """Epsilon spent so far (steps = ``optimizer.iterations``), an upper bound for the code that ran."""
        return self.epsilon_after(self.steps, delta=delta, accountant=accountant)

    def privacy_statement(self, delta=None) -> dict:
        """What a reader needs to check the guarantee; ``tfdpbnn.export_saved_model`` saves it as JSON."""
        from tfdpbnn import privacy

        delta = self._resolve_delta(delta)
        import dp_accounting

        by_accountant = {}
        for name in privacy.sound_accountants():
            try:
                by_accountant[name] = self.epsilon(delta=delta, accountant=name)
            except dp_accounting.UnsupportedEventError:
                by_accountant[name] = None  # this accountant cannot bound this run's event

        return {
            "method": self._dp_method,
            "optimizer": type(self).__name__,
            "accountant": self.accountant,
            "epsilon": self.epsilon(delta=delta),
            "delta": delta,
            "noise_multiplier": self.noise_multiplier,
            "l2_norm_clip": self.l2_norm_clip,
            "sample_rate": self.sample_rate,
            "batch_size": self.batch_size,
            "num_examples": self.num_examples,
            "sampling": self.sampling,
            "steps": self.steps,
            "neighboring": self.neighboring,
            "epsilon_by_accountant": by_accountant,
            **self._dp_statement_extras(),
        }

    def _dp_statement_extras(self) -> dict:
        return {}

    # ------------------------------------------------------------------------------ the DP gradient
    def _dp_sum_scale(self):
        """The constant the clipped sum is multiplied by: ``1 / B`` (B the expected batch size).

        The engine folds it into the clip factors (``clipped_gradients(sum_scale=...)``), so the division
        costs no pass over the gradients; the noise is drawn already scaled (``_dp_noise``).
        """
        return 1.0 / self._f32(self._dp_batch_size)

    def _dp_noise(self, scaled_sum):
        """``N(0, (sigma C s)^2)`` shaped like each variable, ``s = _dp_sum_scale()``: the noise of
        ``sum + N(0, (sigma C)^2 I)``, scaled with the sum; one fused draw (``gaussian_noise_like``)."""
        stddev = self._f32(self._dp_noise_multiplier * self._dp_l2_norm_clip) * self._dp_sum_scale()
        return gaussian_noise_like(scaled_sum, stddev)

    def _dp_noised_mean(self, scaled_sum):
        """``(sum + N(0, (sigma C)^2)) s`` per variable from ``scaled_sum = sum s``, ``s = _dp_sum_scale()``
        (DP-SGD: ``s = 1 / B``): noise once per step, constant scale."""
        return [g + z for g, z in zip(scaled_sum, self._dp_noise(scaled_sum), strict=True)]

    def _dp_gradients(self, scaled_sum, regularization_grads, var_list):
        """The gradient handed to the base optimizer's update (DP-SGD: noised mean + regularization).

        ``scaled_sum``: the clipped sum times ``_dp_sum_scale()``; ``regularization_grads``: one tensor per
        variable, or None when the model has no ``model.losses``.
        """
        return add_regularization(self._dp_noised_mean(scaled_sum), regularization_grads)

    def _dp_before_step(self, model):
        """Hook run before the forward pass of each step (SI-DPSGD sets the weight noise here)."""

    def _dp_extra_logs(self, model):
        """Extra scalars for the Keras logs (DPVD's zeta and alpha)."""
        return {}

    def dp_train_step(self, model, data):
        """The DP ``Model.train_step``: what ``model.fit`` runs when this optimizer is compiled in."""
        x, y, sample_weight = data_adapter.unpack_x_y_sample_weight(data)
        if id(model) not in self._dp_checked_models:
            check_per_example_independence(model)
            _check_data_independent_losses(model)
            self._dp_checked_models.add(id(model))
        self._dp_before_step(model)
        var_list = model.trainable_variables
        result = clipped_gradients(
            model, x, y, sample_weight, compiled_per_example_loss_fn(model), self._f32(self._dp_l2_norm_clip),
            var_list=var_list, training=True, method=self._dp_static["clipping_method"],
            sum_scale=self._dp_sum_scale())
        regularization_grads = result.regularization_grads if model.losses else None
        grads = self._dp_gradients(result.clipped_sum, regularization_grads, var_list)
        self._was_dp_gradients_called = True
        self.apply_gradients(zip(grads, var_list, strict=True))
        realized = tf.cast(tf.shape(result.per_example_loss)[0], tf.float32)
        data_loss = tf.math.divide_no_nan(tf.reduce_sum(result.per_example_loss), realized)
        total_loss = data_loss + tf.cast(result.regularization_loss, tf.float32)
        loss_mean = getattr(model.compiled_loss, "_total_loss_mean", None)
        if loss_mean is not None:
            loss_mean.update_state(total_loss, sample_weight=realized)
        logs = model.compute_metrics(x, y, result.y_pred, sample_weight)
        logs = dict(logs)
        logs.setdefault("loss", total_loss)
        logs.update(self._dp_extra_logs(model))
        return logs

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """``optimizer.minimize(loss, vars, tape=tape)`` from a custom train step (tf-privacy's contract).

        ``loss`` must be a per-example loss VECTOR ``[batch]`` (or ``[batch, ...]``, averaged per example);
        every term in it is clipped, including any regularization added to it. A scalar raises.
        """
        if not callable(loss) and tape is None:
            raise ValueError("tape: a GradientTape is required when a Tensor loss is passed to minimize")
        tape = tape if tape is not None else tf.GradientTape()
        if callable(loss):
            with tape:
                if not callable(var_list):
                    tape.watch(var_list)
                loss = loss()
                if callable(var_list):
                    var_list = var_list()
        var_list = tf.nest.flatten(var_list)
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank == 0:
            raise ValueError(
                f"loss: {type(self).__name__} received an already-reduced scalar loss, which cannot be "
                "clipped per example, so training would not be private. Pass the per-example loss vector of "
                "shape [batch] (e.g. tf.keras.losses.SparseCategoricalCrossentropy(reduction='none')(y, "
                "y_pred)) to optimizer.minimize(loss, var_list, tape=tape), or do not override train_step: "
                "model.fit's train step builds per-example losses from model.compile(loss=...).")
        with tape:
            batch = tf.shape(loss)[0]
            per_example = tf.reduce_mean(tf.reshape(loss, [batch, -1]), axis=1)
        jacobians = tape.jacobian(per_example, var_list, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        squared = [tf.reduce_sum(tf.reshape(tf.square(j), [batch, -1]), axis=1) for j in jacobians]
        factors = clip_factors(tf.sqrt(tf.add_n(squared)), self._f32(self._dp_l2_norm_clip))
        factors = scaled_factors(factors, self._dp_sum_scale())
        scaled_sum = [tf.tensordot(factors, j, axes=1) for j in jacobians]
        self._was_dp_gradients_called = True
        grads = self._dp_gradients(scaled_sum, None, var_list)
        return list(zip(grads, var_list, strict=True))

    def get_gradients(self, loss, params):
        raise ValueError("loss/params: graph-mode get_gradients is not supported by tfdpbnn DP optimizers; "
                         "use model.fit or optimizer.minimize(per_example_loss, var_list, tape=tape)")
