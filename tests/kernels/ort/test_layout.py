"""Channel padding (Note [Channel padding]): same numbers, and onnxruntime keeps its
blocked layout through the padded tensors."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch.fission import fission
from korch.frontend import load_model
from korch.kernels.ort.export import to_onnx
from korch.kernels.ort.layout import nchwc_block, pad_channels

BLOCK = nchwc_block()
C = BLOCK // 2  # a tensor onnxruntime cannot block: padded to BLOCK


def _model(c: int = C, tail: str = "conv", group: int = 1, hw: int = 16) -> onnx.ModelProto:
    """x(3ch) -> Conv(c) + b -> HardSwish -> depthwise Conv -> Relu -> Conv(c) ->
    + residual -> ``tail`` (a dense Conv to 32 channels, a Reshape, or the output)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def w(name, *shape):
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        return name

    nodes += [
        helper.make_node("Conv", ["x", w("w0", c, 3, 3, 3), w("b0", c)], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", w("s0", 1, c, 1, 1)], ["a1"]),
        helper.make_node("HardSwish", ["a1"], ["h"]),
        helper.make_node("Conv", ["h", w("w1", c, 1, 3, 3)], ["d"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("Mul", ["d", w("m1", c, 1, 1)], ["d1"]),
        helper.make_node("Relu", ["d1"], ["r"]),
        helper.make_node("Conv", ["r", w("w2", c, c // group, 1, 1), w("b2", c)], ["e"], group=group),
        helper.make_node("Add", ["e", "h"], ["res"]),
    ]
    outputs = []
    if tail == "conv":
        nodes.append(helper.make_node("Conv", ["res", w("w3", 32, c, 1, 1), w("b3", 32)], ["y"]))
        outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32, hw, hw]))
    elif tail == "reshape":
        inits.append(numpy_helper.from_array(np.array([2, -1], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["res", "shape"], ["y"]))
        outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, c * hw * hw]))
    else:
        nodes.append(helper.make_node("Identity", ["res"], ["y"]))
        outputs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, c, hw, hw]))
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, hw, hw])], outputs, inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _session(model: onnx.ModelProto, optimized: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if optimized:
        opts.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    path = str(tmp_path / "optimized.onnx")
    _session(model, path)
    return [n.op_type for n in onnx.load(path).graph.node]


def _conv_weights(model: onnx.ModelProto) -> list[tuple[int, ...]]:
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [inits[n.input[1]] for n in model.graph.node if n.op_type == "Conv"]


def test_padding_keeps_the_numbers_and_the_blocked_layout(tmp_path):
    model = _model()
    padded = pad_channels(_model())
    onnx.checker.check_model(padded, full_check=True)
    # every Conv of the region padded to BLOCK channels, the tail Conv reads BLOCK
    assert _conv_weights(padded) == [(BLOCK, 3, 3, 3), (BLOCK, 1, 3, 3), (BLOCK, BLOCK, 1, 1), (32, BLOCK, 1, 1)]
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = _session(model).run(None, {"x": x})[0]
    got = _session(padded).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # onnxruntime leaves the blocked layout only at the output once padded
    assert _ops(model, tmp_path).count("ReorderOutput") > 1
    assert _ops(padded, tmp_path).count("ReorderOutput") == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tail": "reshape"},  # a use that mixes channels with the rest
        {"tail": "output"},  # a graph output keeps its shape
        {"group": 2},  # a grouped Conv is neither depthwise nor dense
        {"c": BLOCK // 2 - 1},  # padding would more than double the channels
        {"c": 2 * BLOCK},  # already a multiple of the block
    ],
)
def test_regions_that_stay_as_they_are(kwargs):
    before = _model(**kwargs)
    after = pad_channels(_model(**kwargs))
    assert _conv_weights(after) == _conv_weights(before)
    assert [n.op_type for n in after.graph.node] == [n.op_type for n in before.graph.node]


def test_to_onnx_pads_what_it_exports():
    graph = fission(load_model(_model()))
    exported = to_onnx(graph)
    plain = to_onnx(graph, channel_padding=False)
    assert (BLOCK, BLOCK, 1, 1) in _conv_weights(exported)
    assert (BLOCK, BLOCK, 1, 1) not in _conv_weights(plain)
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = _session(_model()).run(None, {"x": x})[0]
    for m in (exported, plain):
        np.testing.assert_allclose(_session(m).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
