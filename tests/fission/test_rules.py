"""Every fission rule, checked numerically against onnxruntime on fresh random inputs.

Tolerance: float32 results must satisfy rtol=1e-4, atol=1e-5 (float16: 1e-3/1e-3);
integer and bool results must be equal. Set KORCH_TEST_SEED to replay a failure (the
seed is printed in the assertion message).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from korch.fission import RULES, fission
from korch.frontend import load_model
from korch.ir import Op, evaluate, parse_graph, print_graph, verify
from korch.ir.text import assert_structural_equal
from korch.kernels.ort.opaque_eval import run_opaque_ort

RTOL, ATOL = 1e-4, 1e-5


@dataclasses.dataclass(frozen=True)
class In:
    """A runtime input: shape, dtype and how to draw values."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    kind: str = "normal"  # normal | pos | int | bool | nan


@dataclasses.dataclass
class Case:
    op: str
    inputs: list[Any]  # In (runtime input), np.ndarray (initializer) or None (absent)
    attrs: dict = dataclasses.field(default_factory=dict)
    opset: int = 17
    outputs: int = 1
    tag: str = ""
    fold: bool = True  # run the frontend (which would fold an all-constant node away)
    opaque: bool = False  # the rule is expected not to apply

    @property
    def id(self) -> str:
        return f"{self.op}-{self.tag}" if self.tag else self.op


