"""The device check's dry run (issue 27): ``benchmarks/gpu_check.sh`` on a tiny model under
Triton's interpreter, as the device would run it but on the CPU, so the script cannot rot
between the sessions that are lent a GPU. TVM is hidden from it, as on the device image.

Numbers: korch's and torch eager's outputs within the script's tolerance (1e-4) of
onnxruntime-CPU. Structure: one table row for the model, with korch, eager and
onnxruntime-CPU times, the memory-bound kernels' bandwidth, and the GPU-only columns
(CUDA graph, torch.compile, onnxruntime-GPU) said to be skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_under_interpreter(tmp_path):
    hide = tmp_path / "hide"  # the device image has no TVM: the cuda target must not need it
    (hide / "tvm").mkdir(parents=True)
    (hide / "tvm" / "__init__.py").write_text("raise ImportError('no TVM on the device image')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KORCH_DB",)}
    env.update(
        TRITON_INTERPRET="1",
        PYTHON=sys.executable,
        OUT=str(tmp_path / "out"),
        KORCH_GPU_BUDGET_S="150",
        PYTHONPATH=str(hide),
    )
    cmd = ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--tiny", "--max-kernel-size", "4"]
    cmd += ["--work", str(tmp_path / "work"), "mlp"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [r["model"] for r in rows] == ["mlp"]
    r = rows[0]
    assert r["ok"] and r["rel_err"] <= 1e-4, r
    assert r["eager_rel_err"] <= 1e-4, r
    assert r["korch_ms"] > 0 and r["eager_ms"] > 0 and r["ort_cpu_ms"] > 0
    assert set(r["kernels"]) <= {"triton", "torch_cuda"} and r["kernels"].get("triton", 0) >= 1, r["kernels"]
    assert r["membound_kernels"] == r["kernels"]["triton"] and r["membound_gbps"] > 0 and r["copy_gbps"] > 0
    assert r["cuda_graph"].startswith("skipped") and r["korch_graph_error"].startswith("skipped")
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert table.strip() in proc.stdout  # printed last
    head, rule, line = [ln for ln in table.splitlines() if ln.startswith("|")][:3]
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in line.strip("|").split("|")]))
    assert cells["model"] == "mlp" and cells["ok"] == "yes"
    for col in ("korch ms", "torch eager ms (err)", "ort-cpu ms", "mem-bound GB/s"):
        assert float(cells[col].split()[0]) > 0, (col, cells[col])
    assert cells["torch.compile ms (err)"] == "skipped" and cells["max-autotune ms (err)"] == "skipped"
