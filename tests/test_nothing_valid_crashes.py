"""Issue 26: nothing valid crashes (Note [Skipped optimizations]).

Exporter output korch had never seen (a ConvNeXt block with its LayerNorm over
channels between permutes, a MobileNetV3 block) went through ``korch optimize`` to
``internal error: IndexError`` in a rewrite rule. Numbers: each compiles and matches
onnxruntime (rel 1e-4). Structure: nothing was skipped; with a failure injected into
a rewrite rule and a candidate's tiling, the model still compiles and matches, and
``report.json`` names what was skipped. Random valid graphs from the fuzzer's
mutations go through the rewrite search and the ONNX export without an exception.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys

import numpy as np
import pytest

TOL = 1e-4

# small and quick: no library regions, no plan check, no thread race (tests/test_pipeline.py)
FAST = dict(
    progress=False,
    warmup=1,
    repeat=5,
    min_repeat_ms=0.5,
    num_threads=2,
    rewrite_time_limit_s=120.0,
    library_regions=0,
    region_bias=(),
    choose_threads=False,
)


def _export(module, shape, path):
    torch = pytest.importorskip("torch")
    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, (torch.randn(*shape),), str(path), opset_version=17, dynamo=False)
    return path


def _convnext_block():
    """timm's ConvNeXt block with conv_mlp: depthwise 7x7, LayerNorm2d (permute to NHWC,
    LayerNorm over channels, permute back), 1x1 conv, GELU, 1x1 conv, layer scale,
    residual."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class LayerNorm2d(nn.LayerNorm):
        def forward(self, x):
            y = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
            return y.permute(0, 3, 1, 2)

    class Block(nn.Module):
        def __init__(self, c=32):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm = LayerNorm2d(c)
            self.fc1, self.fc2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)
            self.gamma = nn.Parameter(torch.rand(c) * 0.5 + 0.1)

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.norm(self.dw(x))))) * self.gamma.reshape(1, -1, 1, 1)

    torch.manual_seed(0)
    return Block()


