"""The traced-step audit (tfdpbnn.audit.traced): fit's compiled train function, read through the update.

Seeded. The noise statistics are checked on simulated Gaussian noise against their stated laws (chi-square,
normal) and powers; the audit itself on honest models of several layer types (passes, and its
sensitivity search finds the clip bound C s in every variable), on hook mutations (tfdpbnn.audit.inject_bug)
and on a real source edit run in a subprocess (the noise seed frozen at trace time).
"""

import numpy as np
import pytest
import tensorflow as tf
from _tiers import slow_on_keras2

from tfdpbnn import optimizers as O
from tfdpbnn.audit import inject_bug
from tfdpbnn.audit.source_mutations import (
    SOURCE_MUTATIONS,
    PatchError,
    apply_mutation,
    mutated_copy,
    run_mutation,
)
from tfdpbnn.audit.traced import calls_for_power, method_traced_audit, noise_checks, std_power, traced_audit

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _noise(rng, k, dims, std=1.0):
    return [rng.normal(size=(k, d)) * std for d in dims]


def _flagged(findings, statistic):
    return any(f.flagged for f in findings if f.statistic.startswith(statistic))


def test_noise_statistics_pass_gaussian_noise_and_flag_each_defect():
    rng = np.random.default_rng(0)
    dims, k = [40, 5, 15, 3], 800
    names = [f"v{i}" for i in range(len(dims))]
    honest, powers = noise_checks(_noise(rng, k, dims), names, 1.0, 1e-3)
    assert not any(f.flagged for f in honest)
    assert powers["std 0.9x declared (smallest variable)"] > 0.99
    low = _noise(rng, k, dims)
    low[3] = low[3] * 0.85  # one small variable at 0.85x the declared std
    found, _ = noise_checks(low, names, 1.0, 1e-3)
    assert [f.variable for f in found if f.flagged] == ["v3"]
    dup = np.concatenate(_noise(rng, k, dims), axis=1)
    half = dup.shape[1] // 2
    dup[:, half:2 * half] = dup[:, :half]  # the second half of the draw repeats the first
    split = np.split(dup, np.cumsum(dims)[:-1], axis=1)
    found, _ = noise_checks(split, names, 1.0, 1e-3)
    assert _flagged(found, "max |z| coordinate") and not _flagged(found, "std")
    frozen = [np.repeat(z[:1], k, axis=0) for z in _noise(rng, k, dims)]  # the same noise at every call
    found, _ = noise_checks(frozen, names, 1.0, 1e-3)
    assert _flagged(found, "mean over calls") and _flagged(found, "max |z| correlation between calls")
    mixed = _noise(rng, k, dims)  # correlation 0.1 between consecutive calls, unit variance
    for z in mixed:
        z[1:] = np.sqrt(1 - 0.1 ** 2) * z[1:] + 0.1 * z[:-1]
    found, _ = noise_checks(mixed, names, 1.0, 1e-3)
    assert _flagged(found, "max |z| correlation between calls") and not _flagged(found, "std")


def test_calls_for_power_meets_its_power():
    k = calls_for_power([3, 100], 1e-3)
    per = 1e-3 / 4 / 2
    assert std_power(k * 3, per) >= 0.99 > std_power((k - 1) * 3, per)


# The audit runs on whole models (the compiled train step of a fit, called many times): with the other
# audits in the full suite on Keras 2; the mechanism and sensitivity they probe: test_optimizers_properties
@slow_on_keras2
@pytest.mark.parametrize("method", ["dpsgld", "dpvd"])
def test_honest_method_passes_with_the_clip_bound_reached(method):
    r = method_traced_audit(method, 1.0, calls=200, candidates=50, ascent=10)
    assert not r.flagged, r.summary()
    assert 0.99 < r.largest_contribution <= 1.002  # the clip bound binds, and is not exceeded
    stds = [f.value for f in r.findings if f.statistic == "std ratio"]
    assert len(stds) == len(r.largest_by_variable) and all(0.85 < s < 1.15 for s in stds)
    assert "cannot see" in r.summary()


