# Sourced by scripts/demo and scripts/test: make sure a virtual environment exists with python3.11 and the
# package installed (editable, with the test extra), and put it first on PATH.
#   VENV         where (default: .venv, the newest supported set)
#   CONSTRAINTS  optional pip constraints file (scripts/test uses constraints/oldest.txt for .venv-oldest)
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
  echo "Creating $VENV with $PY and installing tfdpbnn[test]${CONSTRAINTS:+ with $(basename "$CONSTRAINTS")} (first run takes a few minutes)..." >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install --quiet ${CONSTRAINTS:+-c "$CONSTRAINTS"} -e "$ROOT[test]"
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
