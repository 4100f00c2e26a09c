# Sourced by scripts/demo and scripts/test: make sure .venv exists with python3.11 and the package
# installed (editable, with the test extra). Re-installs when .venv is missing or older than setup.cfg.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.tfdpbnn-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/setup.cfg" -nt "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  PY="${PYTHON:-}"
  if [ -z "$PY" ]; then
    for cand in python3.11 python3; do
      if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
        PY="$cand"; break
      fi
    done
  fi
  if [ -z "$PY" ]; then
    echo "tfdpbnn needs Python 3.11 (tensorflow-privacy 0.9.0 supports < 3.12); set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  echo "Creating $VENV with $PY and installing tfdpbnn[test] (first run takes a few minutes)..." >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]"
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