def _conv_model():
    model = tf.keras.Sequential([tf.keras.Input((6, 6, 1)), tf.keras.layers.Conv2D(2, 3, activation="tanh"),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    x = np.random.default_rng(0).normal(size=(1, 6, 6, 1)).astype(np.float32)
    return model, x


def _embedding_model():
    model = tf.keras.Sequential([tf.keras.Input((4,), dtype="int32"), tf.keras.layers.Embedding(10, 3),
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    return model, np.array([[1, 2, 3, 4]], np.int32)


@slow_on_keras2   # an audit run (above)
@pytest.mark.parametrize("build", [_conv_model, _embedding_model])
def test_conv_and_embedding_models_pass_and_every_variable_is_reached(build):
    tf.keras.utils.set_random_seed(0)
    model, x = build()
    model.compile(optimizer=O.DPAdamOptimizer(1.0, 1.5, num_examples=40, batch_size=10), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    r = traced_audit(model, x, np.array([2]), calls=150, candidates=40, ascent=10)
    assert not r.flagged, r.summary()
    assert r.unreached == [] and 0.99 < r.largest_contribution <= 1.002
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))  # a copy ran
    assert model.optimizer.steps == 0


@slow_on_keras2   # an audit run (above)
@pytest.mark.parametrize("bug, check", [("noise-2/3", "noise"), ("clip-1.5x", "sensitivity")])
def test_hook_mutations_are_flagged_through_the_traced_step(bug, check):
    with inject_bug(bug):
        r = method_traced_audit("dpmcdropout", 1.0, calls=150, candidates=30, ascent=0)
    assert {f.check for f in r.flags} == {check}
    if check == "sensitivity":
        assert r.largest_contribution == pytest.approx(1.5, rel=2e-3)


def _dense_model(optimizer):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss=LOSS)
    return model, np.random.default_rng(0).normal(size=(1, 4)).astype(np.float32)


def _contribution_in_batch(model, x, y, row):
    """``||S(x) - S(x without row)|| / (C s)`` of the clipped sum at sigma 0 (the mechanism, eagerly)."""
    mechanism = O.DPMechanism(1.0, 0.0, len(x))
    keep = np.arange(len(x)) != row
    with_row = mechanism.clip_model(model, x, y).clipped_sum
    without = mechanism.clip_model(model, x[keep], y[keep]).clipped_sum
    diff = np.sqrt(sum(float(tf.reduce_sum((a - b) ** 2)) for a, b in zip(with_row, without, strict=True)))
    return diff * len(x)


@slow_on_keras2   # an audit run (above)
def test_clipping_that_couples_the_rows_of_a_batch_is_flagged(monkeypatch):
    # A planted clipping bug: every example's clip factor from the batch's mean gradient norm. For a batch of
    # one it is per-example clipping, which is all the sensitivity search used to try (a pass at 1.00).
    from tfdpbnn.clipping import ghost, jacobian

    honest = jacobian.clip_factors

    def batch_mean_factors(norms, l2_norm_clip):
        return honest(tf.broadcast_to(tf.reduce_mean(norms), tf.shape(norms)), l2_norm_clip)

    monkeypatch.setattr(ghost, "clip_factors", batch_mean_factors)
    model, x = _dense_model(O.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8))
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])  # uniform predictions: no saturation
    batch = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32) * 0.01
    batch[7] = 1000.0
    # The truth, measured on the mechanism: one example moves the clipped sum by about 8 C s in a batch of 8.
    assert _contribution_in_batch(model, batch, np.zeros(8, np.int64), 7) > 7.5
    r = traced_audit(model, x, np.array([1]), calls=64, candidates=40, ascent=10)
    assert {f.check for f in r.flags} == {"sensitivity"} and r.largest_contribution > 2.0, r.summary()


@slow_on_keras2   # an audit run (above)
def test_sample_weights_applied_after_clipping_are_flagged(monkeypatch):
    # A planted bug: the batch clipped without its sample weights, the clipped sum then scaled by the batch's
    # mean weight. At weight 1 it is the honest step (the search used only weights 0 and 1: a pass at 1.00).
    import dataclasses

    from tfdpbnn.optimizers import mechanism

    honest = mechanism.clipped_gradients

    def weighted_after_clipping(model, x, y, sample_weight, loss_fn, clip, **kwargs):
        result = honest(model, x, y, None, loss_fn, clip, **kwargs)
        if sample_weight is None:
            return result
        mean = tf.reduce_mean(tf.cast(sample_weight, tf.float32))
        return dataclasses.replace(result, clipped_sum=[g * mean for g in result.clipped_sum])

    monkeypatch.setattr(mechanism, "clipped_gradients", weighted_after_clipping)
    model, x = _dense_model(O.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8))
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    # The truth, measured on the mechanism: an example of sample weight 10 moves the sum by 10 C s.
    big = np.full((1, 4), 100.0, np.float32)
    moved = O.DPMechanism(1.0, 0.0, 1).clip_model(model, big, np.array([0]), np.array([10.0])).clipped_sum
    assert np.sqrt(sum(float(tf.reduce_sum(g ** 2)) for g in moved)) == pytest.approx(10.0, rel=1e-4)
    r = traced_audit(model, x, np.array([1]), calls=64, candidates=40, ascent=10)
    assert {f.check for f in r.flags} == {"sensitivity"} and r.largest_contribution > 9.9, r.summary()


