"""The attention block: softmax(Q K^T / sqrt(d)) V has its row sum ride inside the MatMul.

Structure is asserted before and after (the rule alone, and the search); numbers are
checked against onnxruntime running the operator-level model (Softmax + MatMul) and the
exported rewritten primitive graph.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from korch.ir import Op, assert_structural_equal, evaluate, parse_graph, print_graph, verify
from korch.kernels.ort.export import to_onnx
from korch.rewrite import RULES_BY_NAME, apply_rule, optimize_graph

B, S, D = 2, 16, 8

ATTENTION = f"""
%0 = input() {{'name': 'q'}} : float32[{B}, {S}, {D}]
%1 = input() {{'name': 'k'}} : float32[{B}, {S}, {D}]
%2 = input() {{'name': 'v'}} : float32[{B}, {S}, {D}]
%3 = transpose(%1) {{'perm': (0, 2, 1)}} : float32[{B}, {D}, {S}]
%4 = matmul(%0, %3) : float32[{B}, {S}, {S}]
%5 = const() {{'value': {float(np.float32(np.sqrt(D)))!r}}} : float32[]
%6 = div(%4, %5) : float32[{B}, {S}, {S}]
%7 = reduce_max(%6) {{'axes': (2,)}} : float32[{B}, {S}, 1]
%8 = broadcast(%7) {{'shape': ({B}, {S}, {S})}} : float32[{B}, {S}, {S}]
%9 = sub(%6, %8) : float32[{B}, {S}, {S}]
%10 = exp(%9) : float32[{B}, {S}, {S}]
%11 = reduce_sum(%10) {{'axes': (2,)}} : float32[{B}, {S}, 1]
%12 = broadcast(%11) {{'shape': ({B}, {S}, {S})}} : float32[{B}, {S}, {S}]
%13 = div(%10, %12) : float32[{B}, {S}, {S}]
%14 = matmul(%13, %2) : float32[{B}, {S}, {D}]
output 'y' = %14
"""

# softmax . V with the row sum inside the MatMul: e . [V | 1], split, divide
AFTER_RULE = f"""
%0 = input() {{'name': 'q'}} : float32[{B}, {S}, {D}]
%1 = input() {{'name': 'k'}} : float32[{B}, {S}, {D}]
%2 = input() {{'name': 'v'}} : float32[{B}, {S}, {D}]
%3 = transpose(%1) {{'perm': (0, 2, 1)}} : float32[{B}, {D}, {S}]
%4 = matmul(%0, %3) : float32[{B}, {S}, {S}]
%5 = const() {{'value': {float(np.float32(np.sqrt(D)))!r}}} : float32[]
%6 = div(%4, %5) : float32[{B}, {S}, {S}]
%7 = reduce_max(%6) {{'axes': (2,)}} : float32[{B}, {S}, 1]
%8 = broadcast(%7) {{'shape': ({B}, {S}, {S})}} : float32[{B}, {S}, {S}]
%9 = sub(%6, %8) : float32[{B}, {S}, {S}]
%10 = exp(%9) : float32[{B}, {S}, {S}]
%11 = const() {{'name': 'c0'}} : float32[{B}, {S}, 1]
%12 = concat(%2, %11) {{'axis': 2}} : float32[{B}, {S}, {D + 1}]
%13 = matmul(%10, %12) : float32[{B}, {S}, {D + 1}]
%14 = slice(%13) {{'lengths': ({B}, {S}, {D}), 'starts': (0, 0, 0), 'steps': (1, 1, 1)}} : float32[{B}, {S}, {D}]
%15 = slice(%13) {{'lengths': ({B}, {S}, 1), 'starts': (0, 0, {D}), 'steps': (1, 1, 1)}} : float32[{B}, {S}, 1]
%16 = broadcast(%15) {{'shape': ({B}, {S}, {D})}} : float32[{B}, {S}, {D}]
%17 = div(%14, %16) : float32[{B}, {S}, {D}]
output 'y' = %17
"""


def _reference_model():
    """The operator-level block as an exporter writes it: MatMul, Div, Softmax, MatMul."""
    f32 = TensorProto.FLOAT
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Div", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    scale = helper.make_tensor("scale", f32, [], [float(np.sqrt(D))])
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info(n, f32, [B, S, D]) for n in "qkv"],
        [helper.make_tensor_value_info("y", f32, [B, S, D])],
        [scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _ort(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)[0]


@pytest.fixture(scope="module")
def feed():
    rng = np.random.default_rng(0)
    # wide logits so the max-subtraction and the division both matter
    return {n: (3 * rng.standard_normal((B, S, D))).astype(np.float32) for n in "qkv"}


def _check_rowsum_in_matmul(g):
    """The MatMul reads [V | 1]; its two SLICEs feed one DIV; no REDUCE_SUM is left."""
    ops = [n.op for n in g.nodes]
    assert Op.REDUCE_SUM not in ops
    (mm,) = [i for i, n in enumerate(g.nodes) if n.op is Op.MATMUL and n.shape == (B, S, D + 1)]
    cat = g.nodes[g.nodes[mm].inputs[1]]
    assert cat.op is Op.CONCAT and cat.shape == (B, S, D + 1)
    assert g.nodes[cat.inputs[0]].attr("name") == "v"
    ones = cat.inputs[1]
    assert g.nodes[ones].op is Op.CONST and np.all(g.const_value(ones) == 1)
    slices = [i for i in g.users()[mm] if g.nodes[i].op is Op.SLICE]
    assert sorted(g.nodes[i].shape for i in slices) == [(B, S, 1), (B, S, D)]
    out = g.nodes[g.outputs["y"]]
    assert out.op is Op.DIV
    num, den = out.inputs
    assert num in slices and g.nodes[den].op is Op.BROADCAST and g.nodes[den].inputs[0] in slices


def test_softmax_matmul_rule_structure(feed):
    g = parse_graph(ATTENTION)
    verify(g)
    assert [n.op for n in g.nodes].count(Op.REDUCE_SUM) == 1
    g2 = apply_rule(g, RULES_BY_NAME["softmax_matmul_rowsum"])
    verify(g2)
    assert_structural_equal(g2, parse_graph(AFTER_RULE))
    _check_rowsum_in_matmul(g2)
    want = _ort(_reference_model(), feed)
    np.testing.assert_allclose(evaluate(g2, feed)["y"], want, rtol=1e-4, atol=1e-5)


def test_search_rewrites_attention(feed):
    g = parse_graph(ATTENTION)
    g2, stats = optimize_graph(g, budget=50, time_limit_s=30)
    verify(g2)
    print(print_graph(g2))
    assert stats.applied.get("softmax_matmul_rowsum") == 1
    assert stats.cost_after < stats.cost_before and stats.failed == 0
    _check_rowsum_in_matmul(g2)
    want = _ort(_reference_model(), feed)
    np.testing.assert_allclose(evaluate(g2, feed)["y"], want, rtol=1e-4, atol=1e-5)
    # the rewritten primitive graph exported to ONNX runs in onnxruntime with the same numbers
    np.testing.assert_allclose(_ort(to_onnx(g2), feed), want, rtol=1e-4, atol=1e-5)
