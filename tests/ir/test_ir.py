"""The primitive IR: text form round-trips, the verifier rejects bad graphs, the interpreter is right."""

import math

import numpy as np
import pytest

from korch.ir import GraphBuilder, Op, VerifyError, assert_structural_equal, evaluate, parse_graph, print_graph, verify
from korch.ir.graph import Node
from korch.ir.subgraph import canonical_hash, extract, kernel_class, make_kernel

SOFTMAX = """
%0 = input() {'name': 'x'} : float32[2, 8]
%1 = reduce_max(%0) {'axes': (1,)} : float32[2, 1]
%2 = broadcast(%1) {'shape': (2, 8)} : float32[2, 8]
%3 = sub(%0, %2) : float32[2, 8]
%4 = exp(%3) : float32[2, 8]
%5 = reduce_sum(%4) {'axes': (1,)} : float32[2, 1]
%6 = broadcast(%5) {'shape': (2, 8)} : float32[2, 8]
%7 = div(%4, %6) : float32[2, 8]
output 'y' = %7
"""


def test_text_roundtrip_and_numbers():
    g = parse_graph(SOFTMAX)
    verify(g)
    assert print_graph(g).strip() == SOFTMAX.strip()
    assert_structural_equal(parse_graph(print_graph(g)), g)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(evaluate(g, {"x": x})["y"], want, rtol=1e-6)


def test_text_roundtrip_keeps_non_finite_attributes():
    # a max-pool's pad writes -inf; the results database stores kernels as this text
    b = GraphBuilder()
    x = b.input("x", (1, 2, 4, 4), "float32")
    p = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), (1, 1), (1, 1)), mode="constant", value=-math.inf)
    b.output("y", p)
    g = parse_graph(print_graph(b.graph))
    assert_structural_equal(g, b.graph)
    assert g.nodes[1].attr("value") == -math.inf


def test_parse_rejects_wrong_declared_shape():
    with pytest.raises(ValueError, match="declared"):
        parse_graph("%0 = input() {'name': 'x'} : float32[2, 8]\n%1 = exp(%0) : float32[2, 9]")


def test_verifier_catches_implicit_broadcast_and_cycles():
    b = GraphBuilder()
    x = b.input("x", (2, 8), "float32")
    y = b.input("y", (1, 8), "float32")
    g = b.graph
    g.nodes.append(Node(Op.ADD, (x, y), (), (2, 8), "float32"))
    with pytest.raises(VerifyError, match="shapes differ|explicit broadcast"):
        verify(g)
    g.nodes[-1] = Node(Op.EXP, (3,), (), (2, 8), "float32")
    with pytest.raises(VerifyError, match="earlier node"):
        verify(g)


def test_builder_hash_conses_and_broadcasts():
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    bias = b.const(np.arange(4, dtype=np.float32))
    a1 = b.binary(Op.ADD, x, bias)
    a2 = b.binary(Op.ADD, x, bias)
    assert a1 == a2  # common subexpressions are one node
    ops = [n.op for n in b.graph.nodes]
    assert ops.count(Op.BROADCAST) == 1 and ops.count(Op.RESHAPE) == 1


def test_layout_primitives_numbers():
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    x = b.input("x", (1, 2, 5, 5), "float32")
    s = b.add(Op.SLICE, [x], starts=(0, 1, 4, 0), steps=(1, 1, -2, 2), lengths=(1, 1, 3, 3))
    p = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), (1, 2), (2, 1)), mode="reflect")
    w = b.add(Op.WINDOW, [x], kernel=(3, 3), strides=(2, 2), dilations=(1, 1))
    gth = b.add(Op.GATHER, [x], axis=3, indices=(4, 0, 0), indices_shape=(3,))
    b.output("s", s)
    b.output("p", p)
    b.output("w", w)
    b.output("g", gth)
    xv = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    out = evaluate(b.graph, {"x": xv})
    np.testing.assert_array_equal(out["s"], xv[:, 1:2, 4::-2, ::2])
    np.testing.assert_array_equal(out["p"], np.pad(xv, ((0, 0), (0, 0), (1, 2), (2, 1)), mode="reflect"))
    assert out["w"].shape == (1, 2, 2, 2, 3, 3)
    np.testing.assert_array_equal(out["w"][0, 1, 1, 0], xv[0, 1, 2:5, 0:3])
    np.testing.assert_array_equal(out["g"], xv[..., [4, 0, 0]])


def test_conv_reference_matches_direct_loop():
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6), "float32")
    w = b.const(rng.standard_normal((6, 2, 3, 3)).astype(np.float32))
    y = b.add(Op.CONV, [x, w], strides=(2, 1), dilations=(1, 2), pads=(1, 0, 1, 2), group=2)
    b.output("y", y)
    xv = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    got = evaluate(b.graph, {"x": xv})["y"]
    wv = b.graph.const_value(w)
    xp = np.pad(xv, ((0, 0), (0, 0), (1, 1), (0, 2)))
    want = np.zeros(got.shape)
    for o in range(6):
        g = o // 3
        for i in range(got.shape[2]):
            for j in range(got.shape[3]):
                patch = xp[0, 2 * g : 2 * g + 2, 2 * i : 2 * i + 3, j : j + 5 : 2]
                want[0, o, i, j] = (patch * wv[o]).sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_kernel_boundary_and_canonical_hash():
    g = parse_graph(SOFTMAX)
    users = g.users()
    whole = make_kernel(g, users, g.compute_ids())
    assert whole.inputs == (0,) and whole.outputs == (7,)
    part = make_kernel(g, users, [1, 2, 3, 4])
    assert part.outputs == (4,)  # %4 is read by %5 and %7 outside the kernel
    assert kernel_class(g, part) == "memory"
    kg = extract(g, part)
    assert list(kg.inputs) == ["in0"] and list(kg.outputs) == ["out0"]
    # two structurally equal kernels in different places hash the same
    g2 = parse_graph(SOFTMAX.replace("'x'", "'other'"))
    assert canonical_hash(g, part) == canonical_hash(g2, make_kernel(g2, g2.users(), [1, 2, 3, 4]))
    assert canonical_hash(g, part) != canonical_hash(g, whole)
