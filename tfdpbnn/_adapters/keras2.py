"""The Keras 2 adapter: tensorflow-privacy's vectorized Keras optimizers as the optimizer base classes.

Besides the private names in ``tfdpbnn._private_api``, it reads ``OptimizerV2._create_all_weights``,
``_slots`` and ``_name`` (the optimizer's state per variable, which the DP write watch compares),
``ModelCheckpoint._should_save_on_batch`` and ``BackupAndRestore``'s ``_batches_count`` and
``_training_state._enable_save_before_preemption`` (the batches where they save the weights,
``saves_after_batch``); ``check`` fails when they change.
"""

from __future__ import annotations

import tensorflow as tf

from tfdpbnn._private_api import VECTORIZED_OPTIMIZERS, tensorflow_privacy_module


def optimizer_bases():
    """``(VectorizedDPKerasSGDOptimizer, VectorizedDPKerasAdamOptimizer)`` of tensorflow-privacy."""
    vectorized = tensorflow_privacy_module(VECTORIZED_OPTIMIZERS)
    return vectorized.VectorizedDPKerasSGDOptimizer, vectorized.VectorizedDPKerasAdamOptimizer


def save_saved_model(model, path, signatures):
    """Write ``model`` as a TensorFlow SavedModel with ``signatures``, without its optimizer."""
    tf.keras.models.save_model(model, path, save_format="tf", include_optimizer=False, signatures=signatures)


def train_function(model):
    """``fit``'s traced train function of ``model`` (``make_train_function`` returns it on Keras 2)."""
    return model.make_train_function()


def optimizer_slot(optimizer, variable, name):
    """The optimizer slot ``name`` (``"m"``, ``"v"``, ``"momentum"``) of ``variable``."""
    return optimizer.get_slot(variable, name)


def optimizer_slot_names(optimizer) -> list:
    """The names of the per-variable slots ``optimizer`` keeps."""
    return list(optimizer.get_slot_names())


def build_optimizer_state(optimizer, variables, at_run_start: bool = False) -> None:
    """Create ``optimizer``'s state for ``variables`` (its slots), as its ``apply_gradients`` does first.

    ``OptimizerV2._create_all_weights`` under the optimizer's name scope, outside any trace: the slots it
    makes are the ones ``apply_gradients`` would make (it creates none that exist). ``at_run_start``: not
    now (Keras 2 creates them in the first update; nothing can write them before).
    """
    if at_run_start:
        return
    with tf.name_scope(optimizer._name), tf.init_scope():
        optimizer._create_all_weights(list(variables))


def optimizer_state_variables(optimizer) -> list:
    """The state ``optimizer`` keeps per trained variable (``OptimizerV2._slots``: momentum, m, v)."""
    return [slot for slots in optimizer._slots.values() for slot in slots.values()]


def variable_name(variable) -> str:
    """A variable's name, unique within a model (Keras 2's scoped ``name``)."""
    return variable.name


def saves_after_batch(callback, batch) -> bool:
    """Whether ``callback``'s ``on_train_batch_end(batch)``, about to run, may save the model's weights.

    ``callback``: a ``ModelCheckpoint`` or ``BackupAndRestore`` with an integer ``save_freq``. Keras's own
    counters decide: ``ModelCheckpoint._should_save_on_batch`` (``keras_batch_save_decision``), and
    ``BackupAndRestore``'s count of batch ends, which saves when it reaches ``save_freq``, and which may save
    at any batch where it backs up before a preemption. True where that is not known (a subclass with a
    batch hook of its own, counters the installed Keras does not have).
    """
    from tfdpbnn._adapters import keras_batch_save_decision

    if isinstance(callback, tf.keras.callbacks.ModelCheckpoint):
        decided = keras_batch_save_decision(callback, batch, tf.keras.callbacks.ModelCheckpoint)
        return True if decided is None else decided
    restore = tf.keras.callbacks.BackupAndRestore
    if not isinstance(callback, restore) or (type(callback).on_train_batch_end
                                             is not restore.on_train_batch_end):
        return True
    count, state = getattr(callback, "_batches_count", None), getattr(callback, "_training_state", None)
    if not isinstance(count, int) or getattr(state, "_enable_save_before_preemption", True):
        return True
    return count + 1 >= callback.save_freq


def check() -> None:
    """Raise ``RuntimeError`` naming the Keras 2 internal of this adapter that the installed Keras lacks."""
    optimizer, weight = tf.keras.optimizers.legacy.SGD(momentum=0.9), tf.Variable([1.0])
    try:
        build_optimizer_state(optimizer, [weight])
        state = optimizer_state_variables(optimizer)
    except AttributeError as err:
        raise RuntimeError(f"tfdpbnn: Keras's OptimizerV2._create_all_weights, _slots or _name changed "
                           f"({err}); update tfdpbnn/_adapters/keras2.py") from err
    if len(state) != 1 or state[0] is not optimizer.get_slot(weight, "momentum"):
        raise RuntimeError("tfdpbnn: Keras's OptimizerV2._slots no longer holds the slots by variable; "
                           "update tfdpbnn/_adapters/keras2.py")
    from tfdpbnn._adapters import keras_batch_save_decision

    saver = tf.keras.callbacks.ModelCheckpoint("unused.weights.h5", save_freq=2)
    restore = tf.keras.callbacks.BackupAndRestore("unused", save_freq=2)
    if keras_batch_save_decision(saver, 0, tf.keras.callbacks.ModelCheckpoint) is not False \
            or not isinstance(getattr(restore, "_batches_count", None), int):
        raise RuntimeError("tfdpbnn: Keras's ModelCheckpoint._should_save_on_batch or BackupAndRestore."
                           "_batches_count changed; update tfdpbnn/_adapters/keras2.py")
