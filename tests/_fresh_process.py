"""Run a test file as a script in a fresh interpreter and read the JSON line it prints last.

Logical CPU devices (``tf.config.set_logical_device_configuration``) must be set before TensorFlow starts,
so the ``tf.distribute`` cases run their training in a process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(path: str, timeout: int = 300) -> dict:
    """Run ``path`` with the repository on ``PYTHONPATH``; its last stdout line, parsed as JSON."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, path], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
