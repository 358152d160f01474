"""Rules between reductions, elementwise scaling and MatMul (seed §3, Fig. 2 and 9)."""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import Op
from korch.rewrite.pattern import A, Lookup, Match, P, Rule, X, is_float, is_last_axis_reduce, scalar_value
from korch.rewrite.rules.common import scalar, slice_axis

SCALE = frozenset({Op.MUL, Op.DIV})

# --- sum-reduction <-> MatMul with a ones vector ----------------------------------------


def _reduce_is_matmul(g: Graph, m: Match) -> bool:
    x = m.node("x")
    return is_float(x) and len(x.shape) >= 2 and is_last_axis_reduce(m.node("r"))


def _reduce_to_matmul(b: GraphBuilder, m: Match, v: Lookup) -> int:
    x = m.node("x")
    ones = b.const(np.ones((x.shape[-1], 1), dtype=x.dtype))
    return b.add(Op.MATMUL, [v("x"), ones])


def _is_ones_column(g: Graph, nid: int) -> bool:
    node = g.nodes[nid]
    return node.op is Op.CONST and len(node.shape) == 2 and node.shape[1] == 1 and bool(np.all(g.const_value(nid) == 1))


def _matmul_is_reduce(g: Graph, m: Match) -> bool:
    return _is_ones_column(g, m.nodes["ones"])


def _matmul_to_reduce(b: GraphBuilder, m: Match, v: Lookup) -> int:
    return b.reduce(Op.REDUCE_SUM, v("x"), [len(m.shape("x")) - 1])


# --- softmax(x) . V = (e . [V | 1])[..., :N] / (e . [V | 1])[..., N] -------------------

_ROWSUM = A(
    P(Op.REDUCE_SUM, X("e"), name="rowsum"),
    P(Op.MATMUL, X("e"), X("ones", Op.CONST), name="rowsum"),
)
_NORMALISED = A(
    P(Op.DIV, X("e"), P(Op.BROADCAST, _ROWSUM)),
    P(Op.MUL, X("e"), P(Op.BROADCAST, P(Op.RECIPROCAL, _ROWSUM))),
)


def _softmax_ok(g: Graph, m: Match) -> bool:
    e = m.node("e")
    if not is_float(e) or len(e.shape) < 2:
        return False
    rs = m.node("rowsum")
    if rs.op is Op.REDUCE_SUM:
        return is_last_axis_reduce(rs)
    return _is_ones_column(g, m.nodes["ones"])


def _softmax_matmul(b: GraphBuilder, m: Match, v: Lookup) -> int:
    vshape = m.shape("v")
    n = vshape[-1]
    ones = b.const(np.ones(vshape[:-1] + (1,), dtype=m.node("v").dtype))
    v1 = b.add(Op.CONCAT, [v("v"), ones], axis=len(vshape) - 1)
    prod = b.add(Op.MATMUL, [v("e"), v1])
    num = slice_axis(b, prod, -1, 0, n)
    den = slice_axis(b, prod, -1, n, 1)
    return b.add(Op.DIV, [num, b.broadcast_to(den, b.shape(num))])


# --- scaling by a scalar commutes with MatMul -----------------------------------------


def _scalar_ok(g: Graph, m: Match) -> bool:
    return is_float(m.node("sc")) and scalar_value(g, m.nodes["s"]) is not None and len(m.shape("sc")) >= 2


def _scale(b: GraphBuilder, m: Match, x: int) -> int:
    sc = m.node("sc")
    return b.add(sc.op, [x, scalar(b, scalar_value(m.graph, m.nodes["s"]), sc.dtype)])


def _lhs_out(b: GraphBuilder, m: Match, v: Lookup) -> int:
    return _scale(b, m, b.add(Op.MATMUL, [v("x"), v("w")]))


def _into_lhs(b: GraphBuilder, m: Match, v: Lookup) -> int:
    return b.add(Op.MATMUL, [_scale(b, m, v("x")), v("w")])


def _into_rhs(b: GraphBuilder, m: Match, v: Lookup) -> int:
    return b.add(Op.MATMUL, [v("x"), _scale(b, m, v("w"))])


def _into_ok(g: Graph, m: Match) -> bool:
    return _scalar_ok(g, m) and len(m.shape("x")) >= 2 and len(m.shape("w")) >= 2


LINEAR_RULES = (
    Rule(
        "reduce_sum_to_matmul",
        P(Op.REDUCE_SUM, X("x"), name="r"),
        _reduce_to_matmul,
        _reduce_is_matmul,
        "reduce_sum(x[..., K], axes=-1) = matmul(x, ones[K, 1])",
    ),
    Rule(
        "matmul_ones_to_reduce_sum",
        P(Op.MATMUL, X("x"), X("ones", Op.CONST)),
        _matmul_to_reduce,
        _matmul_is_reduce,
        "matmul(x, ones[K, 1]) = reduce_sum(x, axes=-1)",
    ),
    Rule(
        "softmax_matmul_rowsum",
        P(Op.MATMUL, _NORMALISED, X("v")),
        _softmax_matmul,
        _softmax_ok,
        "matmul(e / bcast(rowsum(e)), V) = P[..., :N] / bcast(P[..., N:]) where P = matmul(e, concat(V, 1))",
    ),
    Rule(
        "matmul_scaled_lhs_out",
        P(Op.MATMUL, P(SCALE, X("x"), X("s"), name="sc"), X("w")),
        _lhs_out,
        _scalar_ok,
        "matmul(x * s, W) = matmul(x, W) * s  (s a scalar; also /)",
    ),
    Rule(
        "matmul_scaled_rhs_out",
        P(Op.MATMUL, X("x"), P(SCALE, X("w"), X("s"), name="sc")),
        _lhs_out,
        _scalar_ok,
        "matmul(x, W * s) = matmul(x, W) * s  (s a scalar; also /)",
    ),
    Rule(
        "matmul_scale_into_lhs",
        P(SCALE, P(Op.MATMUL, X("x"), X("w")), X("s"), name="sc"),
        _into_lhs,
        _into_ok,
        "matmul(x, W) * s = matmul(x * s, W)  (s a scalar; also /)",
    ),
    Rule(
        "matmul_scale_into_rhs",
        P(SCALE, P(Op.MATMUL, X("x"), X("w")), X("s"), name="sc"),
        _into_rhs,
        _into_ok,
        "matmul(x, W) * s = matmul(x, W * s)  (s a scalar; also /)",
    ),
)
