#!/usr/bin/env bash
# Sets everything up, then runs ruff and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
.venv/bin/python -m pytest "$@"
