"""The real-model zoo (benchmarks/export_zoo.py) on two of its smallest models: each exports,
runs in onnxruntime matching torch, and OpenVINO (the ``ov`` peer, at fp32) matches
onnxruntime. Skipped where the ``bench`` extra (torch, timm, transformers) is not
installed, as in CI, which installs only the ``test`` extra."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _zoo():
    missing = [m for m in ("torch", "timm", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the zoo needs the bench extra: {', '.join(missing)} not installed")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import export_zoo
    finally:
        sys.path.remove(str(BENCHMARKS))
    return export_zoo


@pytest.mark.parametrize("name", ["mobilenetv3_small", "bert_mini"])
def test_zoo_model_exports_and_runs_in_onnxruntime_and_openvino(name, tmp_path):
    zoo = _zoo()
    entry = zoo.export(name, tmp_path)
    assert entry["ort_ok"], entry.get("ort_error")
    assert entry["ort_vs_torch"] <= 1e-4
    assert entry["onnx_nodes"] > 50 and (tmp_path / f"{name}.torch.json").exists()
    from korch.bench.peers import openvino_runner
    from korch.bench.suite import bench_feeds
    from korch.profile.e2e import max_rel_error, ort_session

    path = tmp_path / entry["file"]
    sess = ort_session(path.read_bytes(), 2)
    dtype = {"tensor(float)": "float32", "tensor(int64)": "int64"}
    feeds = bench_feeds({i.name: SimpleNamespace(shape=i.shape, dtype=dtype[i.type]) for i in sess.get_inputs()})
    want = dict(zip(entry["outputs"], sess.run(None, feeds)))
    run, info = openvino_runner(path, feeds, entry["outputs"], 2)
    assert info["precision"] == "f32"
    assert max_rel_error(run(), want) <= 1e-4
    assert all(np.isfinite(v).all() for v in want.values())