def _mobilenetv3_block():
    """Expand conv, hardswish, depthwise conv, squeeze-excite with hardsigmoid, project
    conv, residual (BatchNorms folded by the exporter)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

        def forward(self, x):
            return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))

    class Block(nn.Module):
        def __init__(self, c=32, e=64):
            super().__init__()
            self.expand = nn.Sequential(nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e), nn.Hardswish())
            self.dw = nn.Sequential(
                nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e), nn.Hardswish()
            )
            self.se = SE(e)
            self.proj = nn.Sequential(nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            return x + self.proj(self.se(self.dw(self.expand(x))))

    torch.manual_seed(0)
    m = Block()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("name", ["convnext_block", "mobilenetv3_block"])
def test_unseen_exports_compile_with_korch_optimize(name, tmp_path):
    pytest.importorskip("torch")
    module = {"convnext_block": _convnext_block, "mobilenetv3_block": _mobilenetv3_block}[name]()
    path = _export(module, (1, 32, 14, 14), tmp_path / f"{name}.onnx")
    out = tmp_path / "out"
    proc = subprocess.run(
        # --no-plan-check: CI time; the crash was in the rewrites, long before the plan check
        [sys.executable, "-m", "korch", "optimize", str(path), "-o", str(out), "--db", str(tmp_path / "db"), "-q"]
        + ["--threads", "2", "--no-plan-check"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and "internal error" not in proc.stderr, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["max_rel_error"] <= TOL, report
    assert report["skipped"] == [], report["skipped"]


def test_injected_failures_are_skipped_and_recorded(tmp_path, monkeypatch):
    """A rewrite rule whose replacement raises and a candidate whose tiling raises: the
    model compiles, matches, and report.json lists both with the message."""
    import korch
    import korch.kernels.tvm.tiling as tiling
    import korch.rewrite.rules as tables
    from korch.config import Settings
    from korch.fission import fission
    from korch.frontend import load_model
    from korch.ir import Op
    from korch.models import build
    from korch.rewrite import find_matches

    model = build("mlp")
    g = fission(load_model(model))
    rule = next(r for r, _ in find_matches(g, tables.SEARCH))  # one that matches this model

    def boom(*args, **kwargs):
        raise IndexError("injected rule failure")

    bad = dataclasses.replace(rule, replacement=boom)
    monkeypatch.setattr(tables, "SEARCH", tuple(bad if r is rule else r for r in tables.SEARCH))
    real_model, real_default = tiling.model_tile_config, tiling.default_tile_config
    victim = Op.ERF  # the mlp's GELU: its kernels lose their tile configs

    def no_tiles(real):
        def fn(kg, *args, **kwargs):
            if any(n.op is victim for n in kg.nodes):
                raise ValueError("injected tiling failure")
            return real(kg, *args, **kwargs)

        return fn

    monkeypatch.setattr(tiling, "model_tile_config", no_tiles(real_model))
    monkeypatch.setattr(tiling, "default_tile_config", no_tiles(real_default))
    s = Settings(db_path=str(tmp_path / "db"), **FAST)
    compiled = korch.optimize(model, output_dir=tmp_path / "out", settings=s)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["max_rel_error"] <= TOL, report
    got = {(r["stage"], r["unit"] if r["stage"] == "rewrite" else "", r["message"]) for r in report["skipped"]}
    assert ("rewrite", rule.name, "injected rule failure") in got, report["skipped"]
    assert ("tiling", "", "injected tiling failure") in got, report["skipped"]
    # no generated kernel holds the victim: its primitives run in onnxruntime
    for st in compiled.executable.steps:
        if any(compiled.graph.nodes[n].op is victim for n in st.nodes):
            assert st.backend != "tvm", st
    from korch.cli import format_summary

    assert "optimizations skipped" in format_summary(report)


# mutations that keep a model valid often enough (the others mostly end in a ModelError)
VALID_KINDS = ["nan_const", "drop_node", "swap_inputs", "opset", "wrong_shape", "bad_attr", "duplicate_output"]
FUZZ_CASES = 40


def test_fuzzed_valid_graphs_rewrite_and_export(monkeypatch):
    """Every fuzz case the frontend accepts goes through the rewrite search and the ONNX
    export with nothing raised (and none skipped), and the export matches the
    reference interpreter where the numbers are finite."""
    import onnxruntime as ort

    from korch.diagnostics import collecting
    from korch.errors import KorchError
    from korch.fission import fission
    from korch.frontend import load_model
    from korch.identify import candidates
    from korch.ir import evaluate, verify
    from korch.kernels.ort.export import to_onnx
    from korch.models.fuzz import SEEDS, case
    from korch.partition import partition
    from korch.rewrite import for_library, optimize_graph

    rng = random.Random(26)
    valid = 0
    for i in range(FUZZ_CASES):
        seed, kind, r = rng.choice(SEEDS), rng.choice(VALID_KINDS), rng.randrange(2**32)
        try:
            g = fission(load_model(case(seed, kind, r)))
            verify(g)
        except KorchError:
            continue  # invalid: the frontend's clear error (tests/test_fuzz.py)
        valid += 1
        where = f"{seed}/{kind}/{r}"
        with collecting() as c:
            g2, _ = optimize_graph(g, budget=8, time_limit_s=60.0, patience=3)
            g2 = for_library(g2)
            verify(g2)
            for p in partition(g2, 64)[:2]:
                list(candidates(g2, p, 8))
            proto = to_onnx(g2)
        assert not c.records(), f"{where}: {c.records()}"
        feed = {
            n: np.random.default_rng(i).standard_normal(g.nodes[nid].shape).astype(g.nodes[nid].dtype)
            for n, nid in g.inputs.items()
        }
        if any(np.dtype(g.nodes[nid].dtype).kind != "f" for nid in g.inputs.values()):
            continue
        want = evaluate(g, feed)
        sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        for name, w in want.items():
            if np.issubdtype(w.dtype, np.floating) and np.isfinite(w).all():
                err = np.linalg.norm(got[name] - w) / max(np.linalg.norm(w), 1e-30)
                assert err <= TOL, f"{where}: output {name} rel err {err:.3g}"
    assert valid >= FUZZ_CASES // 4, valid
