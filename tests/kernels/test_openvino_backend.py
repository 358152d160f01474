"""OpenVINO as a library backend (Note [OpenVINO as a library]): a region kernel compiled
by OpenVINO at fp32 matches onnxruntime, saves and loads; the whole model and korch's
graph on OpenVINO are plans the end-to-end check races, and one that is kept ships,
saves and loads like any other (issue 26, item 3)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from test_library_backends import kernel_of

pytest.importorskip("openvino")

import korch  # noqa: E402
import korch.selection as selection  # noqa: E402
from korch.ir import GraphBuilder, Op, evaluate  # noqa: E402
from korch.kernels.registry import get_backend  # noqa: E402
from korch.models import build  # noqa: E402

TOL = 1e-4  # relative to the largest magnitude of the reference


def _rel(got, want) -> float:
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))


def _region():
    """MatMul + bias + ReLU, a second MatMul, a residual add: a region (two linear
    primitives) of two outputs."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", (1, 16, 32), "float32")
    w1 = b.const((rng.standard_normal((32, 32)) * 0.2).astype(np.float32), name="w1")
    w2 = b.const((rng.standard_normal((32, 32)) * 0.2).astype(np.float32), name="w2")
    bias = b.const(rng.standard_normal(32).astype(np.float32), name="bias")
    h = b.binary(Op.ADD, b.add(Op.MATMUL, [x, w1]), bias)
    h = b.add(Op.MAX, [h, b.scalar(0.0, h)])
    y = b.binary(Op.ADD, b.add(Op.MATMUL, [h, w2]), x)
    b.output("h", h)
    b.output("y", y)
    return b.graph


def test_region_kernel_matches_the_interpreter_and_reloads(tmp_path):
    kg, consts = kernel_of(_region())
    feeds = {
        n: np.random.default_rng(1).standard_normal(kg.nodes[i].shape).astype(np.float32)
        for n, i in kg.inputs.items()
        if n not in consts
    }
    args = [feeds[n] if n in feeds else consts[n] for n in kg.inputs]
    want = list(evaluate(kg, {**feeds, **consts}).values())
    backend = get_backend("openvino")
    assert backend.supports(kg)
    k = backend.build(kg, consts, 2)
    got = k(args)
    assert len(got) == 2 and all(_rel(a, b) <= TOL for a, b in zip(got, want))
    again = k(args)  # outputs are copies: a second call leaves the first's intact
    np.testing.assert_array_equal(got[0], again[0])
    k.set_threads(1)
    assert all(_rel(a, b) <= TOL for a, b in zip(k(args), want))
    meta = json.loads(json.dumps(k.save(tmp_path, "k0")))
    loaded = backend.load(meta, tmp_path, 1)
    assert all(_rel(a, b) <= TOL for a, b in zip(loaded(args), want))
    assert "f32" in backend.version()


def test_openvino_plans_are_raced_and_a_kept_one_ships(tmp_path, quick_settings, monkeypatch):
    # structure: the check times both OpenVINO plans beside onnxruntime's; this test
    # makes the check keep the model on OpenVINO, whatever the clock says, to see it ship
    monkeypatch.setattr(selection, "_keep", lambda t: selection.OV_MODEL_PLAN)
    model = build("mlp")
    out = tmp_path / "out"
    compiled = korch.optimize(model, output_dir=out, settings=quick_settings())
    check = compiled.report["plan_check"]
    assert {selection.OV_MODEL_PLAN, selection.OV_REGION_PLAN, selection.MODEL_PLAN} <= set(check["ms"]), check
    assert check["kept"] == selection.OV_MODEL_PLAN
    steps = compiled.executable.steps
    assert [s.backend for s in steps] == ["openvino"]

    # numbers: onnxruntime's answer on the model, before and after a reload
    x = np.random.default_rng(2).standard_normal((1, 64, 128)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    name = sess.get_outputs()[0].name
    assert _rel(compiled({"x": x})[name], want) <= TOL
    loaded = korch.load(out)
    assert [s.backend for s in loaded.executable.steps] == ["openvino"]
    assert _rel(loaded({"x": x})[name], want) <= TOL


def test_openvino_plans_can_be_turned_off(quick_settings):
    settings = quick_settings(openvino_plans=False, library_regions=0, in_place_rounds=0)
    compiled = korch.optimize(build("opaque"), settings=settings)
    ms = compiled.report["plan_check"].get("ms", {})
    assert selection.OV_MODEL_PLAN not in ms and selection.OV_REGION_PLAN not in ms
