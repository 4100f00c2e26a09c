"""SI-DPSGD (Davody et al. 2020, Algorithms 1 and 2) for ``NoisyDense`` / ``NoisyConv2D`` models.

Each step sets every noisy layer's weight-noise std to ``s_t = eta_t C z / B`` (Algorithm 1, line 4), so the
forward pass uses ``theta_t = mu_t + s_t xi``. By default mu is updated with the NOISED clipped mean, so
the mu sequence is DP-SGD's and the theta's are post-processing: the DP-SGD guarantee holds.

``paper_mean_update=True`` updates mu with the clean clipped mean, as the paper does. Then the paper's
Lemma 4.1 does not hold (docs/soundness.md, finding 1): given the released weights theta_0..theta_t, mu_t
moves by up to
``Delta_t = (C'/B) sum_{k<t} eta_k`` when one example changes (C' = C, or 2C for replace-one), with no
subsampling amplification, so releasing theta_t is a Gaussian mechanism with noise multiplier
``s_t / Delta_t``. Adaptive composition of Gaussian mechanisms is exactly mu-GDP with
``mu = sqrt(sum_t (Delta_t / s_t)^2)`` (Dong, Roth & Su 2019, Corollary 3.3), converted exactly to
(epsilon, delta) (their Corollary 2.13). That is the epsilon this mode reports, counting every training
step's sample and the exported sample.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import tensorflow as tf

from tfdpbnn import _private_api
from tfdpbnn._validation import check_nonnegative
from tfdpbnn.optimizers.dpsgd import DPSGDOptimizer
from tfdpbnn.optimizers.mechanism import add_regularization
from tfdpbnn.privacy.gdp import gdp_epsilon
from tfdpbnn.record import attributes


def _noisy_layers(model):
    return [layer for layer in _private_api.submodules(model)
            if _private_api.is_variable(getattr(layer, "noise_stddev", None))
            and hasattr(layer, "sample_weights_into_kernel")]


#: Why weights that are paper mode's mean mu (not a released sample) carry no guarantee in the record.
PAPER_MEAN_UNCOVERED = (
    "the weights are the mean mu of SIDPOptimizer(paper_mean_update=True) (SI-DPSGD paper mode), trained "
    "with the clipped gradients without noise; no epsilon covers them, only the sample that "
    "optimizer.release_weights(model) draws")


@tf.keras.utils.register_keras_serializable(package="tfdpbnn")
class SIDPOptimizer(DPSGDOptimizer):
    """SI-DPSGD, noisy weights (Davody et al. 2020, Alg. 1; Alg. 2 with ``PublicBatchNormalization``).

    Args as ``DPSGDOptimizer``; ``noise_multiplier`` is the paper's z. ``paper_mean_update``: update mu
    with the clean clipped gradient (Davody et al. 2020) and report the epsilon that holds for that (module
    doc), with a warning. Call ``release_weights(model)`` before export: it replaces each mu by one sample.
    ``weight_noise``: a constant weight-noise std s >= 0 used instead of ``s_t = eta_t C z / B`` (sound mode
    only: there mu is DP-SGD's sequence and every theta_t is post-processing of it, so any s keeps the
    guarantee; paper mode's accounting depends on s_t, so it refuses this option).
    ``initial_mean_sensitivity``, ``initial_gdp_mu_squared``: paper-mode accounting state (``get_config``
    records it, so a reloaded optimizer keeps counting).
    """

    _dp_method = "SI-DPSGD"
    #: Sets every noisy layer's ``noise_stddev`` at every step (the state checks leave it out).
    _dp_sets_layer_state = True

    def __init__(self, l2_norm_clip, noise_multiplier=None, *, paper_mean_update=False, weight_noise=None,
                 target_epsilon=None, delta=None, num_examples=None, batch_size=None, epochs=None,
                 accountant="rdp", sampling="shuffle", neighboring="add_or_remove", clipping_method="auto",
                 allow_exceeding_budget=False, secure_mode=False, learning_rate=0.01, momentum=0.0,
                 nesterov=False,
                 name="SIDPOptimizer", initial_mean_sensitivity=0.0, initial_gdp_mu_squared=0.0, **kwargs):
        if not isinstance(paper_mean_update, bool):
            raise ValueError(f"paper_mean_update must be True or False, got {paper_mean_update!r}")
        if weight_noise is not None:
            if paper_mean_update:
                raise ValueError("weight_noise: a constant weight-noise std is allowed in the sound mode "
                                 "only; with paper_mean_update=True the accounting needs s_t = eta_t C z / B")
            weight_noise = check_nonnegative("weight_noise", weight_noise)
        if paper_mean_update and (momentum or nesterov):
            # The mean's sensitivity the accounting adds per step, eta C / B, is plain SGD's: with momentum
            # m one example moves the mean by up to eta C / B (1 - m^j) / (1 - m) after j steps.
            raise ValueError(f"momentum: paper_mean_update=True accounts for plain SGD updates of the mean "
                             f"(momentum 0, nesterov False); got momentum={momentum!r}, "
                             f"nesterov={nesterov!r}")
        self.weight_noise = weight_noise
        super().__init__(l2_norm_clip, noise_multiplier, target_epsilon=target_epsilon, delta=delta,
                         num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                         accountant=accountant, sampling=sampling, neighboring=neighboring,
                         clipping_method=clipping_method, allow_exceeding_budget=allow_exceeding_budget,
                         secure_mode=secure_mode,
                         learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, name=name,
                         **kwargs)
        self.paper_mean_update = paper_mean_update
        self._sidp_layers = None
        self._sidp_released_at_step = None
        with tf.init_scope():
            # Sensitivity of mu (Delta_t) and sum_t (Delta_t / s_t)^2 over the releases so far.
            self._sidp_delta = self._dp_variable("sidp_mean_sensitivity", float(initial_mean_sensitivity))
            self._sidp_mu_squared = self._dp_variable("sidp_gdp_mu_squared", float(initial_gdp_mu_squared))
        if paper_mean_update:
            warnings.warn(
                "SIDPOptimizer(paper_mean_update=True): mu is updated with un-noised clipped gradients as in "
                "Davody et al. (2020), whose per-step guarantee (Lemma 4.1) does not hold: given the "
                "released weights, "
                "mu_t's sensitivity grows with t. The epsilon reported is the GDP composition of the "
                "releases theta_t = mu_t + s_t xi with sensitivity Delta_t (no amplification), "
                "typically far larger than the paper's.", UserWarning, stacklevel=2)

    def track_model(self, model):
        """Remember ``model``'s noisy layers (done by ``model.fit``; call it for custom training loops).

        In paper mode every trainable variable must be a noisy layer's ``kernel`` or ``bias``: the
        accounting covers the releases ``theta_t = mu_t + s_t xi``, and any other trainable variable (a
        plain ``Dense``, a normalization's scale and offset) would be updated with the clipped mean without
        noise and exported as it is.
        """
        layers = _noisy_layers(model)
        if not layers:
            raise ValueError("model: SIDPOptimizer needs NoisyDense/NoisyConv2D layers, found none")
        if self.paper_mean_update:
            noised = {id(v) for layer in layers for v in (layer.kernel, getattr(layer, "bias", None))
                      if v is not None}
            plain = [v.name for v in model.trainable_variables if id(v) not in noised]
            if plain:
                raise ValueError(
                    f"model: with paper_mean_update=True every trainable variable must be a noisy layer's "
                    f"kernel or bias, but {', '.join(plain[:3])}{' and more' if len(plain) > 3 else ''} "
                    "would be updated with the clipped mean without noise and released as it is, which the "
                    "paper mode's accounting does not cover. Make those layers noisy (NoisyDense, "
                    "NoisyConv2D), freeze them (trainable=False), or use paper_mean_update=False.")
        self._key_layer_noise(layers)
        self._sidp_layers = layers
        with tf.init_scope():  # Keras 2 creates the learning-rate variable at its first read: not in the step
            self.weight_noise_stddev()

    def _check_model(self, model, *args, **kwargs):
        """The DP optimizer's checks of ``model``, then ``track_model`` (refusing before the first step)."""
        super()._check_model(model, *args, **kwargs)
        self.track_model(model)

    def _check_fit_arguments(self, arguments: dict) -> None:
        """In paper mode, refuse validation in ``fit``: it evaluates the mean mu, which no epsilon covers.

        The noisy layers infer with mu (``training=False``), trained on un-noised clipped means: every
        epoch's ``val_loss`` and ``val_...`` metrics, even on public records, would release mu without noise
        (the History's last ``val_loss`` is mu's loss exactly), and a callback acting on them
        (``EarlyStopping``) would make the released sample's training depend on mu.
        """
        if not self.paper_mean_update:
            return
        given = [name for name, used in (("validation_data", arguments.get("validation_data") is not None),
                                         ("validation_split", bool(arguments.get("validation_split"))))
                 if used]
        if given:
            raise ValueError(
                f"{given[0]}: SIDPOptimizer(paper_mean_update=True) trains the mean mu without noise, and "
                "the noisy layers infer with mu, so validation in fit would evaluate mu every epoch: a "
                "release that no epsilon covers, even on public records (and callbacks acting on it would "
                "make the released sample depend on mu). Validate the released sample after "
                "release_weights, or use the sound mode (paper_mean_update=False).")

    def _key_layer_noise(self, layers):
        """Draw the layers' weight noise xi from this optimizer's noise key (``NoisyDense._noisy``).

        Never from TensorFlow's seeded generator: in paper mode xi is the privacy noise of the released
        theta_t.
        """
        for layer in layers:
            layer._tfdpbnn_noise_seed = self.mechanism.noise_seed

    def weight_noise_stddev(self):
        """The weight-noise std s_t of the noisy layers, a float32 scalar tensor.

        ``eta_t C z / B`` (Davody et al. 2020, Algorithm 1, line 4), or the constant ``weight_noise`` when
        one was given.
        """
        if self.weight_noise is not None:
            return tf.constant(self.weight_noise, tf.float32)
        return self._decayed_lr(tf.float32) * self._f32(
            self._dp_l2_norm_clip * self._dp_noise_multiplier / self._dp_batch_size)

    def _set_layer_noise(self):
        s = self.weight_noise_stddev()
        for layer in self._sidp_layers:
            layer.noise_stddev.assign(tf.cast(s, layer.noise_stddev.dtype))

    def _dp_before_step(self, model):
        if self._sidp_layers is None:
            self.track_model(model)
        self._set_layer_noise()

    def _dp_gradients(self, clipped, var_list):
        """Sound mode: DP-SGD's. Paper mode: the clipped mean without noise (+ regularization)."""
        if self._sidp_layers is None:
            raise ValueError("model: call optimizer.track_model(model) before a custom training loop")
        if not self.paper_mean_update:
            grads = super()._dp_gradients(clipped, var_list)
        else:
            # Account for the release theta_t = mu_t + s_t xi used by this step's forward pass.
            s = tf.cast(self._sidp_layers[0].noise_stddev, tf.float64)
            ratio = tf.math.divide_no_nan(self._sidp_delta, s)
            ratio = tf.where((s <= 0.0) & (self._sidp_delta > 0.0), tf.constant(np.inf, tf.float64), ratio)
            self._sidp_mu_squared.assign_add(tf.square(ratio))
            sensitivity = self._dp_l2_norm_clip * (2.0 if self.neighboring == "replace_one" else 1.0)
            self._sidp_delta.assign_add(
                tf.cast(self._decayed_lr(tf.float32), tf.float64) * sensitivity / self._dp_batch_size)
            grads = add_regularization(clipped.clipped_sum, clipped.regularization_grads)
        self._set_layer_noise()
        return grads

    def release_weights(self, model):
        """Replace each noisy layer's mean by one sample theta = mu + s xi (Davody et al. 2020 release it).

        The sample is drawn with the s the accounting composes (``weight_noise_stddev``: the learning rate
        at the step counter now), whatever the layers' ``noise_stddev`` holds: one set by hand
        (``set_noise_stddev(0)`` releases mu itself, which no epsilon covers in paper mode), or the last
        step's, which a learning-rate schedule may make smaller.
        """
        layers = _noisy_layers(model)
        self._key_layer_noise(layers)
        s = self.weight_noise_stddev()
        for layer in layers:
            layer.noise_stddev.assign(tf.cast(s, layer.noise_stddev.dtype))
            layer.sample_weights_into_kernel()
        self._sidp_released_at_step = self.steps
        self._dp_write_watch.note_post_processing()  # a sample around the DP-trained means: post-processing

    def _paper_mean_phase(self, phase_id):
        """The release without noise standing for paper mode's mean mu in the record (id of ``phase_id``)."""
        from tfdpbnn.record.ledger import WRITTEN_OUTSIDE_DP, Phase, derived_phase_id

        return Phase(kind="participations", noise_multiplier=0.0, neighboring=self.neighboring, steps=1,
                     participations=1, phase_id=derived_phase_id(f"sidp-paper-mean:{phase_id}"),
                     sampling=f"{WRITTEN_OUTSIDE_DP}: {PAPER_MEAN_UNCOVERED}")

    def _dp_uncovered_weights(self, phase_id):
        """Paper mode, before ``release_weights``: the model holds mu, which no epsilon covers."""
        if (not self.paper_mean_update or self._sidp_layers is None
                or self._sidp_released_at_step == self.steps):
            return None
        variables = [v for layer in self._sidp_layers for v in (layer.kernel, getattr(layer, "bias", None))
                     if v is not None]
        return self._paper_mean_phase(phase_id), variables

    def _dp_continues_uncovered(self, phase, held_ids) -> bool:
        """A paper-mode optimizer holding mu's phase and its accounting state (restored) goes on from mu."""
        return self.paper_mean_update and any(
            self._paper_mean_phase(i).phase_id == phase.phase_id for i in held_ids)

    def paper_mode_gdp_mu(self) -> float:
        """Mu of the GDP composition over all releases so far plus the final exported sample."""
        s = self.weight_noise_stddev().numpy()
        delta_now = float(self._sidp_delta.numpy())
        final = 0.0 if delta_now == 0 else (math.inf if s <= 0 else (delta_now / s) ** 2)
        return math.sqrt(float(self._sidp_mu_squared.numpy()) + final)

    def _dp_steps_accounted_as_dp_sgd(self) -> bool:
        """Paper mode accounts the released weights (exact GDP), not DP-SGD's steps."""
        return not self.paper_mean_update

    def _dp_phase_override(self, description, steps):
        """Paper mode: one Gaussian release of noise multiplier 1 / mu (exact GDP, module docstring)."""
        if not self.paper_mean_update:
            return None
        from tfdpbnn.privacy.budget import SENSITIVITY
        from tfdpbnn.record.ledger import Phase

        open_steps = attributes.ledger_state(self).open_steps()
        if steps == open_steps:
            mu = self.paper_mode_gdp_mu()
        else:
            z = self.noise_multiplier
            scale = 2.0 if self.neighboring == "replace_one" else 1.0
            mu = math.inf if z == 0 else scale * math.sqrt(steps * (steps + 1) * (2 * steps + 1) / 6.0) / z
        if steps <= 0 or mu == 0:
            return Phase(kind="participations", noise_multiplier=description["noise_multiplier"],
                         neighboring=description["neighboring"], steps=steps, participations=0,
                         sampling="SI-DPSGD paper mode: nothing released yet")
        sigma = 0.0 if not math.isfinite(mu) else SENSITIVITY[description["neighboring"]] / mu
        return Phase(kind="gaussian", noise_multiplier=sigma, neighboring=description["neighboring"],
                     steps=steps, num_examples=description["num_examples"],
                     sampling="SI-DPSGD paper mode: exact GDP composition of the released weights "
                              "(Dong, Roth & Su 2019)")

    def epsilon(self, delta=None, accountant=None):
        """Paper mode: the exact mu-GDP conversion of the ledger (all its releases are plain Gaussians)."""
        if self.paper_mean_update:
            mu = self.ledger.gaussian_mu()
            if mu is not None:
                return gdp_epsilon(mu, self._resolve_delta(delta))
        return super().epsilon(delta=delta, accountant=accountant)

    def epsilon_after(self, steps, delta=None, accountant=None):
        """Epsilon after ``steps`` steps: DP-SGD's (sound mode) or the paper mode's GDP composition."""
        if not self.paper_mean_update:
            return super().epsilon_after(steps, delta=delta, accountant=accountant)
        delta = self._resolve_delta(delta)
        if steps != self.steps:
            # Constant learning rate: Delta_t = t eta C'/B and s = eta C z/B, so mu^2 = sum_{t<=T} (t/z)^2.
            z = self.noise_multiplier
            if steps <= 0:
                return 0.0
            if z == 0:
                return math.inf
            scale = 2.0 if self.neighboring == "replace_one" else 1.0
            mu = scale * math.sqrt(steps * (steps + 1) * (2 * steps + 1) / 6.0) / z
            return gdp_epsilon(mu, delta)
        return gdp_epsilon(self.paper_mode_gdp_mu(), delta)

    def privacy_statement(self, delta=None, model=None):
        """As ``DPOptimizerMixin.privacy_statement``; in paper mode only after ``release_weights(model)``.

        ``tfdpbnn.export_saved_model`` asks for it, so mu, which is not private then, is never exported.
        """
        if self.paper_mean_update and self._sidp_released_at_step != self.steps:
            raise ValueError(
                "model: with paper_mean_update=True the model holds mu, which the reported epsilon does not "
                "cover; call optimizer.release_weights(model) after training and before export")
        statement = super().privacy_statement(delta=delta, model=model)
        if self.paper_mean_update:
            statement["accountant"] = "gdp-exact (Gaussian releases of theta_t; paper mean update)"
            epsilon = self.epsilon(delta=delta)
            if statement.get("guarantee", True):
                statement["epsilon"] = epsilon
            # else the statement holds no guarantee (replayable noise, state written outside the DP step):
            # its epsilon stays infinite, and the accountant's value is only reported beside it
            statement["spent"]["epsilon"] = epsilon
            statement["weights"] = dict(statement["spent"], phases=statement["phases"],
                                        note="paper mode: the released weights count everything spent")
            statement["epsilon_by_accountant"] = {"gdp_exact": epsilon}
            statement["gdp_mu"] = self.paper_mode_gdp_mu()
            statement["note"] = ("paper_mean_update=True: Davody et al. 2020, Lemma 4.1, does not hold; "
                                 "epsilon composes every released sample theta_t with sensitivity Delta_t")
        return statement

    def get_config(self):
        """The DP optimizer's config plus the SI-DPSGD options and the paper-mode accounting state."""
        config = super().get_config()
        config["paper_mean_update"] = self.paper_mean_update
        config["weight_noise"] = self.weight_noise
        config["initial_mean_sensitivity"] = float(self._sidp_delta.numpy())
        config["initial_gdp_mu_squared"] = float(self._sidp_mu_squared.numpy())
        return config
