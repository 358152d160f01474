"""``--target cuda`` on the command line (issue 27): a one-line error where the target
cannot run, and under Triton's interpreter an optimize that works and matches
onnxruntime (max relative error <= 1e-4), every kernel a device kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from korch.cli import build_parser, main


@pytest.fixture
def tiny_mlp(tmp_path):
    import onnx

    from korch.models import zoo

    path = tmp_path / "mlp_tiny.onnx"
    onnx.save(zoo.mlp(seq=4, dim=8), str(path))
    return path


def _no_cuda_env() -> dict:
    """No interpreter and no visible device: what a machine without a GPU looks like."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@pytest.mark.parametrize("command", ["optimize", "bench"])
def test_cuda_target_without_device_is_one_line(command, tiny_mlp, tmp_path):
    pytest.importorskip("torch")
    args = [str(tiny_mlp), "-o", str(tmp_path / "o"), "--target", "cuda"]
    proc = subprocess.run(
        [sys.executable, "-m", "korch", command, *args],
        env=_no_cuda_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("korch: error: --target cuda"), proc.stderr
    assert "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # refused before any work


def test_cuda_target_without_triton_is_one_line(tiny_mlp, tmp_path, monkeypatch, capsys):
    import importlib.util

    from korch.kernels import device as D

    real = importlib.util.find_spec
    monkeypatch.setattr(D.importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert main(["optimize", str(tiny_mlp), "-o", str(tmp_path / "o"), "--target", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs triton" in err and "Traceback" not in err


def test_cuda_graph_switch(monkeypatch):
    from korch.cli import settings_from_args
    from korch.kernels import device as D

    monkeypatch.setattr(D, "cuda_target_problem", lambda: None)
    p = build_parser()
    assert settings_from_args(p.parse_args(["optimize", "m.onnx", "-o", "o", "--target", "cuda"])).cuda_graph is True
    s = settings_from_args(p.parse_args(["optimize", "m.onnx", "-o", "o", "--target", "cuda", "--no-cuda-graph"]))
    assert s.cuda_graph is False and s.target == "cuda"
    assert settings_from_args(p.parse_args(["optimize", "m.onnx", "-o", "o"])).target == "cpu"


def test_optimize_cuda_target_under_interpreter(tiny_mlp, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out = tmp_path / "o"
    env = {**os.environ, "TRITON_INTERPRET": "1", "KORCH_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "korch", "optimize", str(tiny_mlp), "-o", str(out), "--target", "cuda", "-q"]
    cmd += ["--max-kernel-size", "4", "--db", str(tmp_path / "db.sqlite"), "--threads", "1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CUDA graph" in proc.stdout and "skipped" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["target"] == "cuda" and report["max_rel_error"] <= 1e-4
    assert report["cuda_graph"].startswith("skipped")  # no CUDA device under the interpreter
    plan = json.loads((out / "plan.json").read_text())
    backends = {s["backend"] for s in plan["steps"]}
    assert "triton" in backends and backends <= {"triton", "torch_cuda"}, backends
    assert plan["cuda_graph"] is True  # the setting is kept for a device that has CUDA
