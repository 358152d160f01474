#!/usr/bin/env bash
# Sets everything up, then optimizes the built-in attention block and prints the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export KORCH_DB=${KORCH_DB:-$PWD/korch-out/results.db}
exec .venv/bin/korch example "${1:-attention}" -o korch-out
