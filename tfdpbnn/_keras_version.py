"""Which Keras ``tf.keras`` is: tfdpbnn runs on Keras 2 only (tf-keras on TensorFlow >= 2.16).

TensorFlow 2.16 made Keras 3 the default ``tf.keras``. tensorflow-privacy 0.9.0 and tfdpbnn subclass Keras 2
optimizers and override Keras 2's ``train_step``, so on TensorFlow >= 2.16 tfdpbnn needs ``tf.keras`` to be
tf-keras (the ``tf_keras`` package, Keras 2 for current TensorFlow). TensorFlow decides lazily, at the first
use of ``tf.keras``, from the environment variable ``TF_USE_LEGACY_KERAS``. ``select()`` runs once, when
tfdpbnn is imported, before anything else of tfdpbnn:

- TensorFlow 2.15: ``tf.keras`` is Keras 2.15 already; nothing is done.
- TensorFlow >= 2.16 and nothing has used ``tf.keras`` yet: sets ``TF_USE_LEGACY_KERAS=1`` (unless the
  program set it to a false value, which is an error), resolves ``tf.keras`` now, and logs one INFO line
  (logger ``tfdpbnn``) that says so.
- ``tf.keras`` already resolved to Keras 3, ``TF_USE_LEGACY_KERAS`` set to a false value, or tf-keras not
  installed: raises ``ImportError`` with one sentence saying what to install and set. Nothing of tfdpbnn
  has been imported at that point.

Importing tfdpbnn changes no Keras class; this is the only process-wide setting it makes.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

#: ``"keras"`` when ``tf.keras`` is Keras 2 from the ``keras`` package (TF 2.15), ``"tf_keras"`` when it is
#: tf-keras (TF >= 2.16). Set by ``select()``.
KERAS_PACKAGE = "keras"

_TRUE = ("true", "True", "1")


def _tf_minor() -> tuple[int, int]:
    major, minor = tf.__version__.split(".")[:2]
    return int(major), int(minor)


def _requirement() -> str:
    major, minor = _tf_minor()
    return (f"tfdpbnn needs Keras 2: on TensorFlow {tf.__version__} install tf-keras "
            f"(pip install 'tf-keras~={major}.{minor}.0') and set TF_USE_LEGACY_KERAS=1 before the program "
            "first uses tf.keras (or import tfdpbnn before anything uses tf.keras, and it sets it)")


def _resolved() -> bool:
    """Whether ``tf.keras`` has been resolved (TensorFlow's lazy loader has picked a Keras)."""
    try:
        return bool(object.__getattribute__(tf.keras, "_tfll_initialized"))
    except AttributeError:     # the loader has replaced itself by the module it loaded
        return True


def _resolved_package() -> str:
    """The top-level package of the resolved ``tf.keras`` (``tf_keras``, or ``keras`` for Keras 3 / 2.15)."""
    return tf.keras.Model.__module__.split(".")[0]


def select() -> str:
    """Make ``tf.keras`` Keras 2 (tf-keras on TF >= 2.16) or raise ``ImportError``; returns the package."""
    global KERAS_PACKAGE
    if _tf_minor() < (2, 16):
        KERAS_PACKAGE = "keras"
        return KERAS_PACKAGE
    if _resolved():
        if _resolved_package() != "tf_keras":
            raise ImportError("tf.keras was already resolved to Keras 3 before tfdpbnn was imported; "
                              + _requirement() + ".")
    else:
        flag = os.environ.get("TF_USE_LEGACY_KERAS")
        if flag is not None and flag not in _TRUE:
            raise ImportError(f"TF_USE_LEGACY_KERAS={flag!r} asks TensorFlow for Keras 3; " + _requirement()
                              + ".")
        try:
            import tf_keras  # noqa: F401
        except ImportError as err:
            raise ImportError("tf-keras is not installed; " + _requirement() + ".") from err
        if flag is None:
            os.environ["TF_USE_LEGACY_KERAS"] = "1"
            logging.getLogger("tfdpbnn").info(
                "tfdpbnn set TF_USE_LEGACY_KERAS=1: tf.keras is tf-keras (Keras 2) in this process")
        if _resolved_package() != "tf_keras":     # resolves now: nothing later can pick another Keras
            raise ImportError("tf.keras did not resolve to tf-keras; " + _requirement() + ".")
    KERAS_PACKAGE = "tf_keras"
    return KERAS_PACKAGE