@tf.keras.utils.register_keras_serializable(package="test_audit_traced")   # Keras 3's clone_model
class _LessNoiseLater(O.DPSGDOptimizer):
    """A planted bug: half the noise from the optimizer's third step on (the accountant keeps sigma)."""

    def _dp_gradients(self, clipped, var_list):
        released = self.mechanism.release(clipped)
        factor = tf.where(self.iterations >= 2, 0.5, 1.0)
        return [s + factor * (g - s) for g, s in zip(released.gradients, clipped.clipped_sum, strict=True)]


@slow_on_keras2   # an audit run (above)
def test_noise_that_shrinks_after_some_step_is_flagged():
    import dp_accounting

    optimizer = _LessNoiseLater(1.0, 1.0, num_examples=64, batch_size=8, delta=1e-5)
    model, x = _dense_model(optimizer)
    # The truth for an example drawn into a step after the second: sigma 0.5, not the accounted 1.
    truth = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.GaussianDpEvent(0.5)).get_epsilon(1e-5)
    assert optimizer.epsilon_after(8) < truth / 2
    # Every call used to start from the snapshot's step counter (1): a pass, std ratio 1.00.
    r = traced_audit(model, x, np.array([1]), calls=64, candidates=40, ascent=10)
    assert "noise" in {f.check for f in r.flags}, r.summary()
    assert min(f.value for f in r.findings if f.statistic == "std ratio") < 0.75


@tf.keras.utils.register_keras_serializable(package="test_audit_traced")   # Keras 3's clone_model
class _LessNoiseUnderXla(O.DPSGDOptimizer):
    """A planted bug: the step compiled by XLA adds a tenth of the noise (the accountant keeps sigma)."""

    def _dp_gradients(self, clipped, var_list):
        from tfdpbnn import _private_api

        released = self.mechanism.release(clipped)
        if not _private_api.in_xla_context():
            return released.gradients
        return [s + 0.1 * (g - s) for g, s in zip(released.gradients, clipped.clipped_sum, strict=True)]


@slow_on_keras2   # an audit run (above)
def test_the_step_of_a_jit_compiled_model_is_audited_under_xla():
    # The copy was compiled without jit_compile: the audit ran another function than fit (a pass, 1.00).
    model, x = _dense_model(O.DPSGDOptimizer(1.0, 1.0, num_examples=64, batch_size=8))
    model.compile(optimizer=model.optimizer, loss=LOSS, jit_compile=True)
    honest = traced_audit(model, x, np.array([1]), calls=64, candidates=30, ascent=5)
    assert not honest.flagged, honest.summary()
    model, x = _dense_model(_LessNoiseUnderXla(1.0, 1.0, num_examples=64, batch_size=8))
    model.compile(optimizer=model.optimizer, loss=LOSS, jit_compile=True)
    r = traced_audit(model, x, np.array([1]), calls=64, candidates=30, ascent=5)
    assert "noise" in {f.check for f in r.flags}, r.summary()
    assert min(f.value for f in r.findings if f.statistic == "std ratio") < 0.2


def test_refusals_name_the_argument():
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=LOSS)
    with pytest.raises(ValueError, match="model: compile it with a tfdpbnn DP optimizer"):
        traced_audit(model, np.zeros((1, 2), np.float32), np.array([0]))
    model.compile(optimizer=O.DPSGDOptimizer(1.0, 1.0, num_examples=4, batch_size=2), loss=LOSS)
    with pytest.raises(ValueError, match="alpha"):
        traced_audit(model, np.zeros((1, 2), np.float32), np.array([0]), alpha=2.0)
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    # Keras 3's optimizer.learning_rate is the schedule's current value; its config holds the schedule
    model.compile(optimizer=O.DPSGDOptimizer(1.0, 1.0, learning_rate=schedule, num_examples=4, batch_size=2),
                  loss=LOSS)
    with pytest.raises(ValueError, match="optimizer: a learning-rate schedule"):
        traced_audit(model, np.zeros((1, 2), np.float32), np.array([0]))


def test_a_patch_that_does_not_apply_is_an_error(tmp_path):
    target = mutated_copy(None, tmp_path)
    path = target / "optimizers" / "base.py"
    path.write_text(path.read_text().replace("return self.batch_size / self.num_examples", "return 1.0"))
    with pytest.raises(PatchError, match="sample-rate-halved"):
        apply_mutation(target, "sample-rate-halved")
    for name in SOURCE_MUTATIONS:  # every other patch applies to the current source
        if name != "sample-rate-halved":
            apply_mutation(mutated_copy(None, tmp_path / name), name)


@pytest.mark.slow  # a subprocess importing TensorFlow: 14-21 s on 2 shared cores
def test_noise_frozen_at_trace_time_is_flagged_in_a_subprocess():
    outcome = run_mutation("noise-frozen-at-trace", methods=("dpsgd",), calls=64, candidates=8, ascent=0)
    assert outcome.audit_flagged == {"dpsgd": True}
    assert any("correlation between calls" in f for f in outcome.audit_flags["dpsgd"])
