"""Every ```python block of README.md and docs/*.md runs, as written, in the test suite.

Convention (also stated in docs/getting_started.md):

* Each Markdown file is one test. Its ```python blocks run in order in one namespace (a later block may use
  names from an earlier one), in a fresh temporary working directory, so files they write vanish.
* The environment variable ``TFDPBNN_DOCS_FAST=1`` is set while they run. A block whose full-size settings
  would be slow reads it to choose *argument values* (epochs, samples, ...), for example
  ``epochs = 2 if os.environ.get("TFDPBNN_DOCS_FAST") else 30``; the code path is the same either way.
* The pages under docs/, and any file containing the line ``<!-- docs-test: slow -->``, are marked ``slow``:
  in the full suite, not in the fast tier (``./scripts/test --fast``), which runs README.md's blocks.
* A page with the line ``<!-- docs-test: keras-2-only: REASON -->`` is skipped on the Keras 3 set, with
  REASON (a feature its examples use is not ported to Keras 3 yet).
* Snippets that are not meant to run (shell commands, pseudo-code, output) use ```text or ```bash fences.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
SLOW_MARK = "<!-- docs-test: slow -->"
#: A page whose examples use a feature not ported to Keras 3 yet: skipped on the Keras 3 set, with the reason.
KERAS2_ONLY = re.compile(r"<!-- docs-test: keras-2-only: (.*?) -->")
FAST_ENV = "TFDPBNN_DOCS_FAST"


def python_blocks(text):
    """The ```python blocks of a Markdown text, in order, each as (first line number, source)."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def _doc_files():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    params = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if not python_blocks(text):
            continue
        # The fast tier runs README.md's examples; docs/ pages run in the full suite.
        marks = [pytest.mark.slow] if SLOW_MARK in text or path.name != "README.md" else []
        keras2_only = KERAS2_ONLY.search(text)
        if keras2_only:
            from tfdpbnn import _keras_version

            marks.append(pytest.mark.skipif(_keras_version.KERAS_MAJOR != 2, reason=keras2_only.group(1)))
        params.append(pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks))
    return params


def test_python_blocks_parser():
    text = "a\n```python\nx = 1\n```\n```text\nnot run\n```\n```python\ny = x + 1\n```\n"
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "y = x + 1\n")]


@pytest.mark.parametrize("path", _doc_files())
def test_doc_python_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(FAST_ENV, "1")
    namespace = {"__name__": "__docs__"}
    rel = path.relative_to(ROOT)
    for line, source in python_blocks(path.read_text(encoding="utf-8")):
        # Pad with newlines so tracebacks point at the Markdown line numbers.
        code = compile("\n" * (line - 1) + source, str(rel), "exec")
        exec(code, namespace)  # noqa: S102 - running the documentation is the point of this test
