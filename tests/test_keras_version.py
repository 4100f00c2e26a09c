"""Which Keras tfdpbnn runs on: the one ``tf.keras`` is, Keras 2 (tf-keras) or Keras 3, never switched.

Each case runs in a fresh Python process, since TensorFlow resolves ``tf.keras`` once per process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
import tensorflow as tf

from tfdpbnn import _keras_version

# Not in the fast tier (./scripts/test --fast): fresh interpreters importing TensorFlow (the oldest set
# runs it).
pytestmark = pytest.mark.slow

NEW_TF = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 16)
needs_new_tf = pytest.mark.skipif(not NEW_TF, reason="TensorFlow 2.15's tf.keras is Keras 2 already")


def _run(code, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(env_changes)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


KERAS2_SET = _keras_version._installed("tf_keras") and _keras_version._installed("tensorflow_privacy")
needs_keras2_set = pytest.mark.skipif(not KERAS2_SET, reason="the Keras 2 set (tf-keras and "
                                      "tensorflow-privacy) is not installed")


def test_this_process_keras_matches_the_adapter():
    from tfdpbnn import _adapters

    package = tf.keras.Model.__module__.split(".")[0]
    assert package == _keras_version.KERAS_PACKAGE
    if _keras_version.KERAS_MAJOR == 2:
        assert package == ("tf_keras" if NEW_TF else "keras")
        assert tf.keras.optimizers.legacy.SGD.__module__.split(".")[0] == package
        assert _adapters.current().__name__ == "tfdpbnn._adapters.keras2"
    else:
        assert package == "keras" and NEW_TF
        assert _adapters.current().__name__ == "tfdpbnn._adapters.keras3"
        assert os.environ.get("TF_USE_LEGACY_KERAS") is None   # tfdpbnn set nothing
    sgd_base = _adapters.optimizer_bases()[0]
    assert issubclass(sgd_base, tf.keras.optimizers.Optimizer if _keras_version.KERAS_MAJOR == 3
                      else tf.keras.optimizers.legacy.Optimizer)


@needs_new_tf
@needs_keras2_set
def test_import_first_picks_tf_keras_and_says_so():
    done = _run("import logging; logging.basicConfig(level=logging.INFO)\n"
                "import os, tfdpbnn, tensorflow as tf\n"
                "print('RESULT', tf.keras.Model.__module__, os.environ['TF_USE_LEGACY_KERAS'])")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT tf_keras.src.engine.training 1" in done.stdout
    assert "tfdpbnn set TF_USE_LEGACY_KERAS=1" in done.stderr


_KERAS3_PROBE = ("import os, tfdpbnn, tensorflow as tf\n"
                 "from tfdpbnn import _adapters\n"
                 "print('RESULT', tfdpbnn._keras_version.KERAS_MAJOR,"
                 " tf.keras.Model.__module__.split('.')[0], _adapters.current().__name__,"
                 " os.environ.get('TF_USE_LEGACY_KERAS'))\n")


TFP_FOR_KERAS3 = tuple(int(p) for p in metadata.version("tensorflow-probability").split(".")[:2]) >= \
    _keras_version.KERAS3_MIN_TFP


def _assert_keras_3_or_refused(done, flag):
    """On the Keras 3 set tfdpbnn runs on Keras 3; beside the Keras 2 set's TFP, one clear ImportError."""
    assert done.returncode == 0, done.stderr[-3000:]
    if TFP_FOR_KERAS3:
        assert f"RESULT 3 keras tfdpbnn._adapters.keras3 {flag}" in done.stdout
    else:
        line = next(x for x in done.stdout.splitlines() if x.startswith("ERROR"))
        assert "tf.keras is Keras 3 here, and tensorflow-probability" in line
        assert "TF_USE_LEGACY_KERAS=1" in line and "tensorflow-probability>=0.25" in line


def _probe(prefix=""):
    return prefix + "try:\n    import tfdpbnn\nexcept ImportError as err:\n    print('ERROR', err)\n" \
        "else:\n" + "".join("    " + line + "\n" for line in _KERAS3_PROBE.splitlines())


@needs_new_tf
def test_keras_3_resolved_first_stays_keras_3():
    # the program resolved Keras 3 first
    done = _run(_probe("import tensorflow as tf\nassert tf.keras.Model.__module__.startswith('keras.')\n"))
    _assert_keras_3_or_refused(done, None)


@needs_new_tf
def test_legacy_keras_switched_off_is_keras_3():
    _assert_keras_3_or_refused(_run(_probe(), TF_USE_LEGACY_KERAS="0"), "0")


@needs_new_tf
def test_without_tensorflow_privacy_nothing_is_set_and_keras_3_runs():
    # as if not installed (the Keras 3 set: tensorflow-probability still installs tf-keras)
    _assert_keras_3_or_refused(_run(_probe("import sys\nsys.modules['tensorflow_privacy'] = None\n")), None)


@needs_new_tf
def test_legacy_keras_asked_without_tf_keras_is_refused():
    done = _run("import sys\nsys.modules['tf_keras'] = None\n"     # as if not installed
                "try:\n    import tfdpbnn\nexcept ImportError as err:\n    print('ERROR', err)\n",
                TF_USE_LEGACY_KERAS="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR TF_USE_LEGACY_KERAS='1' asks TensorFlow for tf-keras, which is not installed" in done.stdout
    assert "pip install 'tf-keras~=" in done.stdout


@needs_keras2_set
def test_tensorflow_privacy_imports_quietly_without_its_package_flag():
    done = _run("import sys\nimport tfdpbnn\n"
                "print('FLAG', hasattr(sys, 'skip_tf_privacy_import'))\n"
                "print('LOADED', 'tensorflow_privacy' in sys.modules,"
                " 'tensorflow_estimator' in sys.modules)\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FLAG False" in done.stdout        # the flag is set only while tensorflow-privacy is imported
    # tensorflow-privacy's estimator code is never imported (on TF >= 2.16 it cannot be)
    assert "LOADED True False" in done.stdout
    # no Python warning a user would see
    assert not re.search(r"\w+Warning: ", done.stderr), done.stderr[-3000:]
