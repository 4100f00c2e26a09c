"""Which Keras ``tf.keras`` is, and so which adapter tfdpbnn runs on (``tfdpbnn._adapters``).

tfdpbnn runs on Keras 2 (``keras`` on TensorFlow 2.15, tf-keras on TensorFlow >= 2.16) with
tensorflow-privacy's vectorized optimizers as the base classes of its optimizers, and on Keras 3 with the
TensorFlow backend (TensorFlow >= 2.16, where ``tf.keras`` is Keras 3 unless the program asks for tf-keras)
with optimizer base classes of its own on ``keras.optimizers.SGD``/``Adam``. TensorFlow decides lazily, at the
first use of ``tf.keras``, from the environment variable ``TF_USE_LEGACY_KERAS``. ``select()`` runs once,
when tfdpbnn is imported, before anything else of tfdpbnn:

- TensorFlow 2.15: ``tf.keras`` is Keras 2.15; Keras 2.
- ``tf.keras`` already resolved: whichever Keras it resolved to.
- ``TF_USE_LEGACY_KERAS`` set by the program: a true value is Keras 2 (tf-keras must be installed, else
  ``ImportError`` saying what to install), a false value Keras 3.
- Nothing chosen yet: Keras 2 where the Keras 2 set is installed (tf-keras AND tensorflow-privacy, the
  Python 3.11 install): ``TF_USE_LEGACY_KERAS=1`` is set, ``tf.keras`` resolved now, and one INFO line
  (logger ``tfdpbnn``) says so. Otherwise Keras 3, and nothing is set: tfdpbnn uses the Keras the program
  gets.
- Keras 3 beside the Keras 2 set's tensorflow-probability (< 0.25, which fails to import there):
  ``ImportError`` saying which set to install or how to choose Keras 2.

Importing tfdpbnn changes no Keras class; setting ``TF_USE_LEGACY_KERAS`` in the one case above is the only
process-wide setting it makes.
"""

from __future__ import annotations

import logging
import os

import tensorflow as tf

#: ``"keras"`` when ``tf.keras`` is Keras 2 from the ``keras`` package (TF 2.15) or Keras 3, ``"tf_keras"``
#: when it is tf-keras (TF >= 2.16). Set by ``select()``.
KERAS_PACKAGE = "keras"
#: The major version of the Keras ``tf.keras`` is: 2 or 3. Set by ``select()``.
KERAS_MAJOR = 2

_TRUE = ("true", "True", "1")


def _tf_minor() -> tuple[int, int]:
    major, minor = tf.__version__.split(".")[:2]
    return int(major), int(minor)


def _requirement() -> str:
    major, minor = _tf_minor()
    return (f"for Keras 2 on TensorFlow {tf.__version__} install tf-keras "
            f"(pip install 'tf-keras~={major}.{minor}.0')")


def _resolved() -> bool:
    """Whether ``tf.keras`` has been resolved (TensorFlow's lazy loader has picked a Keras)."""
    try:
        return bool(object.__getattribute__(tf.keras, "_tfll_initialized"))
    except AttributeError:     # the loader has replaced itself by the module it loaded
        return True


def _resolved_package() -> str:
    """The top-level package of the resolved ``tf.keras`` (``tf_keras``, or ``keras`` for Keras 3 / 2.15)."""
    return tf.keras.Model.__module__.split(".")[0]


def _installed(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):    # ValueError: sys.modules[name] is None (blocked)
        return False


def select() -> str:
    """Find which Keras ``tf.keras`` is (see the module) and record it; returns the package name."""
    global KERAS_PACKAGE, KERAS_MAJOR
    if _tf_minor() < (2, 16):
        KERAS_PACKAGE, KERAS_MAJOR = "keras", 2
        return KERAS_PACKAGE
    if not _resolved():
        flag = os.environ.get("TF_USE_LEGACY_KERAS")
        if flag is None and _installed("tf_keras") and _installed("tensorflow_privacy"):
            os.environ["TF_USE_LEGACY_KERAS"] = "1"
            logging.getLogger("tfdpbnn").info(
                "tfdpbnn set TF_USE_LEGACY_KERAS=1: tf.keras is tf-keras (Keras 2) in this process")
        elif flag in _TRUE:
            try:
                import tf_keras  # noqa: F401
            except ImportError as err:
                raise ImportError(f"TF_USE_LEGACY_KERAS={flag!r} asks TensorFlow for tf-keras, which is not "
                                  "installed; " + _requirement() + ", or unset it to use Keras 3.") from err
    KERAS_PACKAGE = _resolved_package()       # resolves now: nothing later can pick another Keras
    KERAS_MAJOR = 2 if KERAS_PACKAGE == "tf_keras" else 3
    if KERAS_MAJOR == 3:
        _check_keras3_set()
    return KERAS_PACKAGE


#: The oldest tensorflow-probability tested beside Keras 3 as ``tf.keras`` (0.22 fails to import there).
KERAS3_MIN_TFP = (0, 25)


def _check_keras3_set() -> None:
    """Raise ``ImportError`` when the installed tensorflow-probability cannot run beside Keras 3."""
    from importlib import metadata

    try:
        version = metadata.version("tensorflow-probability")
    except metadata.PackageNotFoundError:
        return      # importing it fails later, naming it
    if tuple(int(p) for p in version.split(".")[:2]) < KERAS3_MIN_TFP:
        raise ImportError(
            f"tf.keras is Keras 3 here, and tensorflow-probability {version} (the Keras 2 set) cannot import "
            "beside it: for Keras 3 install tensorflow-probability>=0.25 (pip install tfdpbnn on Python >= "
            "3.12 installs the Keras 3 set); for Keras 2 set TF_USE_LEGACY_KERAS=1 before the program first "
            "uses tf.keras (or import tfdpbnn first)")
