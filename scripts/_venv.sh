# Sourced by scripts/demo and scripts/test: make sure a virtual environment exists with the wanted Python and
# the package installed (editable, with the test extra), and put it first on PATH.
#   VENV         where (default: .venv, the newest Keras 2 set)
#   CONSTRAINTS  optional pip constraints file (scripts/test uses constraints/oldest.txt for .venv-oldest)
#   PY_VERSION   the Python minor version (default 3.11, the Keras 2 sets; scripts/test --keras3 uses 3.13,
#                where setup.cfg's markers install the Keras 3 set); found as pythonX.Y on PATH or in pyenv
# Re-installs when the environment is missing or older than setup.cfg, pyproject.toml or the constraints.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
CONSTRAINTS="${CONSTRAINTS:-}"
STAMP="$VENV/.tfdpbnn-installed"
stale=0
for f in "$ROOT/setup.cfg" "$ROOT/pyproject.toml" ${CONSTRAINTS:+"$CONSTRAINTS"}; do
  [ "$f" -nt "$STAMP" ] && stale=1
done
if [ ! -f "$STAMP" ] || [ "$stale" -eq 1 ]; then
  PY="${PYTHON:-}"
  PY_VERSION="${PY_VERSION:-3.11}"
  if [ -z "$PY" ]; then
    PYENV_PYS=()
    if command -v pyenv >/dev/null 2>&1; then
      for p in "$(pyenv root)"/versions/"$PY_VERSION".*/bin/python"$PY_VERSION"; do
        [ -x "$p" ] && PYENV_PYS+=("$p")
      done
    fi
    for cand in "python$PY_VERSION" python3 ${PYENV_PYS[@]+"${PYENV_PYS[@]}"}; do
      if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import sys; sys.exit(0 if '%d.%d' % sys.version_info[:2] == '$PY_VERSION' else 1)"; then
        PY="$cand"; break
      fi
    done
  fi
  if [ -z "$PY" ]; then
    echo "this set needs Python $PY_VERSION (the Keras 2 sets: 3.11, as tensorflow-privacy 0.9.0 supports < 3.12; the Keras 3 set: 3.13); set PYTHON=/path/to/python$PY_VERSION" >&2
    exit 1
  fi
  echo "Creating $VENV with $PY and installing tfdpbnn[test]${CONSTRAINTS:+ with $(basename "$CONSTRAINTS")} (first run takes a few minutes)..." >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install --quiet ${CONSTRAINTS:+-c "$CONSTRAINTS"} -e "$ROOT[test]"
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