def f32(*shape, lo=-1.0, hi=1.0, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def i64(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def s32(v) -> np.ndarray:
    return np.array(v, dtype=np.float32)


X4 = In((2, 3, 4, 5))
X3 = In((2, 3, 4))
POS = In((2, 3, 4), kind="pos")
B3 = In((2, 3, 4), "bool", "bool")
I3 = In((2, 3, 4), "int64", "int")

CASES: list[Case] = [
    # --- arithmetic ---------------------------------------------------------------
    Case("Add", [X3, In((3, 1))], tag="broadcast"),
    Case("Add", [X3, s32(0.5)], tag="scalar-const"),
    Case("Add", [In(()), X3], tag="scalar-input"),
    Case("Sub", [In((4,)), X3]),
    Case("Mul", [X3, f32(1, 3, 4)]),
    Case("Div", [X3, In((2, 1, 4), kind="pos")]),
    Case("Div", [I3, np.array([3, -2, 5, 7], np.int64)], tag="int"),
    Case("Pow", [POS, In((3, 4))]),
    Case("Pow", [X3, s32(2.0)], tag="square"),
    Case("Pow", [POS, np.array(3, np.int64)], tag="int-exponent"),
    Case("Max", [X3, In((3, 1)), In((4,))]),
    Case("Min", [X3, In((2, 1, 1))]),
    Case("Sum", [X3, In((3, 4)), In((2, 3, 4))]),
    Case("Mean", [X3, In((4,))]),
    Case("Where", [In((2, 1, 4), "bool", "bool"), In((3, 4)), In((2, 3, 1))]),
    Case("Equal", [I3, In((4,), "int64", "int")]),
    Case("Less", [X3, In((3, 4))]),
    Case("Greater", [X3, s32(0.0)]),
    Case("LessOrEqual", [I3, In((3, 4), "int64", "int")], opset=16),
    Case("GreaterOrEqual", [I3, In((3, 4), "int64", "int")], opset=16),
    Case("And", [B3, In((4,), "bool", "bool")]),
    Case("Or", [B3, B3]),
    Case("Xor", [B3, In((3, 4), "bool", "bool")]),
    Case("Not", [B3]),
    Case("IsNaN", [In((2, 3, 4), kind="nan")]),
    Case("Neg", [X3]),
    Case("Abs", [X3]),
    Case("Floor", [X3]),
    Case("Ceil", [X3]),
    Case("Exp", [X3]),
    Case("Log", [POS]),
    Case("Sqrt", [POS]),
    Case("Reciprocal", [POS]),
    Case("Erf", [X3]),
    Case("Tanh", [X3]),
    Case("Sigmoid", [X3]),
    Case("Cast", [X3], {"to": onnx.TensorProto.INT32}, tag="float-int"),
    Case("Cast", [I3], {"to": onnx.TensorProto.FLOAT}, tag="int-float"),
    Case("Cast", [X3], {"to": onnx.TensorProto.FLOAT16}, tag="half"),
    Case("Cast", [I3], {"to": onnx.TensorProto.BOOL}, tag="bool"),
    Case("CastLike", [X3, np.zeros(1, np.int64)], opset=19),
    Case("Identity", [X3]),
    Case("Dropout", [X3], opset=13),
    Case("Dropout", [X3], {"ratio": 0.3}, opset=7, tag="v7"),
    # --- activations ----------------------------------------------------------------
    Case("Relu", [X3]),
    Case("LeakyRelu", [X3], {"alpha": 0.1}),
    Case("PRelu", [X4, f32(3, 1, 1)]),
    Case("Elu", [In((2, 3, 4), kind="wide")], {"alpha": 0.7}),
    Case("Selu", [In((2, 3, 4), kind="wide")]),
    Case("Celu", [X3], {"alpha": 0.5}),
    Case("ThresholdedRelu", [X3], {"alpha": 0.3}),
    Case("HardSigmoid", [In((2, 3, 4), kind="wide")], {"alpha": 0.3, "beta": 0.4}),
    Case("HardSwish", [In((2, 3, 4), kind="wide")], opset=14),
    Case("Gelu", [X3], opset=20, tag="erf"),
    Case("Gelu", [X3], {"approximate": "tanh"}, opset=20, tag="tanh"),
    Case("Softplus", [In((2, 3, 4), kind="wide")]),
    Case("Mish", [In((2, 3, 4), kind="wide")], opset=18),
    Case("Softsign", [X3]),
    Case("Clip", [X3, s32(-0.5), s32(0.25)], opset=13, tag="inputs"),
    Case("Clip", [X3, None, s32(0.25)], opset=13, tag="max-only"),
    Case("Clip", [X3, In(())], opset=13, tag="runtime-min"),
    Case("Clip", [X3], {"min": -0.2, "max": 0.3}, opset=6, tag="attrs"),
    # --- normalization --------------------------------------------------------------
    Case("Softmax", [X3], opset=13),
    Case("Softmax", [In((2, 3, 4), kind="wide")], {"axis": 1}, opset=13, tag="axis1"),
    Case("Softmax", [X3], {"axis": 1}, opset=11, tag="v11-flatten"),
    Case("LogSoftmax", [X3], opset=13),
    Case("LogSoftmax", [X3], opset=11, tag="v11-flatten"),
    Case("LayerNormalization", [X3, f32(4), f32(4, seed=1)]),
    Case("LayerNormalization", [X3, f32(3, 4)], {"axis": -2, "epsilon": 1e-3}, outputs=3, tag="axis-2-stats"),
    Case("InstanceNormalization", [X4, f32(3), f32(3, seed=1)]),
    Case("BatchNormalization", [X4, f32(3), f32(3, seed=1), f32(3, seed=2), f32(3, lo=0.5, hi=2)], opset=15),
    Case(
        "BatchNormalization",
        [X4, In((3,)), In((3,)), In((3,)), In((3,), kind="pos")],
        opset=15,
        tag="runtime-stats",
    ),
    Case("GroupNormalization", [In((2, 6, 3, 4)), f32(6), f32(6, seed=1)], {"num_groups": 3}, opset=21),
    # --- reductions -----------------------------------------------------------------
    Case("ReduceMean", [X4], {"axes": [1, -1], "keepdims": 0}, opset=13, tag="attr"),
    Case("ReduceMean", [X4, i64(2)], opset=18, tag="input"),
    Case("ReduceSum", [X4, i64(0, 2)], opset=13),
    Case("ReduceSum", [X4], {"axes": [1], "keepdims": 0}, opset=11, tag="v11"),
    Case("ReduceSum", [X4], {"noop_with_empty_axes": 1}, opset=13, tag="noop"),
    Case("ReduceMax", [X4], {"keepdims": 0}, opset=18, tag="all"),
    Case("ReduceMin", [X4, i64(-1)], opset=18),
    Case("ReduceL2", [X4, i64(1, 3)], opset=18),
    Case("ReduceL1", [X4, i64(1)], {"keepdims": 0}, opset=18),
    Case("ReduceSumSquare", [X4, i64(3)], opset=18),
    Case("ReduceLogSum", [In((2, 3, 4), kind="pos"), i64(1)], opset=18),
    Case("ReduceLogSumExp", [In((2, 3, 4), kind="wide"), i64(2)], {"keepdims": 0}, opset=18),
    # --- linear ---------------------------------------------------------------------
    Case("Gemm", [In((3, 5)), f32(4, 5), f32(4)], {"transB": 1, "alpha": 0.5, "beta": 2.0}),
    Case("Gemm", [In((5, 3)), In((5, 4))], {"transA": 1}, tag="runtime-B"),
    Case("Gemm", [In((3, 5)), f32(5, 4), In((3, 1))], {"beta": 0.5}, tag="runtime-C"),
    Case("MatMul", [X4, f32(5, 6)], tag="weight"),
    Case("MatMul", [In((2, 1, 4, 5)), In((3, 5, 6))], tag="batch-broadcast"),
    Case("MatMul", [In((4, 5)), In((2, 5, 6))], tag="broadcast-A"),
    Case("MatMul", [In((5,)), In((2, 5, 6))], tag="vector-A"),
    Case("MatMul", [X4, In((5,))], tag="vector-B"),
    Case("MatMul", [In((5,)), In((5,))], tag="dot"),
    Case("MatMul", [In((2, 3, 4, 5)), In((1, 1, 5, 6))], tag="unit-batch-B"),
    Case(
        "Conv",
        [In((1, 4, 7, 6)), f32(6, 2, 3, 3), f32(6)],
        {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2], "group": 2},
        tag="2d",
    ),
    Case("Conv", [In((2, 3, 9)), f32(4, 3, 3)], {"auto_pad": "SAME_UPPER", "strides": [2]}, tag="1d-same-upper"),
    Case("Conv", [In((1, 2, 6, 5)), f32(2, 2, 2, 2)], {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, tag="same-lower"),
    Case("Conv", [In((1, 3, 6, 5)), f32(3, 1, 3, 3), f32(3)], {"auto_pad": "VALID", "group": 3}, tag="depthwise"),
    # --- layout ---------------------------------------------------------------------
    Case("Transpose", [X4]),
    Case("Transpose", [X4], {"perm": [0, 2, 3, 1]}, tag="perm"),
    Case("Reshape", [X4, i64(0, -1, 5)]),
    Case("Reshape", [X4, i64(6, 20)], {"allowzero": 1}, opset=14, tag="allowzero"),
    Case("Flatten", [X4], {"axis": 2}),
    Case("Flatten", [X4], {"axis": 0}, tag="axis0"),
    Case("Flatten", [X4], {"axis": -1}, tag="neg"),
    Case("Squeeze", [In((2, 1, 4, 1)), i64(-1)], opset=13),
    Case("Squeeze", [In((2, 1, 4, 1))], opset=13, tag="all"),
    Case("Squeeze", [In((2, 1, 4, 1))], {"axes": [1]}, opset=11, tag="attr"),
    Case("Unsqueeze", [X3, i64(0, -1)], opset=13),
    Case("Unsqueeze", [X3], {"axes": [2]}, opset=11, tag="attr"),
    Case("Expand", [In((3, 1)), i64(2, 3, 4)]),
    Case("Expand", [In((2, 3, 4)), i64(3, 1)], tag="keep"),
    Case("Tile", [In((2, 3)), i64(2, 3)]),
    Case("Concat", [X3, In((2, 1, 4)), In((2, 2, 4))], {"axis": 1}),
    Case("Concat", [X3, f32(2, 3, 2)], {"axis": -1}, tag="const"),
    Case("Split", [In((2, 6, 3)), i64(2, 3, 1)], {"axis": 1}, opset=13, outputs=3),
    Case("Split", [In((7, 2))], {"num_outputs": 3}, opset=18, outputs=3, tag="num-outputs"),
    Case("Split", [In((2, 6))], {"axis": -1, "split": [4, 2]}, opset=11, outputs=2, tag="attr"),
    Case("Split", [In((2, 6))], {"axis": 1}, opset=13, outputs=3, tag="equal"),
    Case("Slice", [X4, i64(1, -1), i64(3, -(10**9)), i64(1, 3), i64(1, -2)], opset=13, tag="neg-step"),
    Case("Slice", [X4, i64(-3, 0), i64(10**9, 4), i64(-2, 0), i64(2, 1)], opset=13, tag="clamp"),
    Case("Slice", [X4, i64(5), i64(0), i64(3), i64(-1)], opset=13, tag="reverse"),
    Case("Slice", [X4, i64(0), i64(2)], opset=13, tag="defaults"),
    Case("Slice", [X4], {"starts": [1], "ends": [3], "axes": [2]}, opset=9, tag="attr"),
    Case("Pad", [X3, i64(0, 1, 2, 0, 2, 1), s32(1.5)], opset=13, tag="constant"),
    Case("Pad", [X3, i64(0, 2, 1, 0, 1, 3)], {"mode": "reflect"}, opset=13, tag="reflect"),
    Case("Pad", [X3, i64(1, 2, 1, 0, 1, 3)], {"mode": "edge"}, opset=13, tag="edge"),
    Case("Pad", [X3, i64(0, -1, 2, 0, 1, -2)], opset=13, tag="negative"),
    Case("Pad", [X3, i64(1, 2), s32(-1.0), i64(-1)], opset=18, tag="axes"),
    Case("Pad", [X3], {"pads": [0, 1, 0, 0, 1, 0], "value": 2.0}, opset=10, tag="attr"),
    Case("Gather", [X3, np.array([[0, -1], [2, 1]], np.int64)], {"axis": 1}),
    Case("Gather", [X3, np.array(-2, np.int64)], tag="scalar"),
    Case("Gather", [X3, In((2,), "int64", "index")], tag="runtime-indices", opaque=True),
    Case("DepthToSpace", [In((1, 8, 2, 3))], {"blocksize": 2}),
    Case("DepthToSpace", [In((1, 8, 2, 3))], {"blocksize": 2, "mode": "CRD"}, tag="crd"),
    Case("SpaceToDepth", [In((1, 2, 4, 6))], {"blocksize": 2}),
    Case("Shape", [X3], {"start": 1}, opset=15, fold=False),
    Case("Size", [X3], fold=False),
    # --- pooling and resize ---------------------------------------------------------
    Case("GlobalAveragePool", [X4]),
    Case("GlobalMaxPool", [X4]),
    Case("AveragePool", [In((1, 2, 7, 6))], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    Case(
        "AveragePool",
        [In((1, 2, 7, 6))],
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1},
        tag="include-pad",
    ),
    Case("AveragePool", [In((1, 2, 8, 7))], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, tag="ceil"),
    Case("AveragePool", [In((2, 3, 9))], {"kernel_shape": [3], "strides": [2], "auto_pad": "SAME_UPPER"}, tag="1d"),
    Case("MaxPool", [In((1, 2, 7, 6))], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    Case("MaxPool", [In((1, 2, 8, 7))], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, tag="ceil"),
    Case("MaxPool", [In((1, 2, 8, 7))], {"kernel_shape": [2, 3], "dilations": [2, 1]}, tag="dilated"),
    Case("MaxPool", [In((1, 2, 6, 6))], {"kernel_shape": [2, 2]}, outputs=2, tag="indices", opaque=True),
    Case("Resize", [X4, None, s32([1, 1, 2, 1.5])], opset=13, tag="nearest-scales"),
    Case(
        "Resize",
        [X4, None, None, i64(2, 3, 7, 3)],
        {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        opset=13,
        tag="nearest-sizes",
    ),
    Case(
        "Resize",
        [X4, None, s32([1, 1, 0.5, 0.6])],
        {"nearest_mode": "round_prefer_ceil"},
        opset=13,
        tag="nearest-down",
    ),
    Case("Resize", [X4, None, s32([1, 1, 2, 2])], {"mode": "linear"}, opset=13, tag="bilinear"),
    Case(
        "Resize",
        [X4, None, None, i64(2, 3, 3, 9)],
        {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
        opset=13,
        tag="align-corners",
    ),
    Case(
        "Resize",
        [X4, None, s32([1, 1, 1.5, 0.5])],
        {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
        opset=13,
        tag="pytorch-half-pixel",
    ),
    Case("Resize", [X4, None, None, i64(7, 9)], {"axes": [2, 3], "mode": "linear"}, opset=18, tag="axes"),
    Case("Resize", [X4, s32([1, 1, 2, 3])], opset=10, tag="v10"),
    Case("Resize", [X4, s32([1, 1, 0.5, 0.6])], opset=10, tag="v10-down"),
    Case("Resize", [X4, s32([1, 1, 1.5, 2])], {"mode": "linear"}, opset=10, tag="v10-linear"),
    Case("Resize", [X4, None, s32([1, 1, 2, 2])], {"mode": "cubic"}, opset=13, tag="cubic", opaque=True),
    Case("Upsample", [X4, s32([1, 1, 2, 1.5])], opset=9),
    Case("Upsample", [X4], {"scales": [1.0, 1.0, 2.0, 2.0], "mode": "linear"}, opset=7, tag="v7-linear"),
]


def draw(rng: np.random.Generator, spec: In) -> np.ndarray:
    shape = spec.shape
    if spec.kind == "bool":
        return rng.random(shape) < 0.5
    if spec.kind == "int":
        return rng.integers(-4, 5, shape).astype(spec.dtype)
    if spec.kind == "index":
        return rng.integers(-2, 2, shape).astype(spec.dtype)
    if spec.kind == "pos":
        return rng.uniform(0.5, 2.0, shape).astype(spec.dtype)
    if spec.kind == "wide":
        return (rng.standard_normal(shape) * 4).astype(spec.dtype)
    x = rng.standard_normal(shape).astype(spec.dtype)
    if spec.kind == "nan":
        x[rng.random(shape) < 0.3] = np.nan
    return x


def make_model(op: str, inputs, attrs: dict, opset: int, n_out: int, domain: str = "") -> tuple[onnx.ModelProto, dict]:
    """A one-node model; returns it with the random feeds for its runtime inputs."""
    names, graph_inputs, inits, specs = [], [], [], {}
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
        elif isinstance(x, In):
            name = f"x{i}"
            elem = helper.np_dtype_to_tensor_dtype(np.dtype(x.dtype))
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(x.shape)))
            names.append(name)
            specs[name] = x
        else:
            name = f"c{i}"
            inits.append(numpy_helper.from_array(np.asarray(x), name))
            names.append(name)
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"{op.lower()}0", domain=domain, **attrs)
    out_infos = [onnx.ValueInfoProto(name=o) for o in outs]
    graph = helper.make_graph([node], "case", graph_inputs, out_infos, inits)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    if any(not o.type.HasField("tensor_type") for o in model.graph.output):
        # no ONNX shape inference for this operator (GroupNormalization): ask onnxruntime
        feeds = {n: np.zeros(x.shape, x.dtype) for n, x in specs.items()}
        for o, v in zip(model.graph.output, run_ort(model, feeds).values()):
            o.CopyFrom(helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)))
    return model, specs


def run_ort(model: onnx.ModelProto, feeds: dict) -> dict:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(names, feeds)))


