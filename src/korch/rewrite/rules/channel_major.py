"""ReLU linear attention computed in the layout its input already has.

Note [Channel-major linear attention]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
EfficientViT's LiteMLA (timm ``efficientvit_b0``) keeps q, k and v channel-major,
``x[..., 3d, HW]``, and transposes them to token-major for its attention:

    t = transpose(x);  q = relu(t[.., 0:d]);  k = relu(t[.., d:2d])
    v = pad(t[.., 2d:3d], one column of ones)
    o = q @ (transpose(k) @ v);  y = transpose(o[.., :d] / (o[.., d:] + eps))

and back to channel-major for its projection. Since transpose(A @ B) = transpose(B) @
transpose(A), the same values come from the channel-major slices, with the transposes
left on the two small operands (``v``, d+1 x HW, and ``k^T v``, d x d+1), where
onnxruntime folds them into its FusedMatMul:

    xq = relu(x[.., 0:d, :]);  xk = relu(x[.., d:2d, :]);  xv = pad_rows(x[.., 2d:3d, :], ones)
    o' = transpose(xk @ transpose(xv)) @ xq;  y = o'[.., :d, :] / (o'[.., d:, :] + eps)

The [HW, 3d] and [d, HW] transposes were 4.3 of onnxruntime's 39 ms on
efficientvit_b16 (its profiler; four LiteMLA blocks). The byte/flop cost sees
transposes fused for free, so this is a LIBRARY_LAYOUT rule (applied after the search,
``korch.rewrite.for_library``). Any scalar elementwise op may stand for ReLU.
"""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import GroupOp, Op
from korch.rewrite.pattern import Lookup, Match, P, Rule, X, is_float, scalar_value
from korch.rewrite.rules.common import slice_axis

_SCALAR_EW = GroupOp.BINARY

_TIN = P(Op.TRANSPOSE, X("x"), name="tin")
_O = P(
    Op.MATMUL,
    P(_SCALAR_EW, P(Op.SLICE, _TIN, name="sq"), X("cq"), name="q"),
    P(
        Op.MATMUL,
        P(Op.TRANSPOSE, P(_SCALAR_EW, P(Op.SLICE, _TIN, name="sk"), X("ck"), name="k"), name="kt"),
        P(Op.PAD, P(Op.SLICE, _TIN, name="sv"), name="v"),
        name="kv",
    ),
    name="o",
)
_PATTERN = P(
    Op.TRANSPOSE,
    P(
        Op.DIV,
        P(Op.SLICE, _O, name="num"),
        P(Op.BROADCAST, P(Op.ADD, P(Op.SLICE, _O, name="den"), X("eps"), name="dadd"), name="bden"),
        name="div",
    ),
    name="root",
)
_INTERIOR = ("tin", "sq", "q", "sk", "k", "kt", "sv", "v", "kv", "o", "num", "den", "dadd", "bden", "div")


def _swaps_last_two(node) -> bool:
    r = len(node.shape)
    return r >= 3 and tuple(node.attr("perm")) == tuple(range(r - 2)) + (r - 1, r - 2)


def _last_axis_slice(g: Graph, nid: int) -> tuple[int, int] | None:
    """(start, length) of a SLICE that cuts only the last axis, with step 1."""
    node = g.nodes[nid]
    src = g.nodes[node.inputs[0]].shape
    starts, steps, lengths = node.attr("starts"), node.attr("steps"), node.attr("lengths")
    if any(int(s) != 1 for s in steps) or any(int(s) != 0 for s in starts[:-1]):
        return None
    if tuple(lengths[:-1]) != tuple(src[:-1]):
        return None
    return int(starts[-1]), int(lengths[-1])


def _ok(g: Graph, m: Match) -> bool:
    nodes = {n: m.node(n) for n in _INTERIOR + ("root",)}
    if not is_float(nodes["root"]) or not all(_swaps_last_two(nodes[t]) for t in ("root", "tin", "kt")):
        return False
    if any(scalar_value(g, m.nodes[c]) is None for c in ("cq", "ck", "eps")):
        return False
    if any(_last_axis_slice(g, m.nodes[s]) is None for s in ("sq", "sk", "sv", "num", "den")):
        return False
    v = nodes["v"]
    rank = len(v.shape)
    pads = tuple(tuple(p) for p in v.attr("pads"))
    if v.attr("mode", "constant") != "constant" or pads != ((0, 0),) * (rank - 1) + ((0, 1),):
        return False
    n = nodes["o"].shape[-1]
    if _last_axis_slice(g, m.nodes["num"]) != (0, n - 1) or _last_axis_slice(g, m.nodes["den"]) != (n - 1, 1):
        return False
    users = g.users()
    for nid in g.outputs.values():
        users[nid].append(-1)
    inside = {m.nodes[n] for n in _INTERIOR + ("root",)}
    return all(set(users[m.nodes[n]]) <= inside for n in _INTERIOR if n != "root")


def _channel_major(b: GraphBuilder, m: Match, v: Lookup) -> int:
    g = m.graph
    x = v("x")
    axis = len(b.shape(x)) - 2

    def part(sname: str) -> int:
        start, length = _last_axis_slice(g, m.nodes[sname])
        return slice_axis(b, x, axis, start, length)

    def scalar(cname: str, like: str) -> int:
        return b.const(np.array(scalar_value(g, m.nodes[cname]), dtype=m.node(like).dtype))

    xq = b.add(m.node("q").op, [part("sq"), scalar("cq", "q")])
    xk = b.add(m.node("k").op, [part("sk"), scalar("ck", "k")])
    vnode = m.node("v")
    rank = len(vnode.shape)
    pads = ((0, 0),) * (rank - 2) + ((0, 1), (0, 0))
    xv = b.add(Op.PAD, [part("sv")], pads=pads, mode="constant", value=vnode.attr("value", 0.0))
    swap = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    kv = b.add(Op.MATMUL, [xk, b.transpose(xv, swap)])
    ot = b.add(Op.MATMUL, [b.transpose(kv, swap), xq])
    n = b.shape(ot)[axis]
    num = slice_axis(b, ot, axis, 0, n - 1)
    den = b.add(Op.ADD, [slice_axis(b, ot, axis, n - 1, 1), scalar("eps", "div")])
    return b.add(Op.DIV, [num, b.broadcast_to(den, b.shape(num))])


CHANNEL_MAJOR_RULES = (
    Rule(
        "linear_attention_channel_major",
        _PATTERN,
        _channel_major,
        _ok,
        "T(o[:d] / (o[d:] + eps)), o = f(T(x)[q]) @ (T(f(T(x)[k])) @ pad(T(x)[v], 1)) = the same on x's "
        "rows, transposes only on v and k^T v  (Note [Channel-major linear attention])",
    ),
)
