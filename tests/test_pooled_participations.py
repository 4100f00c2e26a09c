"""The run owns its counts: partial passes of different calls are never pooled, steps outside a fit are
counted only through ``begin_training``.

Truth: each call draws its own shuffled passes, so a record can be in every call's partial pass; the number of
participations per record is counted here from the calls made, and its epsilon computed with dp-accounting.
"""

from __future__ import annotations

import pytest
import tensorflow as tf
from _small_runs import DELTA, LOSS, N, gaussians_epsilon, small_data, small_model
from _tiers import SLOW_ON_KERAS2

import tfdpbnn
from tfdpbnn import _keras_version

SIGMA, B = 1.0, 8
PER_EXAMPLE = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _model():
    model = small_model()
    opt = tfdpbnn.DPSGDOptimizer(1.0, SIGMA, num_examples=N, batch_size=B, delta=DELTA)
    model.compile(optimizer=opt, loss=LOSS)
    return model, opt


@pytest.mark.parametrize("calls, steps", [(6, 2), pytest.param(5, 1, marks=SLOW_ON_KERAS2)])  # fast: 6, 2
def test_short_fits_in_a_loop_count_one_participation_per_call(calls, steps):
    x, y = small_data()
    model, opt = _model()
    for _ in range(calls):  # each call: `steps` batches of a fresh shuffle, less than one pass (N / B = 8)
        model.fit(x, y, batch_size=B, steps_per_epoch=steps, epochs=1, verbose=0)
    truth = gaussians_epsilon(SIGMA, calls)     # a record may be in every call's partial pass
    pooled = gaussians_epsilon(SIGMA, -(-calls * steps * B // N))   # what pooling the passes printed
    assert pooled < 0.8 * truth
    assert opt.steps == calls * steps
    assert opt.epsilon() == pytest.approx(truth, rel=1e-6)


def test_a_whole_pass_per_call_is_still_one_participation_per_call():
    x, y = small_data()
    model, opt = _model()
    for _ in range(3):
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(SIGMA, 3), rel=1e-6)


def test_custom_steps_after_a_fit_are_refused_until_begin_training():
    x, y = small_data()
    model, opt = _model()
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match="outside model.fit.*begin_training"):
        with tf.GradientTape() as tape:
            loss = PER_EXAMPLE(y[:B], model(x[:B]))
        opt.minimize(loss, model.trainable_variables, tape=tape)
    with pytest.raises(ValueError, match="outside model.fit"):
        opt.dp_train_step(model, (x[:B], y[:B]))
    for w, b in zip(model.get_weights(), before, strict=True):
        assert (w == b).all()                    # nothing updated the weights
    assert opt.steps == N // B
    opt.begin_training(model, x, y, batch_size=B, assert_per_example_loss="per-example cross-entropy")
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = PER_EXAMPLE(y[:B], model(x[:B]))
        opt.minimize(loss, model.trainable_variables, tape=tape)
    # One pass (1 participation) and 3 custom steps (each one participation of every example).
    assert opt.epsilon() == pytest.approx(gaussians_epsilon(SIGMA, 4), rel=1e-6)


def test_backup_and_restore_by_batches_never_pools_the_resumed_pass(tmp_path):
    from test_weights_record import _Crash

    x, y = small_data()
    model, opt = _model()
    backup = tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=3)   # every 3 batches
    with pytest.raises(RuntimeError, match="simulated crash"):
        model.fit(x, y, batch_size=B, epochs=3, verbose=0, callbacks=[backup, _Crash()])  # 8 + 3 steps
    model.fit(x, y, batch_size=B, epochs=3, verbose=0, callbacks=[backup])  # from the backup at step 9
    # Ran: pass 1 (8), steps 9-11 of pass 2, then (a fresh shuffle) 7 steps of pass 2 and pass 3: every step
    # that ran is counted, and a record of steps 9-11 can be in both pass 2 shuffles: 4 participations.
    # Keras 3's BackupAndRestore resumes at the start of the interrupted epoch (it restores only the epoch):
    # there the whole of pass 2 ran again, 8 steps.
    assert opt.ledger.steps == 8 + 3 + (8 if _keras_version.KERAS_MAJOR == 3 else 7) + 8
    assert opt.epsilon() >= gaussians_epsilon(SIGMA, 4) * (1 - 1e-6)
    assert opt.privacy_statement()["quote"]["epsilon"] >= gaussians_epsilon(SIGMA, 4) * (1 - 1e-6)


def test_backup_and_restore_resumed_at_the_crash_step_counts_the_resumed_pass_anew(tmp_path):
    from test_weights_record import _Crash

    x, y = small_data()
    model, opt = _model()
    backup = tf.keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=4)   # every 4 batches
    with pytest.raises(RuntimeError, match="simulated crash"):   # after the backup at step 12: nothing lost
        model.fit(x, y, batch_size=B, epochs=3, verbose=0, callbacks=[backup, _Crash(epoch=1, batch=3)])
    model.fit(x, y, batch_size=B, epochs=3, verbose=0, callbacks=[backup])
    # Ran: pass 1 (8 steps), steps 9-12 of pass 2; Keras 2 resumes pass 2 at its 5th step on a fresh shuffle
    # (4 steps), Keras 3 runs pass 2 again (8 steps); then pass 3. A record of steps 9-12 can be drawn again
    # in the resumed pass: 4 participations (the restore set the partial pass's count back to 32 examples,
    # and 24 steps of 8 were once counted as 3 passes).
    assert opt.ledger.steps == 8 + 4 + (8 if _keras_version.KERAS_MAJOR == 3 else 4) + 8
    truth = gaussians_epsilon(SIGMA, 4)
    assert opt.epsilon() >= truth * (1 - 1e-6)
    assert opt.privacy_statement()["quote"]["epsilon"] >= truth * (1 - 1e-6)
