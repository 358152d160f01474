#!/usr/bin/env bash
# The cuda target's device check, in one call on the lent GPU machine (an H200).
#
#   here, once:   bash benchmarks/gpu_check.sh --prepare    (the wheels that travel, below)
#   device tool:  run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=600)
#   dry run here: TRITON_INTERPRET=1 bash benchmarks/gpu_check.sh --tiny --max-kernel-size 4 mlp
#                 (tests/benchmarks/test_gpu_check.py runs it, so it cannot rot)
#
# Installs nothing from the network: the machine has torch, Triton, onnx, onnxruntime,
# numpy, sympy, tqdm and psutil but no TVM (/work/.library/device/KINDS.md; the cuda
# target needs none); the MILP solver's wheel (highspy, not on that machine) travels in
# .whl/, which --prepare fills here (pip download; .whl/ is git-ignored locally through
# info/exclude). korch runs from src/ (PYTHONPATH), not installed.
#
# Optimizes a few test and suite models for target cuda, checks every output against
# onnxruntime-CPU and times korch (step loop and CUDA graph) against PyTorch eager,
# torch.compile (default, max-autotune) and onnxruntime's GPU providers where present,
# with CUDA events, and reports the generated memory-bound kernels' bandwidth against the
# device's peak (benchmarks/gpu_check.py); the table is printed last and written to
# $OUT/gpu_check.md. A model that fails or runs past its limit reports what it finished
# and the next one runs; KORCH_GPU_BUDGET_S (default 500 s) bounds the whole run.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then  # here, not on the device: fetch the wheels that travel
  exclude="$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl highspy==1.15.1
  ls -l .whl
  exit 0
fi

OUT="${OUT:-/tmp/korch_gpu_check}"
mkdir -p "$OUT"
BUDGET_S="${KORCH_GPU_BUDGET_S:-500}"
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python

if compgen -G ".whl/*.whl" >/dev/null; then
  # the wheels are the device's Python's (3.12); elsewhere (the dry run here) they may not fit
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/korch_site .whl/*.whl; then
    export PYTHONPATH="/tmp/korch_site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "gpu_check: the wheels in .whl/ do not install on this Python; running without them"
  fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
export KORCH_DB="${KORCH_DB:-/tmp/korch_gpu_work/results.db}"

{
  echo "== $(date -u +%FT%TZ) $(uname -m)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  "$PY" - <<'EOF' || true
import importlib
for m in ("torch", "triton", "onnx", "onnxruntime", "numpy", "sympy", "highspy", "tqdm", "psutil"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__, e)
try:
    import torch
    print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except Exception as e:  # noqa: BLE001
    print("torch", e)
EOF
} 2>&1 | tee "$OUT/env.txt"

rc=0
timeout --kill-after=10 "$BUDGET_S" "$PY" benchmarks/gpu_check.py --out "$OUT" --budget-s "$((BUDGET_S - 40))" "$@" || rc=$?
echo
if [ -f "$OUT/gpu_check.md" ]; then
  [ "$rc" -ne 0 ] && echo "(exit $rc: a model failed or the budget ran out; see $OUT/gpu_check.log)"
  cat "$OUT/gpu_check.md"
else
  echo "no table: gpu_check.py exited $rc before finishing a model"
fi
exit "$rc"
