"""Row islands (Note [Row islands]): a transformer's token-wise chain on 2-D tensors
computes the same numbers, and onnxruntime runs it with fewer Reshapes."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch.fission import fission
from korch.frontend import load_model
from korch.kernels.ort.export import to_onnx
from korch.kernels.ort.rows import flatten_rows

B, S, C, H = 2, 5, 8, 16


def _model(variant: str = "layer"):
    """x [B,S,C] -> fc1 + bias -> Gelu (erf form) -> fc2 + bias -> + x -> LayerNorm
    -> Transpose (a 3-D user, so the island's result leaves it) -> y."""
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [
        numpy_helper.from_array(f(C, H), "W1"),
        numpy_helper.from_array(f(H), "b1"),
        numpy_helper.from_array(f(H, C), "W2"),
        numpy_helper.from_array(f(1, 1, C) if variant == "bias3d" else f(C), "b2"),
        # (a LayerNorm over tokens and features has [S, C] parameters)
        numpy_helper.from_array(f(S, C) if variant == "ln_axis1" else f(C), "g"),
        numpy_helper.from_array(f(S, C) if variant == "ln_axis1" else f(C), "beta"),
        numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Div", ["h1", "sqrt2"], ["e0"]),
        helper.make_node("Erf", ["e0"], ["e1"]),
        helper.make_node("Add", ["e1", "one"], ["e2"]),
        helper.make_node("Mul", ["h1", "e2"], ["e3"]),
        helper.make_node("Mul", ["e3", "half"], ["g1"]),
        helper.make_node("MatMul", ["g1", "W2"], ["o0"]),
        helper.make_node("Add", ["o0", "b2"], ["o1"]),
        helper.make_node("Add", ["o1", "x"], ["r"]),
    ]
    ln_axis = 1 if variant == "ln_axis1" else -1
    nodes.append(helper.make_node("LayerNormalization", ["r", "g", "beta"], ["n"], axis=ln_axis))
    nodes.append(helper.make_node("Transpose", ["n"], ["y"], perm=[0, 2, 1]))
    if variant == "no_bias":  # no MatMul+Add pair for onnxruntime to fuse: nothing to save
        nodes = [n for n in nodes if n.output[0] not in ("h1", "o1")]
        for n in nodes:
            n.input[:] = [{"h1": "h0", "o1": "o0"}.get(i, i) for i in n.input]
    graph = helper.make_graph(
        nodes,
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, C])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, C, S])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _session(model: onnx.ModelProto, optimized: str | None = None):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if optimized:
        opts.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return _session(model).run(None, {"x": x})[0]


def _ort_ops(model: onnx.ModelProto, tmp_path) -> collections.Counter:
    """Operator counts of onnxruntime's optimized graph of ``model``."""
    path = str(tmp_path / "opt.onnx")
    _session(model, path)
    return collections.Counter(n.op_type for n in onnx.load(path).graph.node)


@pytest.mark.parametrize("variant", ["layer", "bias3d"])
def test_island_matches_and_saves_reshapes(variant, tmp_path):
    x = np.random.default_rng(1).standard_normal((B, S, C)).astype(np.float32)
    want = _run(_model(variant), x)
    rewritten = flatten_rows(_model(variant))
    onnx.checker.check_model(rewritten, full_check=True)
    ops = [n.op_type for n in rewritten.graph.node]
    # one Reshape in (x), one out (the LayerNorm's result, read by the Transpose)
    assert ops.count("Reshape") == 2 and ops[0] == "Reshape" and ops[-1] == "Transpose"
    np.testing.assert_allclose(_run(rewritten, x), want, rtol=1e-5, atol=1e-5)
    before, after = _ort_ops(_model(variant), tmp_path), _ort_ops(rewritten, tmp_path)
    assert after["Gemm"] == 2 and after["Reshape"] == 2
    if variant == "layer":  # onnxruntime wraps each Gemm of a 3-D input in two Reshapes
        assert before["Gemm"] == 2 and before["Reshape"] == 4
    else:  # nor does it fuse a [1,1,C] bias, which the island makes [C]
        assert before["Gemm"] == 1 and before["Reshape"] == 2


