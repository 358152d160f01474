"""Simplifications: layout chains cancelled or merged, constant subexpressions folded.

These never make a graph worse under any sensible cost, so the driver applies them
greedily, bottom-up, to every node it emits (the SIMPLIFY table) instead of letting
the search spend steps on them.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, GraphBuilder, strip_ones
from korch.ir.interp import eval_node
from korch.ir.ops import GroupOp, Op
from korch.rewrite.pattern import A, Lookup, Match, P, Rule, X

# A folded constant may be no larger than its inputs together (or this many elements):
# a BROADCAST, PAD or WINDOW of a small constant is cheaper to compute in the kernel that
# reads it than to load. BROADCAST of a constant is never folded; kernels inline it.
CONST_FOLD_SMALL = 64


def _prepends_ones(g: Graph, node) -> bool:
    """A RESHAPE that only puts leading ones before its input's shape (a bias [N] as
    [1, 1, N]). Folding it gains nothing (a reshape of a constant is a view) and loses
    what the ONNX export needs: it passes the [N] constant to the elementwise op and lets
    ONNX broadcasting do the rest, which is the form onnxruntime fuses into Gemm and
    LayerNormalization (segformer_b1: the fold left 0 of 26 LayerNormalizations and 0
    of 52 Gemms in the export of its rewritten graph)."""
    return node.op is Op.RESHAPE and strip_ones(node.shape) == tuple(g.nodes[node.inputs[0]].shape)


def _identity(b: GraphBuilder, m: Match, v: Lookup) -> int:
    return v("x")


def _same_shape(g: Graph, m: Match) -> bool:
    return m.graph.nodes[m.roots[0]].shape == m.shape("x")


def _is_identity_perm(g: Graph, m: Match) -> bool:
    perm = m.graph.nodes[m.roots[0]].attr("perm")
    return tuple(perm) == tuple(range(len(perm)))


def _transposes(b: GraphBuilder, m: Match, v: Lookup) -> int:
    p1 = m.node("t1").attr("perm")
    p2 = m.graph.nodes[m.roots[0]].attr("perm")
    return b.transpose(v("x"), [p1[i] for i in p2])


def _reshapes(b: GraphBuilder, m: Match, v: Lookup) -> int:
    return b.reshape(v("x"), m.graph.nodes[m.roots[0]].shape)


def _full_slice(g: Graph, m: Match) -> bool:
    node = m.graph.nodes[m.roots[0]]
    return (
        node.shape == m.shape("x")
        and all(s == 0 for s in node.attr("starts"))
        and all(st == 1 or d == 1 for st, d in zip(node.attr("steps"), node.shape))
    )


def _slices(b: GraphBuilder, m: Match, v: Lookup) -> int:
    inner, outer = m.node("s1"), m.graph.nodes[m.roots[0]]
    starts = [a + sa * b_ for a, sa, b_ in zip(inner.attr("starts"), inner.attr("steps"), outer.attr("starts"))]
    steps = [sa * sb for sa, sb in zip(inner.attr("steps"), outer.attr("steps"))]
    return b.add(Op.SLICE, [v("x")], starts=starts, steps=steps, lengths=outer.attr("lengths"))


def _swaps_last_two(g: Graph, m: Match) -> bool:
    perm = tuple(m.node("t").attr("perm"))
    r = len(perm)
    return r >= 2 and perm == tuple(range(r - 2)) + (r - 1, r - 2)


def _transpose_weight(b: GraphBuilder, m: Match, v: Lookup) -> int:
    w = np.swapaxes(m.value("w"), -1, -2)
    return b.add(Op.MATMUL, [v("x"), b.const(w)])


def _const_fold_pattern(ctx, nid: int):
    g = ctx.graph
    node = g.nodes[nid]
    if node.op in GroupOp.SOURCE or node.op in (Op.OPAQUE, Op.BROADCAST) or not node.inputs:
        return
    if any(g.nodes[i].op is not Op.CONST for i in node.inputs) or _prepends_ones(g, node):
        return
    if node.size > max(sum(g.nodes[i].size for i in node.inputs), CONST_FOLD_SMALL):
        return
    yield Match(g, (nid,), {}, ())


def _const_fold(b: GraphBuilder, m: Match, v: Lookup) -> int:
    g = m.graph
    nid = m.roots[0]
    args = [g.const_value(i) for i in g.nodes[nid].inputs]
    return b.const(eval_node(g, nid, args))


LAYOUT_RULES = (
    Rule(
        "transpose_identity",
        P(Op.TRANSPOSE, X("x")),
        _identity,
        _is_identity_perm,
        "transpose(x, (0, 1, ..)) = x",
    ),
    Rule(
        "transpose_transpose",
        P(Op.TRANSPOSE, P(Op.TRANSPOSE, X("x"), name="t1")),
        _transposes,
        equation="transpose(transpose(x, p1), p2) = transpose(x, p1[p2])  (none if identity)",
    ),
    Rule("reshape_identity", P(Op.RESHAPE, X("x")), _identity, _same_shape, "reshape(x, shape(x)) = x"),
    Rule(
        "reshape_reshape",
        P(Op.RESHAPE, P(Op.RESHAPE, X("x"))),
        _reshapes,
        equation="reshape(reshape(x, s1), s2) = reshape(x, s2)",
    ),
    Rule("broadcast_identity", P(Op.BROADCAST, X("x")), _identity, _same_shape, "broadcast(x, shape(x)) = x"),
    Rule("slice_identity", P(Op.SLICE, X("x")), _identity, _full_slice, "slice(x, 0, 1, shape(x)) = x"),
    Rule(
        "slice_slice",
        P(Op.SLICE, P(Op.SLICE, X("x"), name="s1")),
        _slices,
        equation="slice(slice(x, a, s, _), b, t, n) = slice(x, a + s*b, s*t, n)",
    ),
    Rule(
        "transpose_weight_into_matmul",
        P(Op.MATMUL, X("x"), P(Op.TRANSPOSE, X("w", Op.CONST), name="t")),
        _transpose_weight,
        _swaps_last_two,
        "matmul(x, transpose(W, swap last two)) = matmul(x, W^T)  (W constant: folded into it)",
    ),
)

# Note [One-element constants are scalars]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A rank-0 constant is inlined by every kernel that reads it (Note [Kernel boundary]);
# a one-element array ([1, 1, 1, 1], which const_fold makes of timm's attention scale)
# was broadcast to the full shape, and that tensor, shared by every layer, was made at
# run time by one kernel and read as an input by twelve others (deit_tiny: q's and
# k's scale, 151 KB each). As the operand of an elementwise op whose other operand has
# the op's shape it is the scalar, and GraphBuilder.broadcast_to makes it one.
_SCALAR_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN})
_ONE = P(Op.BROADCAST, X("c", Op.CONST), name="bc")


def _one_element_operand(g: Graph, m: Match) -> bool:
    root = m.graph.nodes[m.roots[0]]
    return m.node("c").size == 1 and m.shape("a") == root.shape and root.dtype == m.node("c").dtype


def _scalar_operand(b: GraphBuilder, m: Match, v: Lookup) -> int:
    root = m.graph.nodes[m.roots[0]]
    c = b.const(m.value("c").reshape(()))
    first = root.inputs[0] == m.nodes["bc"]
    return b.add(root.op, [c, v("a")] if first else [v("a"), c])


CONST_FOLD_RULES = (
    Rule(
        "const_fold",
        _const_fold_pattern,
        _const_fold,
        equation="f(c1, .., cn) = eval(f, c1, .., cn)  (every input constant)",
    ),
    Rule(
        "one_element_scalar",
        A(P(_SCALAR_OPS, X("a"), _ONE), P(_SCALAR_OPS, _ONE, X("a"))),
        _scalar_operand,
        _one_element_operand,
        "f(a, broadcast(c)) = f(a, c)  (c one element: a scalar; Note [One-element constants are scalars])",
    ),
)
