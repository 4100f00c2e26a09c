"""The Keras 2 adapter: tensorflow-privacy's vectorized Keras optimizers as the optimizer base classes.

Besides the private names in ``tfdpbnn._private_api``, it reads ``OptimizerV2._create_all_weights``,
``_slots`` and ``_name`` (the optimizer's state per variable, which the DP write watch compares;
``check`` fails when they change).
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
