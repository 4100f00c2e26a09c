"""The one place tfdpbnn touches private names of TensorFlow, Keras and tensorflow-privacy.

Every private name tfdpbnn depends on is listed here, each behind a small function, so that a change of a
pinned version breaks in one place with a clear message (``check()`` is run by the test suite):

- ``tf.data``: ``Dataset._input_dataset`` of ``_PrefetchDataset`` and ``_OptionsDataset`` (to find the
  sampling declaration of a dataset that was only prefetched or given options).
- Keras: ``Model._steps_per_execution`` (how many steps one call of the train function runs, so a budget
  stop never overshoots).
"""

from __future__ import annotations

import tensorflow as tf

#: tf.data classes that neither drop, add, repeat nor reorder the elements of their input dataset.
_ELEMENT_PRESERVING = ("_PrefetchDataset", "_OptionsDataset")


def element_preserving_input(dataset):
    """The input of ``dataset`` if ``dataset`` is a prefetch/with_options of it, else None."""
    if type(dataset).__name__ in _ELEMENT_PRESERVING:
        return getattr(dataset, "_input_dataset", None)
    return None


def steps_per_execution(model) -> int:
    """Steps run by one call of ``model``'s train function (Keras's ``steps_per_execution``), at least 1."""
    value = getattr(model, "_steps_per_execution", None)
    if value is None:
        return 1
    try:
        return max(1, int(value.numpy()))
    except AttributeError:
        return max(1, int(value))


def check() -> None:
    """Raise ``RuntimeError`` naming the private name that the installed versions no longer provide."""
    base = tf.data.Dataset.range(3)
    for made in (base.prefetch(1), base.with_options(tf.data.Options())):
        if element_preserving_input(made) is not base:
            raise RuntimeError(
                f"tfdpbnn: tf.data's {type(made).__name__} no longer exposes _input_dataset as "
                f"{_ELEMENT_PRESERVING}; update tfdpbnn/_private_api.py for tensorflow {tf.__version__}")
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile(loss="mse", steps_per_execution=3)
    if steps_per_execution(model) != 3:
        raise RuntimeError("tfdpbnn: Keras's Model._steps_per_execution changed; update "
                           f"tfdpbnn/_private_api.py for tensorflow {tf.__version__}")
