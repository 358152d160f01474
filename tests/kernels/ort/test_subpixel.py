"""Sub-pixel convolution (Note [Sub-pixel convolution]): the same numbers as
upsample -> pad -> conv, with the conv at the low resolution."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch.fission import fission
from korch.frontend import load_model
from korch.kernels.ort.export import to_onnx
from korch.kernels.ort.subpixel import subpixel_convs


def _model(
    pad: str = "reflect",
    h: int = 5,
    w: int = 7,
    cin: int = 4,
    cout: int = 6,
    bias: bool = True,
    opset: int = 18,
    **conv,
):
    """x -> Resize(nearest, 2x) -> [Pad(1, ``pad``)] -> Conv(3x3) -> Relu."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([1, cin, 2 * h, 2 * w], np.int64), "sizes"),
        numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
    ]
    nodes = [
        helper.make_node(
            "Resize",
            ["x", "", "", "sizes"],
            ["u"],
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )
    ]
    conv_in = "u"
    if pad != "conv":
        nodes.append(helper.make_node("Pad", ["u", "pads"], ["p"], mode=pad))
        conv_in = "p"
    conv_inputs = [conv_in, "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "B"))
        conv_inputs.append("B")
    conv = {"pads": [1, 1, 1, 1] if pad == "conv" else [0, 0, 0, 0], **conv}
    nodes += [
        helper.make_node("Conv", conv_inputs, ["c"], kernel_shape=[3, 3], **conv),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 2 * h, 2 * w])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("pad", ["reflect", "edge", "constant", "conv"])
@pytest.mark.parametrize("bias", [True, False])
def test_subpixel_conv_matches_upsample_then_conv(pad, bias):
    x = np.random.default_rng(1).standard_normal((1, 4, 5, 7)).astype(np.float32)
    want = _run(_model(pad, bias=bias), x)
    rewritten = subpixel_convs(_model(pad, bias=bias))
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "Resize" not in ops and ops.count("Conv") == 1 and "Col2Im" in ops
    (conv,) = [n for n in rewritten.graph.node if n.op_type == "Conv"]
    w = {t.name: tuple(t.dims) for t in rewritten.graph.initializer}[conv.input[1]]
    assert w == (4 * 6, 4, 2, 2)  # four phases of 2x2 taps at the low resolution
    got = _run(rewritten, x)
    assert got.shape == want.shape == (1, 6, 10, 14)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pad": "conv", "strides": [2, 2]},  # not a stride-1 conv
        {"pad": "conv", "dilations": [2, 2], "pads": [2, 2, 2, 2]},
        {"pad": "conv", "group": 2},
        {"opset": 17},  # no Col2Im before opset 18
    ],
)
def test_other_convolutions_stay(kwargs):
    before = [n.op_type for n in _model(**kwargs).graph.node]
    after = [n.op_type for n in subpixel_convs(_model(**kwargs)).graph.node]
    assert after == before


def test_to_onnx_rewrites_what_it_exports():
    """Through fission (nearest upsampling as Gathers, raised back to a Resize) and
    the export, the model computes the same numbers with the conv at low resolution."""
    graph = fission(load_model(_model("reflect", h=8, w=8, cin=16, cout=16)))
    exported = to_onnx(graph)
    ops = [n.op_type for n in exported.graph.node]
    assert "Resize" not in ops and "Col2Im" in ops
    x = np.random.default_rng(2).standard_normal((1, 16, 8, 8)).astype(np.float32)
    want = _run(_model("reflect", h=8, w=8, cin=16, cout=16), x)
    np.testing.assert_allclose(_run(exported, x), want, rtol=1e-4, atol=1e-4)
