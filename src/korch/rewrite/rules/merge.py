"""Two linear primitives reading the same input become one (TASO's merge rules)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from korch.ir.graph import GraphBuilder
from korch.ir.ops import Op
from korch.rewrite.pattern import Ctx, Lookup, Match, Rule, is_float
from korch.rewrite.rules.common import slice_axis


def _shared_input_pairs(ctx: Ctx, nid: int, op: Op, wkey) -> Iterator[Match]:
    """``op(x, w1)`` at ``nid`` with a later ``op(x, w2)``: constant weights, ``wkey`` equal."""
    g = ctx.graph
    node = g.nodes[nid]
    if node.op is not op or not is_float(node):
        return
    x, w1 = node.inputs
    if g.nodes[w1].op is not Op.CONST or wkey(node, g.nodes[w1]) is None:
        return
    for other in ctx.users[x]:
        if other <= nid:
            continue
        o = g.nodes[other]
        if o.op is not op or o.inputs[0] != x or o.dtype != node.dtype:
            continue
        w2 = o.inputs[1]
        if g.nodes[w2].op is not Op.CONST or wkey(node, g.nodes[w1]) != wkey(o, g.nodes[w2]):
            continue
        yield Match(g, (nid, other), {"x": x, "w1": w1, "w2": w2}, ("x", "w1", "w2"))


def _matmul_pairs(ctx: Ctx, nid: int) -> Iterator[Match]:
    return _shared_input_pairs(ctx, nid, Op.MATMUL, lambda n, w: w.shape[:-1])


def _conv_pairs(ctx: Ctx, nid: int) -> Iterator[Match]:
    return _shared_input_pairs(ctx, nid, Op.CONV, lambda n, w: (w.shape[1:], n.attrs) if n.attr("group") == 1 else None)


def _merge(b: GraphBuilder, m: Match, v: Lookup, op: Op, waxis: int, oaxis: int) -> dict[int, int]:
    n1 = m.shape("w1")[waxis]
    n2 = m.shape("w2")[waxis]
    w = b.const(np.concatenate([m.value("w1"), m.value("w2")], axis=waxis))
    first = m.graph.nodes[m.roots[0]]
    attrs = dict(first.attrs)
    out = b.add(op, [v("x"), w], **attrs)
    return {m.roots[0]: slice_axis(b, out, oaxis, 0, n1), m.roots[1]: slice_axis(b, out, oaxis, n1, n2)}


MERGE_RULES = (
    Rule(
        "merge_matmul_shared_lhs",
        _matmul_pairs,
        lambda b, m, v: _merge(b, m, v, Op.MATMUL, -1, -1),
        equation="matmul(x, W1), matmul(x, W2) = split(matmul(x, concat(W1, W2, axis=-1)), axis=-1)",
    ),
    Rule(
        "merge_conv_shared_input",
        _conv_pairs,
        lambda b, m, v: _merge(b, m, v, Op.CONV, 0, 1),
        equation="conv(x, W1), conv(x, W2) = split(conv(x, concat(W1, W2, axis=0)), axis=1)  (same attrs, group 1)",
    ),
)