def assert_close(got: dict, want: dict, where: str) -> None:
    assert set(got) == set(want), where
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, f"{where} {name}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        if np.issubdtype(w.dtype, np.floating):
            tol = (1e-3, 1e-3) if w.dtype == np.float16 else (RTOL, ATOL)
            np.testing.assert_allclose(g, w, rtol=tol[0], atol=tol[1], equal_nan=True, err_msg=f"{where} {name}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{where} {name}")


def fresh_seed() -> int:
    return int(os.environ.get("KORCH_TEST_SEED") or secrets.randbits(32))


def check_against_ort(model: onnx.ModelProto, specs: dict, fold: bool = True):
    """Fission ``model`` and compare korch.ir.evaluate with onnxruntime; returns the graph."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    feeds = {name: draw(rng, spec) for name, spec in specs.items()}
    loaded = load_model(model) if fold else model
    graph = fission(loaded)
    verify(graph)
    # an OPAQUE primitive means what onnxruntime computes for its operator (onnx's
    # reference evaluator numbers MaxPool's indices differently)
    assert_close(evaluate(graph, feeds, opaque=run_opaque_ort), run_ort(model, feeds), f"seed={seed}")
    return graph


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule(case: Case):
    model, specs = make_model(case.op, case.inputs, case.attrs, case.opset, case.outputs)
    graph = check_against_ort(model, specs, case.fold)
    ops = {n.op for n in graph.nodes}
    assert (Op.OPAQUE in ops) == case.opaque, print_graph(graph)


def test_every_rule_has_a_case():
    covered = {c.op for c in CASES if not c.opaque}
    assert set(RULES) <= covered, sorted(set(RULES) - covered)


SOFTMAX = """
%0 = input() {'name': 'x0'} : float32[2, 3, 4]
%1 = reduce_max(%0) {'axes': (2,)} : float32[2, 3, 1]
%2 = broadcast(%1) {'shape': (2, 3, 4)} : float32[2, 3, 4]
%3 = sub(%0, %2) : float32[2, 3, 4]
%4 = exp(%3) : float32[2, 3, 4]
%5 = reduce_sum(%4) {'axes': (2,)} : float32[2, 3, 1]
%6 = broadcast(%5) {'shape': (2, 3, 4)} : float32[2, 3, 4]
%7 = div(%4, %6) : float32[2, 3, 4]
output 'y0' = %7
"""


def test_softmax_structure():
    model, _ = make_model("Softmax", [X3], {}, 13, 1)
    assert_structural_equal(fission(load_model(model)), parse_graph(SOFTMAX))


def test_layernorm_structure():
    model, _ = make_model("LayerNormalization", [X3, f32(4), f32(4, seed=1)], {}, 17, 1)
    counts = {}
    for n in fission(load_model(model)).nodes:
        counts[n.op.value] = counts.get(n.op.value, 0) + 1
    # mean, center, variance, rsqrt, scale, shift: two reductions and two divides by N;
    # constants: Scale, B, epsilon and N; Scale and B reshaped to rank 3 and broadcast
    assert counts == {
        "input": 1, "const": 4, "reduce_sum": 2, "div": 2, "broadcast": 4, "reshape": 2, "sub": 1,
        "mul": 3, "add": 2, "sqrt": 1, "reciprocal": 1,
    }, counts  # fmt: skip


@pytest.mark.parametrize(
    "op, inputs, attrs, n_out",
    [
        ("TopK", [In((3, 6)), i64(2)], {"axis": 1}, 2),
        ("Det", [In((2, 3, 3))], {}, 1),
        ("CumSum", [In((3, 5)), np.array(1, np.int64)], {"reverse": 1}, 1),
    ],
    ids=["TopK", "Det", "CumSum"],
)
def test_operator_without_rule_is_opaque(op, inputs, attrs, n_out):
    model, specs = make_model(op, inputs, attrs, 17, n_out)
    graph = check_against_ort(model, specs)
    opaque = [n for n in graph.nodes if n.op is Op.OPAQUE]
    assert len(opaque) == n_out
    assert sorted(n.attr("out_index") for n in opaque) == list(range(n_out))
    proto = onnx.NodeProto()
    proto.ParseFromString(opaque[0].attr("node"))
    assert proto.op_type == op and list(proto.input)[0] == "in0" and list(proto.output)[0] == "out0"
    assert opaque[0].attr("opset") == (("", 17),)


def test_rule_between_opaque_operators():
    """Primitives and opaque operators interleave; an unused opaque output is not built."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 6])
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
        helper.make_node("Softmax", ["v"], ["s"], axis=-1),
        helper.make_node("CumSum", ["s", "ax"], ["y"]),
    ]
    inits = [numpy_helper.from_array(i64(4), "k"), numpy_helper.from_array(np.array(1, np.int64), "ax")]
    graph = helper.make_graph(nodes, "g", [x], [onnx.ValueInfoProto(name="y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)
    g = check_against_ort(model, {"x": In((3, 6))})
    assert sum(n.op is Op.OPAQUE for n in g.nodes) == 2  # TopK values (indices unused) and CumSum
    assert sum(n.op is Op.EXP for n in g.nodes) == 1


@pytest.mark.parametrize(
    "op, inputs, attrs, fragment",
    [
        ("Resize", [In((1, 1, 3, 4)), None, s32([1, 1, 7 / 3, 1])], {}, "give sizes instead of scales"),
        ("MaxPool", [In((1, 1, 8))], {"kernel_shape": [1], "strides": [3], "ceil_mode": 1}, "ceil_mode output size"),
    ],
    ids=["Resize", "MaxPool"],
)
def test_onnx_and_onnxruntime_disagree(op, inputs, attrs, fragment):
    """Where ONNX shape inference and onnxruntime size an output differently, say so."""
    from korch.errors import ModelError

    model, _ = make_model(op, inputs, attrs, 19, 1)
    with pytest.raises(ModelError, match=fragment) as e:
        fission(load_model(model))
    assert f"{op.lower()}0" in str(e.value)
