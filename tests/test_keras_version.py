"""tf.keras is Keras 2 under tfdpbnn: tf-keras on TensorFlow >= 2.16, or one clear ImportError.

Each case runs in a fresh Python process, since TensorFlow resolves ``tf.keras`` once per process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


def test_this_process_runs_keras_2():
    expected = "tf_keras" if NEW_TF else "keras"
    assert expected == _keras_version.KERAS_PACKAGE
    assert tf.keras.Model.__module__.split(".")[0] == expected
    assert tf.keras.optimizers.legacy.SGD.__module__.split(".")[0] == expected


@needs_new_tf
def test_import_first_picks_tf_keras_and_says_so():
    done = _run("import logging; logging.basicConfig(level=logging.INFO)\n"
                "import os, tfdpbnn, tensorflow as tf\n"
                "print('RESULT', tf.keras.Model.__module__, os.environ['TF_USE_LEGACY_KERAS'])")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT tf_keras.src.engine.training 1" in done.stdout
    assert "tfdpbnn set TF_USE_LEGACY_KERAS=1" in done.stderr


@needs_new_tf
def test_keras_3_resolved_first_is_one_clear_error():
    done = _run("import tensorflow as tf\n"
                "assert tf.keras.Model.__module__.startswith('keras')\n"   # Keras 3 resolved
                "try:\n    import tfdpbnn\nexcept ImportError as err:\n    print('ERROR', err)\n")
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("ERROR"))
    assert "already resolved to Keras 3" in line
    assert "tf-keras" in line and "TF_USE_LEGACY_KERAS=1" in line
    assert "Traceback" not in done.stderr


@needs_new_tf
def test_legacy_keras_switched_off_is_refused():
    done = _run("try:\n    import tfdpbnn\nexcept ImportError as err:\n    print('ERROR', err)\n",
                TF_USE_LEGACY_KERAS="0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR TF_USE_LEGACY_KERAS='0' asks TensorFlow for Keras 3" in done.stdout


@needs_new_tf
def test_missing_tf_keras_is_refused():
    done = _run("import sys\nsys.modules['tf_keras'] = None\n"     # as if not installed
                "try:\n    import tfdpbnn\nexcept ImportError as err:\n    print('ERROR', err)\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR tf-keras is not installed" in done.stdout
    assert "pip install 'tf-keras~=" in done.stdout


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
