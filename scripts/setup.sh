#!/usr/bin/env bash
# Creates .venv with korch and its pinned dependencies (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null
.venv/bin/python -m pip install --quiet -e ".[test]"
# what an extra pulled in must not have replaced a pinned package (a newer torch, say)
.venv/bin/python scripts/check_pins.py test
