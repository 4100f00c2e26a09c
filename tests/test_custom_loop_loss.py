"""The loss a custom training loop hands to a DP optimizer's mechanism: asserted by name, or refused.

A contrastive loss (each example's loss against the batch mean) moves every example's loss when one example
is added, so the clipped sum moves by more than the clip bound C: the epsilon printed for sensitivity C would
be below the truth. In a custom loop tfdpbnn cannot check the loss (the loop computes it from its own batch),
so ``minimize``, ``mechanism.clip_losses`` and ``clip_model(loss_fn=...)`` need ``begin_training(...,
assert_per_example_loss=...)``; ``dp_train_step`` uses the compiled loss, checked before the first step.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, D, N, gaussians_epsilon, small_data

import tfdpbnn

PER_EXAMPLE = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def contrastive(y_pred):
    """Each example's loss is its similarity to the batch's mean output (sensitivity above C at sigma 0:
    ``tests/test_state_checks.py::test_contrastive_loss_has_sensitivity_above_the_clip_bound``)."""
    return -tf.reduce_sum(y_pred * tf.reduce_mean(y_pred, axis=0, keepdims=True), axis=1)


def _model():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    return model, opt


def test_a_custom_loop_loss_is_refused_unless_asserted():
    x, y = small_data()
    model, opt = _model()
    opt.begin_training(model, x, y, batch_size=8)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match="assert_per_example_loss.*optimizer.minimize"):
        with tf.GradientTape() as tape:
            loss = contrastive(model(x[:8]))
        opt.minimize(loss, model.trainable_variables, tape=tape)
    with pytest.raises(ValueError, match="assert_per_example_loss.*clip_losses"):
        with tf.GradientTape() as tape:
            loss = PER_EXAMPLE(y[:8], model(x[:8]))
        opt.mechanism.privatize_losses(loss, model.trainable_variables, tape)
    with pytest.raises(ValueError, match=r"assert_per_example_loss.*clip_model\(loss_fn"):
        opt.mechanism.privatize_model(model, x[:8], y[:8], loss_fn=lambda t, p, w: PER_EXAMPLE(t, p))
    assert opt.steps == 0
    for w, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(w, b)
    # The compiled loss (checked at begin_training) needs no assertion.
    opt.dp_train_step(model, (x[:8], y[:8]))
    assert opt.steps == 1
    with pytest.raises(ValueError, match="assert_per_example_loss must be"):
        opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="  ")


def test_an_asserted_custom_loop_loss_trains_and_the_statement_names_the_assertion():
    x, y = small_data()
    model, opt = _model()
    opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="cross-entropy of each example")
    for start in range(0, N, 8):
        with tf.GradientTape() as tape:
            loss = PER_EXAMPLE(y[start:start + 8], model(x[start:start + 8]))
        opt.minimize(loss, model.trainable_variables, tape=tape)
    assert opt.steps == N // 8
    asserted = opt.privacy_statement()["asserted_by_user"]
    assert any("cross-entropy of each example" in a and "custom training loop" in a for a in asserted)


def test_the_loss_assertion_travels_with_the_optimizer_config_the_saved_model_and_a_new_optimizer(
        tmp_path):
    x, y = small_data()
    model, opt = _model()
    opt.begin_training(model, x, y, batch_size=8, assert_per_example_loss="cross-entropy of each example")
    with tf.GradientTape() as tape:
        loss = PER_EXAMPLE(y[:8], model(x[:8]))
    opt.minimize(loss, model.trainable_variables, tape=tape)

    def named(optimizer):
        asserted = optimizer.privacy_statement()["asserted_by_user"]
        return any("cross-entropy of each example" in a for a in asserted)

    again = type(opt).from_config(opt.get_config())
    assert again.steps == 1 and named(again)
    path = str(tmp_path / "model.keras")
    model.save(path)
    assert named(tf.keras.models.load_model(path).optimizer)
    # A new optimizer compiled onto the model imports its custom-loop phase and the assertion it rests on.
    fresh = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=fresh, loss=LOSS)
    model.train_on_batch(x[:8], y[:8])
    assert fresh.ledger.steps == 2 and named(fresh)
    config = opt.get_config()
    config["privacy_ledger"]["loss_assertions"] = [" "]
    with pytest.raises(ValueError, match="loss_assertions"):
        type(opt).from_config(config)


# ------------------------------------------------------------------- more ways a user might under-count
def test_a_model_compiled_again_with_a_coupled_loss_is_checked_again():
    x, y = small_data()
    model, opt = _model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.compile(optimizer=opt, loss=lambda t, p: contrastive(p))  # the same optimizer, a coupled loss
    with pytest.raises(ValueError, match="depends on other examples"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert opt.steps == N // 8


def _validation(x, y, as_pipeline):
    """``(x, y)``, or a shuffled ``tf.data`` pipeline of them in float64 batches of 5 (the same records)."""
    if not as_pipeline:
        return x, y
    return tf.data.Dataset.from_tensor_slices((x.astype("float64"), y)).shuffle(len(x), seed=1).batch(5)


@pytest.mark.parametrize("as_pipeline", [False, True])
def test_validation_data_on_training_records_is_refused(as_pipeline):
    # Keras logs the validation loss without noise every epoch (and EarlyStopping or ReduceLROnPlateau act
    # on it): on training records an exact release. A tf.data pipeline of the training records was not
    # read (7.08 printed with guarantee true while ReduceLROnPlateau and EarlyStopping acted on it).
    x, y = small_data()
    model, opt = _model()
    with pytest.raises(ValueError, match="validation_data: 16 of its 16 records are training records"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  validation_data=_validation(x[:16], y[:16], as_pipeline))
    assert opt.steps == 0
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    # Records a recorded run trained on are training records for a later fit on other records too.
    other, other_y = small_data(seed=3)
    later, _ = _model()
    with pytest.raises(ValueError, match="validation_data: 8 of its 8 records"):
        later.fit(other, other_y, batch_size=8, epochs=1, verbose=0,
                  validation_data=_validation(x[8:16], y[8:16], as_pipeline))
    held_out = small_data(n=8, seed=4)
    later.fit(other, other_y, batch_size=8, epochs=1, verbose=0,
              validation_data=_validation(*held_out, as_pipeline))
    assert "validation_data" in later.optimizer.privacy_statement()["not_covered"]["releases"]


@pytest.mark.parametrize("as_pipeline", [False, True])
def test_validation_data_on_training_records_named_by_ids_is_refused(as_pipeline):
    # Training records named by record_ids with their rows are in the ledger under their ids and, for their
    # rows, under twin keys of their content: validation rows compared by content alone were not found
    # (4.73 printed with guarantee true, the 16 rows' loss released without noise every epoch).
    x, y = small_data()
    model, opt = _model()
    with pytest.raises(ValueError, match="validation_data: 16 of its 16 records are training records"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, record_ids=[f"p{i}" for i in range(N)],
                  validation_data=_validation(x[:16], y[:16], as_pipeline))
    poisson = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA, sampling="poisson")
    model.compile(optimizer=poisson, loss=LOSS)
    batches = tfdpbnn.data.poisson_batches(x, y, sample_rate=0.125, record_ids=np.arange(N))
    with pytest.raises(ValueError, match="validation_data: 16 of its 16 records are training records"):
        model.fit(batches, epochs=1, verbose=0, validation_data=_validation(x[:16], y[:16], as_pipeline))
    assert opt.steps == 0 and poisson.steps == 0
    # A run recorded in the ledger under ids: its rows are training records for a later fit on others.
    model, opt = _model()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, record_ids=np.arange(N))
    other, other_y = small_data(seed=3)
    later, _ = _model()
    with pytest.raises(ValueError, match="validation_data: 8 of its 8 records"):
        later.fit(other, other_y, batch_size=8, epochs=1, verbose=0, record_ids=np.arange(100, 100 + N),
                  validation_data=_validation(x[8:16], y[8:16], as_pipeline))
    held_out = small_data(n=8, seed=4)
    later.fit(other, other_y, batch_size=8, epochs=1, verbose=0, record_ids=np.arange(100, 100 + N),
              validation_data=_validation(*held_out, as_pipeline))
    assert "validation_data" in later.optimizer.privacy_statement()["not_covered"]["releases"]


def test_sample_weights_scale_the_loss_before_clipping():
    # A weight of 100 on one example does not move the clipped sum by more than C: it scales the loss,
    # which is clipped after.
    x, y = small_data()
    moved = []
    for weight in (1.0, 100.0):
        model, opt = _model()
        opt.begin_training(model, x, y, batch_size=8)
        w = np.ones(8, np.float32)
        w[0] = weight
        big = opt.mechanism.clip_model(model, x[:8], y[:8], w).clipped_sum
        small = opt.mechanism.clip_model(model, x[1:8], y[1:8], w[1:]).clipped_sum
        moved.append(np.sqrt(sum(float(tf.reduce_sum(tf.square(a - b))) for a, b in zip(big, small,
                                                                                          strict=True))))
    assert moved[1] <= 1.0 + 1e-5 and moved[1] == pytest.approx(moved[0], rel=1e-5)


@pytest.mark.parametrize("how", ["class_weight", "initial_epoch", "steps_per_execution"])
def test_fit_options_count_every_pass(how):
    x, y = small_data()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS, steps_per_execution=3 if how == "steps_per_execution" else 1)
    kwargs = {"class_weight": dict(class_weight={0: 50.0, 1: 1.0, 2: 1.0}, epochs=1),
              "initial_epoch": dict(initial_epoch=1, epochs=3), "steps_per_execution": dict(epochs=2)}[how]
    model.fit(x, y, batch_size=8, verbose=0, **kwargs)
    passes = 1 if how == "class_weight" else 2
    assert opt.steps == passes * N // 8
    statement = opt.privacy_statement()
    assert statement["run_epsilon"] >= gaussians_epsilon(1.0, passes) * (1 - 1e-6)
    assert statement["quote"]["epsilon"] >= statement["run_epsilon"]


@pytest.mark.parametrize("how", ["fit class_weight", "fit sample_weight", "train_on_batch", "none"])
def test_per_example_weights_are_listed_as_set_without_the_private_records(how):
    # Balanced class weights computed from the private labels change with one record and rescale every
    # other record of its class before clipping: the clipped sum moved by 1.69 C between neighbours (one
    # full-batch step at sigma 1: 4.73 printed, 8.73 at that sensitivity) with nothing under asserted_by_user.
    from tfdpbnn.optimizers.base import WEIGHTS_FIXED

    x, y = small_data()
    model = tf.keras.Sequential([tf.keras.Input((D,)), tf.keras.layers.Dense(3)])
    opt = tfdpbnn.DPSGDOptimizer(1.0, 1.0, num_examples=N, batch_size=8, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    weights = np.full(N, 2.0, "float32")
    if how == "fit class_weight":
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, class_weight={0: 2.0, 1: 1.0, 2: 1.0})
    elif how == "fit sample_weight":
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, sample_weight=weights)
    elif how == "train_on_batch":
        model.train_on_batch(x[:8], y[:8], sample_weight=weights[:8])
    else:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    listed = WEIGHTS_FIXED in opt.privacy_statement()["asserted_by_user"]
    assert listed == (how != "none")
    # It travels with the optimizer's config, as the phases it vouches for.
    copy = type(opt).from_config(opt.get_config())
    assert (WEIGHTS_FIXED in copy.privacy_statement()["asserted_by_user"]) == (how != "none")
