"""Native pooling (Note [Native pooling] in korch_rt.cc) against onnxruntime: MaxPool
exactly equal (a selection), AveragePool within 1e-5 (the sum's order differs); the
vector paths (unit stride, stride 2, a gather for stride 3) and the scalar edges; what
it refuses; a pooling in a compiled plan is a step of the native segment."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_library_backends import kernel_of

from korch.fission.driver import fission
from korch.kernels.native.pool import pool_spec
from korch.kernels.registry import get_backend


def pool_model(op, shape, kernel, strides, pads=(0, 0, 0, 0), dilations=None, ceil_mode=0, **extra):
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), pads=list(pads), ceil_mode=ceil_mode, **extra)
    if dilations is not None:
        attrs["dilations"] = list(dilations)
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return onnx.shape_inference.infer_shapes(m)


def native_kernel(model):
    kg, consts = kernel_of(fission(model))
    backend = get_backend("native")
    if not backend.supports(kg):
        return None, kg
    return backend.build(kg, consts, 2), kg


CASES = [
    # resnet18's: 3x3 stride 2 pad 1 over 112x112 (stride 2 deinterleaved, 16 + 16 + 16 + 8 columns)
    ("MaxPool", (1, 64, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), {}),
    ("MaxPool", (1, 16, 32, 32), (5, 5), (1, 1), (2, 2, 2, 2), {}),  # YOLO's SPPF: unit stride
    ("MaxPool", (2, 3, 15, 17), (2, 2), (2, 2), (0, 0, 0, 0), {}),  # no pad, odd sizes
    ("MaxPool", (1, 4, 20, 40), (3, 3), (3, 3), (1, 1, 1, 1), {}),  # stride 3: the gather
    ("MaxPool", (1, 4, 21, 21), (3, 3), (2, 2), (0, 0, 0, 0), {"ceil_mode": 1}),  # pad past the end
    ("MaxPool", (1, 4, 24, 24), (3, 3), (1, 1), (2, 2, 2, 2), {"dilations": (2, 2)}),
    ("MaxPool", (1, 2, 5, 3), (3, 3), (1, 1), (1, 1, 1, 1), {}),  # narrower than a vector: all scalar
    ("AveragePool", (1, 32, 28, 28), (3, 3), (1, 1), (0, 0, 0, 0), {}),
    ("AveragePool", (1, 8, 56, 56), (2, 2), (2, 2), (0, 0, 0, 0), {}),  # DenseNet's transition
    ("AveragePool", (1, 8, 20, 20), (3, 3), (1, 1), (1, 1, 1, 1), {"count_include_pad": 1}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}_{'x'.join(map(str, c[1]))}_k{c[2][0]}s{c[3][0]}")
def test_pool_matches_onnxruntime(case):
    op, shape, kernel, strides, pads, extra = case
    extra = dict(extra)
    dil = extra.pop("dilations", None)
    model = pool_model(op, shape, kernel, strides, pads, dilations=dil, **extra)
    kern, kg = native_kernel(model)
    assert kern is not None, "the native backend should take this pooling"
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):
        got = kern([x])[0]
    assert got.shape == want.shape
    if op == "MaxPool":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pool_refusals():
    # AveragePool with padding it does not count: the divisor varies per pixel
    m = pool_model("AveragePool", (1, 4, 10, 10), (3, 3), (1, 1), (1, 1, 1, 1))
    assert native_kernel(m)[0] is None
    # a kernel that computes more than the pooling
    b_model = pool_model("MaxPool", (1, 4, 10, 10), (2, 2), (2, 2))
    g = fission(b_model)
    assert pool_spec(kernel_of(g)[0]) is not None
    relu = helper.make_node("Relu", ["y"], ["z"])
    gg = b_model.graph
    gg.node.append(relu)
    gg.output[0].name = "z"
    assert native_kernel(onnx.shape_inference.infer_shapes(b_model))[0] is None


def test_pool_is_a_step_of_the_native_segment():
    # exp (tvm) -> 3x3 stride-2 max pool (native) in one segment call, saved and loaded
    from korch.executable import Step
    from korch.executable.native import fuse_native, native_kind
    from korch.ir import GraphBuilder, Op

    shape = (1, 8, 30, 30)
    b = GraphBuilder()
    b.output("y", b.unary(Op.EXP, b.input("x", shape, "float32")))
    kg, consts = kernel_of(b.graph)
    exp = get_backend("tvm").build(kg, consts, 2)
    model = pool_model("MaxPool", shape, (3, 3), (2, 2), (1, 1, 1, 1))
    pool, _ = native_kernel(model)
    steps = [
        Step("k0", "tvm", "w0", (1,), (0,), (1,), exp, cost_us=10.0),
        Step("k1", "native", "w1", (2,), (1,), (2,), pool, cost_us=5.0),
    ]
    assert native_kind(steps[1]) == "linear"
    fused = fuse_native(steps, {2}, {}.get, 2)
    assert [s.backend for s in fused] == ["native-segment"]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.exp(x)}
    )[0]
    (got,) = fused[0].kernel([x])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    meta = pool.save(None, "k1")
    again = get_backend("native").load(meta, None, 2)
    np.testing.assert_array_equal(again([np.exp(x)])[0], pool([np.exp(x)])[0])
