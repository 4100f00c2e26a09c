"""Every step is a DP step or is refused: ``apply_gradients``, ``train_on_batch``, mixed precision.

Epsilons are compared (rel. 1%) with an independent dp-accounting computation of the steps that ran.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, gaussians_epsilon, small_data

import tfdpbnn


def _compiled(sigma=1.0, batch_size=8, **kwargs):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, sigma, num_examples=N, batch_size=batch_size, delta=DELTA, **kwargs)
    model.compile(optimizer=opt, loss=LOSS)
    return model, opt


def test_apply_gradients_refuses_ordinary_gradients_after_dp_fit():
    x, y = small_data()
    model, opt = _compiled()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    before = [w.copy() for w in model.get_weights()]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(LOSS(y[:8], model(x[:8])))
    grads = tape.gradient(loss, model.trainable_variables)
    with pytest.raises(ValueError, match="grads_and_vars: .*did not come from this optimizer's DP mechanism"):
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    for w, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(w, b)


def test_apply_gradients_refused_in_a_train_step_override():
    x, y = small_data()

    class Plain(tf.keras.Model):
        def train_step(self, data):
            xb, yb = data
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(yb, self(xb, training=True))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                               self.trainable_variables, strict=True))
            return {"loss": loss}

    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((D,))
    model = Plain(inputs, tf.keras.layers.Dense(3)(inputs))
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    with pytest.raises(ValueError, match="grads_and_vars"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_mechanism_release_and_minimize_are_applied():
    x, y = small_data()
    model, opt = _compiled()
    opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="per-example cross-entropy")
    released = opt.mechanism.privatize_model(model, x[:8], y[:8])
    opt.apply_gradients(zip(released.gradients, model.trainable_variables, strict=True))
    with tf.GradientTape() as tape:
        loss = LOSS.__class__(from_logits=True, reduction="none")(y[:8], model(x[:8]))
    opt.minimize(loss, model.trainable_variables, tape=tape)
    assert opt.steps == 2


def test_train_on_batch_counts_every_call_as_a_participation():
    x, y = small_data()
    model, opt = _compiled()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # one pass: 1 participation
    for _ in range(20):
        model.train_on_batch(x[:8], y[:8])
    assert opt.steps == 8 + 20
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 21), rel=0.01)
    statement = opt.privacy_statement()
    assert [p["participations"] for p in statement["phases"]] == [1, 20]


def test_train_on_batch_stops_at_the_budget():
    x, y = small_data()
    budget = gaussians_epsilon(1.0, 5) * 1.001  # room for exactly 5 participations
    model, opt = _compiled(target_epsilon=budget)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="target_epsilon=.* is spent"):
        for _ in range(20):
            model.train_on_batch(x[:8], y[:8])
    assert opt.steps == 8 + 4
    assert opt.epsilon() <= budget
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 5), rel=0.01)


def test_train_on_batch_alone_is_counted():
    x, y = small_data()
    model, opt = _compiled()
    for _ in range(3):
        model.train_on_batch(x[:8], y[:8])
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)


def test_mixed_precision_is_refused_naming_the_policy():
    x, y = small_data()
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, _ = _compiled()
        with pytest.raises(ValueError, match="mixed_float16"):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        with pytest.raises(ValueError, match="mixed_float16"):
            model.train_on_batch(x[:8], y[:8])
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def test_a_loss_scale_optimizer_around_a_dp_optimizer_is_refused_naming_it():
    # Under the float32 policy the error named the policy "float32" and asked for that very policy.
    x, y = small_data()
    model = tf.keras.Sequential([tf.keras.Input((x.shape[1],)), tf.keras.layers.Dense(2)])
    optimizer = tfdpbnn.DPSGDOptimizer(1.0, 1.0, learning_rate=0.1, num_examples=N, batch_size=8,
                                       delta=DELTA, allow_exceeding_budget=True)
    try:
        model.compile(optimizer=tf.keras.mixed_precision.LossScaleOptimizer(optimizer),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    except (TypeError, ValueError) as err:  # a Keras that refuses the wrapper itself
        pytest.skip(f"this Keras does not wrap the DP optimizer: {err}")
    with pytest.raises(ValueError, match=r"^optimizer: the model is compiled with a LossScaleOptimizer"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert optimizer.steps == 0


# ------------------------------------------------------------------------- epoch-end epsilon cost
def test_cached_rdp_epsilon_equals_dp_accounting_composition():
    from tfdpbnn.record.ledger import Phase, PrivacyLedger

    phases = [Phase(kind="poisson", noise_multiplier=1.1, neighboring="add_or_remove", steps=9000,
                    sample_rate=0.01),
              Phase(kind="participations", noise_multiplier=3.0, neighboring="add_or_remove", steps=700,
                    participations=7),
              Phase(kind="gaussian", noise_multiplier=20.0, neighboring="add_or_remove", steps=50)]
    ledger = PrivacyLedger(phases)
    for _ in range(2):  # the second call reads the cached curves
        expected = dp_accounting.rdp.RdpAccountant().compose(ledger.event()).get_epsilon(DELTA)
        assert ledger.epsilon(DELTA, "rdp") == pytest.approx(expected, rel=1e-9)


def test_pld_optimizer_logs_rdp_each_epoch_and_pld_at_the_last():
    x, y = small_data()
    model, opt = _compiled(accountant="pld")
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert len(history.history["epsilon_rdp"]) == 3
    assert history.history["epsilon_rdp"][-1] == pytest.approx(gaussians_epsilon(1.0, 3), rel=0.01)
    assert history.history["epsilon"] == [pytest.approx(opt.epsilon(), rel=1e-9)]


# --------------------------------------------------------------------------- releases not covered
def test_statement_names_the_releases_no_epsilon_covers():
    x, y = small_data(n=80)
    model, opt = _compiled(release_training_metrics=("loss",))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, validation_split=0.2)
    statement = opt.privacy_statement()
    released = statement["not_covered"]["releases"]
    assert set(released) == {"training_metrics", "validation_split"}
    assert "validation_split" in released["validation_split"]
    # Held-out records (x[64:] were the validation_split rows above, which the ledger counts as trained on).
    model.fit(x[:64], y[:64], batch_size=8, epochs=1, verbose=0, validation_data=small_data(n=16, seed=5))
    assert "validation_data" in opt.privacy_statement()["not_covered"]["releases"]


# ------------------------------------------------------------------ data dependence for every input type
class _ActivationPenalty(tf.keras.layers.Layer):
    def call(self, inputs):
        self.add_loss(tf.reduce_sum(tf.square(inputs)))
        return inputs


def _token_model(penalty=False, mix=False):
    tf.keras.utils.set_random_seed(0)
    tokens = tf.keras.Input((5,), dtype="int32")
    h = tf.keras.layers.Embedding(10, 4)(tokens)
    if penalty:
        h = _ActivationPenalty()(h)
    h = tf.keras.layers.GlobalAveragePooling1D()(h)
    if mix:
        h = tf.keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0, keepdims=True))(h)
    return tf.keras.Model(tokens, tf.keras.layers.Dense(3)(h))


def _tokens(n=N):
    rng = np.random.default_rng(0)
    return rng.integers(0, 10, (n, 5)).astype(np.int32), rng.integers(0, 3, n)


def _fit_tokens(model, x, y):
    model.compile(optimizer=tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA),
                  loss=LOSS)
    return model.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_integer_inputs_with_an_add_loss_on_activations_are_refused():
    x, y = _tokens()
    with pytest.raises(ValueError, match="model.losses depends on the input data"):
        _fit_tokens(_token_model(penalty=True), x, y)


def test_integer_inputs_mixing_examples_are_refused_and_plain_ones_train():
    x, y = _tokens()
    with pytest.raises(ValueError, match="mixes examples"):
        _fit_tokens(_token_model(mix=True), x, y)
    model = _token_model()
    _fit_tokens(model, x, y)
    assert model.optimizer.epsilon() == pytest.approx(gaussians_epsilon(1.0, 1), rel=0.01)


def test_dict_multi_input_model_with_a_penalty_on_the_integer_branch_is_refused():
    tf.keras.utils.set_random_seed(0)
    tokens = tf.keras.Input((5,), dtype="int32", name="tokens")
    values = tf.keras.Input((D,), name="values")
    h = _ActivationPenalty()(tf.keras.layers.Embedding(10, 4)(tokens))
    h = tf.keras.layers.GlobalAveragePooling1D()(h)
    model = tf.keras.Model({"tokens": tokens, "values": values},
                           tf.keras.layers.Dense(3)(tf.keras.layers.Concatenate()([h, values])))
    x_tokens, y = _tokens()
    x = {"tokens": x_tokens, "values": small_data()[0]}
    with pytest.raises(ValueError, match="model.losses depends on the input data"):
        _fit_tokens(model, x, y)