@pytest.mark.parametrize("variant", ["no_bias", "ln_axis1"])
def test_islands_that_save_nothing_stay(variant):
    """Without MatMul+bias pairs the island would only add Reshapes; a LayerNorm over
    tokens and features is not row-wise: it keeps reading the 3-D tensor."""
    before = _model(variant)
    after = flatten_rows(_model(variant))
    if variant == "no_bias":
        assert [n.op_type for n in after.graph.node] == [n.op_type for n in before.graph.node]
    else:
        x = np.random.default_rng(1).standard_normal((B, S, C)).astype(np.float32)
        (ln,) = [n for n in after.graph.node if n.op_type == "LayerNormalization"]
        assert ln.input[0] == "r"  # the LayerNorm still reads the 3-D tensor
        np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_broadcast_tensor_operand_is_not_row_wise():
    """An Add of a [B,S,1] tensor (not a constant) breaks the row-wise chain there."""
    m = _model()
    g = m.graph
    g.input.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [B, S, 1]))
    (add,) = [n for n in g.node if n.output[0] == "r"]
    add.input[1] = "m"
    after = flatten_rows(m)
    (add,) = [n for n in after.graph.node if "m" in n.input]
    assert add.op_type == "Add" and add.output[0] == "r"  # untouched, on 3-D tensors
    x = np.random.default_rng(1).standard_normal((B, S, C)).astype(np.float32)
    mm = np.random.default_rng(2).standard_normal((B, S, 1)).astype(np.float32)
    sess = _session(after)
    ref = _session(_model_with_mask())
    np.testing.assert_allclose(sess.run(None, {"x": x, "m": mm})[0], ref.run(None, {"x": x, "m": mm})[0], rtol=1e-5)


def _model_with_mask():
    m = _model()
    m.graph.input.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [B, S, 1]))
    (add,) = [n for n in m.graph.node if n.output[0] == "r"]
    add.input[1] = "m"
    return m


def test_to_onnx_flattens_what_it_exports(tmp_path):
    """Through fission (MatMul, Gelu and LayerNorm split into primitives, raised back)
    and the export: the same numbers, and onnxruntime's graph has fewer Reshapes than
    for the model as it was."""
    exported = to_onnx(fission(load_model(_model())))
    x = np.random.default_rng(3).standard_normal((B, S, C)).astype(np.float32)
    np.testing.assert_allclose(_run(exported, x), _run(_model(), x), rtol=1e-4, atol=1e-4)
    assert _ort_ops(exported, tmp_path)["Reshape"] < _ort_ops(_model(), tmp_path)["Reshape"]


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_over_features_is_row_wise(axis):
    """A Softmax over the last axis joins the island; one over tokens does not."""
    m = _model()
    (gelu_out,) = [n for n in m.graph.node if n.output[0] == "g1"]
    gelu_out.output[0] = "g0"
    m.graph.node.insert(list(m.graph.node).index(gelu_out) + 1, helper.make_node("Softmax", ["g0"], ["g1"], axis=axis))
    x = np.random.default_rng(4).standard_normal((B, S, C)).astype(np.float32)
    want = _run(m, x)
    after = flatten_rows(m)
    (sm,) = [n for n in after.graph.node if n.op_type == "Softmax"]
    reshapes = [n for n in after.graph.node if n.op_type == "Reshape"]
    if axis == -1:  # inside the island: x in, the LayerNorm's result out
        assert sm.input[0] == "g0" and len(reshapes) == 2
    else:  # it splits the chain in two islands of one Gemm each, too small to pay
        assert sm.input[0] == "g0" and not reshapes
    np.testing.assert_allclose(_run(after, x), want, rtol=1e-5, atol=1e-5)


def test_softmax_default_axis_before_opset_13():
    """Before opset 13 a Softmax without an axis normalizes from axis 1 on."""
    from korch.kernels.ort.rows import _member

    sm = helper.make_node("Softmax", ["a"], ["b"])
    shapes = {"a": (B, S, C), "b": (B, S, C)}
    assert _member(sm, shapes, {}, (B, S), opset=13)
    assert not _member(sm, shapes, {}, (B, S), opset=12)
