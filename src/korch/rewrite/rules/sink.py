"""A pointwise convolution sunk below what treats every channel alike.

Note [Sinking pointwise convolutions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A 1x1 convolution (stride 1, no padding, group 1) applies one matrix ``W[Co, Ci]`` to
the channel vector of every pixel. Whatever treats every channel the same way commutes
with it, and whatever is linear distributes over it:

    conv(concat_c(p1, .., pn), W)  = conv(p1, W[:, 1]) + .. + conv(pn, W[:, n])
    conv(gather_s(y), W)           = gather_s(conv(y, W))       (s a spatial axis)
    conv(a * c, W)                 = conv(a, W) * c             (c constant along channels)
    conv(a + b, W)                 = conv(a, W) + conv(b, W)
    conv(c, W)                     = W . c                      (c a constant, folded)
    conv(nchw(m), W)               = nchw(matmul(m, W^T))       (m[B, HW, Ci] channels-last)
    matmul(matmul(z, V), W^T)      = matmul(z, V . W^T)         (V constant, folded)

A linear Resize is fission's gathers and constant spatial weights (fission/resize.py),
so the convolution moves below an upsampling to the lower resolution, and into the
channels-last projection that fed it. ``sink_pointwise_conv`` applies the whole chain
in one step: each identity alone leaves the linear work unchanged or larger (the sum
of a concat's parts is as many flops as the convolution over the concat), so a
cost-guided search that takes one at a time would not get past the first.

It pushes the convolution down as far as these go, stopping at a node some other
part of the graph also reads (pushing past it would compute it twice), at a gather
that shrinks the tensor (the convolution is cheaper after it) and at a projection
the fold would make larger. It is kept when the flops of the convolutions and
MatMuls it emits, against those of the convolution and the projections it replaces,
drop below ``SINK_GAIN``.

Segformer's decode head is the case (HF SegformerDecodeHead): four projections to 256
channels, three upsampled to the first stage's 128x128, concatenated to 1024 channels,
and a 1x1 convolution back to 256. Sunk, each stage's projection and its slice of the
fuse convolution become one MatMul at its own resolution (segformer_b1: 8.6 GFLOP of
convolution at 128x128 and the 64 MiB concat become 0.4 GFLOP), and three additions.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator

import numpy as np

from korch.ir.graph import Graph, GraphBuilder, strip_ones
from korch.ir.ops import GroupOp, Op
from korch.rewrite.pattern import Ctx, Lookup, Match, Rule, bcast_const, is_float, scalar_value

# Kept when the new linear work is at most this share of the old.
SINK_GAIN = 0.8
# Constants folded through W are at most this many elements (a bias, resize weights).
_SMALL_CONST = 1 << 16


def _pointwise_weight(g: Graph, nid: int) -> np.ndarray | None:
    """``W[Co, Ci]`` of a 1x1, stride-1, unpadded, ungrouped float CONV at ``nid``."""
    node = g.nodes[nid]
    if node.op is not Op.CONV or len(node.shape) != 4 or not is_float(node):
        return None
    w = g.nodes[node.inputs[1]]
    if w.op is not Op.CONST or tuple(w.shape[2:]) != (1, 1) or node.attr("group") != 1:
        return None
    if any(int(s) != 1 for s in node.attr("strides")) or any(int(p) != 0 for p in node.attr("pads")):
        return None
    return g.const_value(node.inputs[1]).reshape(w.shape[0], w.shape[1])


def _const(g: Graph, nid: int, rank: int | None = None) -> np.ndarray | None:
    """A small constant at ``rank`` (default ``nid``'s own), or None.

    ``rank`` is that of the tensor the constant meets: an elementwise primitive's
    inputs have its shape or are rank-0 scalar constants (``korch.ir.verify``), and a
    scalar is read at the consumer's rank, all ones (it is constant along every axis).
    """
    node = g.nodes[nid]
    if node.op not in (Op.CONST, Op.BROADCAST, Op.RESHAPE):
        return None
    val = bcast_const(g, nid)
    if val is None or val.size > _SMALL_CONST:
        return None
    rank = len(node.shape) if rank is None else rank
    return val.reshape((1,) * rank) if val.size == 1 else (val if val.ndim == rank else None)


def _nchw_view(g: Graph, nid: int) -> int | None:
    """``m`` when ``nid`` is ``reshape(transpose(m[B, HW, C], (0, 2, 1)), (B, C, H, W))``."""
    node = g.nodes[nid]
    if node.op is not Op.RESHAPE or len(node.shape) != 4:
        return None
    t = g.nodes[node.inputs[0]]
    if t.op is not Op.TRANSPOSE or tuple(t.attr("perm")) != (0, 2, 1):
        return None
    m = g.nodes[t.inputs[0]]
    b, c, h, w = node.shape
    return t.inputs[0] if tuple(m.shape) == (b, h * w, c) else None


def _channels_last_of(g: Graph, nid: int) -> int | None:
    """``x`` when ``nid`` is ``transpose(reshape(x[B, C, H, W], (B, C, HW)), (0, 2, 1))``."""
    node = g.nodes[nid]
    if node.op is not Op.TRANSPOSE or tuple(node.attr("perm")) != (0, 2, 1):
        return None
    r = g.nodes[node.inputs[0]]
    if r.op is not Op.RESHAPE:
        return None
    x = g.nodes[r.inputs[0]]
    if len(x.shape) != 4 or tuple(r.shape) != (x.shape[0], x.shape[1], x.shape[2] * x.shape[3]):
        return None
    return r.inputs[0]


def _digest(w: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(w).tobytes() + repr(w.shape).encode(), digest_size=12).digest()


@dataclasses.dataclass
class _Plan:
    """The sunk expression, as a tree of tuples the builder replays (``_emit``)."""

    expr: tuple
    leaves: list[int]
    flops_old: float
    flops_new: float


class _Walk:
    """Push ``W`` down from a pointwise CONV (Note [Sinking pointwise convolutions]).

    Two spaces: ``conv`` (NCHW, the matrix acts on axis 1) and ``mm`` (rank 3
    channels-last, the matrix multiplies on the right). A node is descended into only
    if it is in ``region``: every one of its users is the root or in the region."""

    def __init__(self, g: Graph, users: list[list[int]], root: int, w: np.ndarray):
        self.g, self.users, self.root = g, users, root
        self.region = self._region(root)
        self.memo: dict[tuple, tuple] = {}
        self.flops_old = 2.0 * g.nodes[root].size * w.shape[1]
        self.flops_new = 0.0

    # --- which nodes the push may pass ------------------------------------------------
    def _through(self, nid: int, space: str) -> list[tuple[int, str]]:
        """(input, space) pairs the push continues into from ``nid``, or [] where it stops."""
        g, node = self.g, self.g.nodes[nid]
        if not is_float(node) or _const(g, nid) is not None:
            return []
        rank = len(node.shape)  # an input of another shape is a rank-0 constant (verify)
        if space == "conv":
            if node.op is Op.CONCAT and node.attr("axis") == 1:
                return [(i, "conv") for i in node.inputs]
            if node.op is Op.GATHER and int(node.attr("axis")) in (2, 3):
                src = g.nodes[node.inputs[0]]
                grows = node.shape[node.attr("axis")] >= src.shape[node.attr("axis")]
                return [(node.inputs[0], "conv")] if grows and len(np.shape(node.attr("indices"))) == 1 else []
            if node.op is Op.MUL:
                a, c = node.inputs
                for x, k in ((a, c), (c, a)):
                    val = _const(g, k, rank)  # a scalar too: at the MUL's rank
                    if val is not None and val.shape[1] == 1 and _const(g, x, rank) is None:
                        return [(x, "conv")]
                return []
            if node.op is Op.ADD:
                return [(i, "conv") for i in node.inputs if _const(g, i, rank) is None]
            m = _nchw_view(g, nid)
            if m is not None:
                return [(node.inputs[0], "view"), (m, "mm")]
            return []
        if space == "view":
            return []
        if node.op is Op.ADD:
            return [(i, "mm") for i in node.inputs if _const(g, i, rank) is None]
        return []  # a MatMul by a constant is folded, not passed (``_region``): its input is a leaf

    def _region(self, root: int) -> set[int]:
        cand: set[int] = set()
        stack = [(self.g.nodes[root].inputs[0], "conv")]
        while stack:
            nid, space = stack.pop()
            if nid in cand:
                continue
            nxt = self._through(nid, space)
            node = self.g.nodes[nid]
            # matmul(matmul(z, V), W^T) = matmul(z, V . W^T) folds a matrix V[K, C] only
            v = self.g.nodes[node.inputs[1]] if node.op is Op.MATMUL else None
            foldable = space == "mm" and v is not None and v.op is Op.CONST and len(v.shape) == 2
            if nxt or space == "view" or foldable:
                cand.add(nid)
                stack.extend(nxt)
        while True:  # drop nodes read from outside; what they alone fed follows next round
            bad = {n for n in cand if any(u != root and u not in cand for u in self.users[n])}
            if not bad:
                return cand
            cand -= bad

    # --- the push -------------------------------------------------------------------
    def conv(self, nid: int, w: np.ndarray, at: tuple[int, ...] | None = None) -> tuple:
        """``conv(node, W)``; ``at``: the shape ``node`` has where it is read (a rank-0
        scalar constant meets an NCHW tensor; default the node's own)."""
        g, node = self.g, self.g.nodes[nid]
        at = tuple(node.shape) if at is None else tuple(at)
        key = ("conv", nid, _digest(w), at)
        if key in self.memo:
            return self.memo[key]
        shape = (at[0], w.shape[0]) + at[2:]
        val = _const(g, nid, len(at))
        if val is not None:
            full = np.broadcast_to(val, val.shape[:1] + (w.shape[1],) + val.shape[2:])
            e: tuple = ("const", np.einsum("oc,bchw->bohw", w, full).astype(node.dtype), shape)
        elif nid not in self.region or (node.op is Op.RESHAPE and node.inputs[0] not in self.region):
            self.flops_new += 2.0 * np.prod(shape) * w.shape[1]
            e = ("conv", nid, w, shape)
        elif node.op is Op.CONCAT:
            parts, off = [], 0
            for i in node.inputs:
                c = g.nodes[i].shape[1]
                parts.append(self.conv(i, w[:, off : off + c]))
                off += c
            e = parts[0]
            for p in parts[1:]:
                e = ("add", e, p, shape)
        elif node.op is Op.GATHER:
            e = ("gather", self.conv(node.inputs[0], w), dict(node.attrs), shape)
        elif node.op is Op.MUL:
            (x,) = (i for i, _ in self._through(nid, "conv"))
            k = node.inputs[1] if node.inputs[0] == x else node.inputs[0]
            e = ("mul", self.conv(x, w), _const(g, k, len(at)), shape)
        elif node.op is Op.ADD:
            a, b = node.inputs
            e = ("add", self.conv(a, w, at), self.conv(b, w, at), shape)
        else:  # the channels-last view
            m = _nchw_view(g, nid)
            inner = self.mm(m, w.T)
            e = self._as_conv(inner, shape) or ("view", inner, shape)
        self.memo[key] = e
        return e

    def _as_conv(self, e: tuple, shape: tuple[int, ...]) -> tuple | None:
        """``e`` (channels-last) in NCHW when each MatMul in it reads the channels-last
        view of an NCHW tensor of ``shape``'s size: nchw(matmul(cl(x), M)) is conv(x,
        M^T), and the two transposes cancel (segformer: each stage's projection read the
        encoder's NCHW output through one transpose and wrote 256 channels through
        another)."""
        kind = e[0]
        if kind == "const":
            val = e[1]
            if val.shape[1] != 1:
                return None
            return ("const", np.moveaxis(val, 2, 1)[..., None], shape)
        if kind == "add":
            a, b = self._as_conv(e[1], shape), self._as_conv(e[2], shape)
            return None if a is None or b is None else ("add", a, b, shape)
        if kind == "mm":
            x = _channels_last_of(self.g, e[1])
            if x is None or tuple(self.g.nodes[x].shape[2:]) != tuple(shape[2:]):
                return None
            return ("conv", x, e[2].T, shape)
        return None

    def mm(self, nid: int, wt: np.ndarray, at: tuple[int, ...] | None = None) -> tuple:
        """``matmul(node, wt)`` for a rank-3 channels-last ``node`` and ``wt[C, Co]``;
        ``at`` as in ``conv``."""
        g, node = self.g, self.g.nodes[nid]
        at = tuple(node.shape) if at is None else tuple(at)
        key = ("mm", nid, _digest(wt), at)
        if key in self.memo:
            return self.memo[key]
        shape = at[:-1] + (wt.shape[1],)
        val = _const(g, nid, len(at))
        if val is not None:
            full = np.broadcast_to(val, val.shape[:-1] + (wt.shape[0],))
            e: tuple = ("const", (full @ wt).astype(node.dtype), shape)
        elif nid in self.region and node.op is Op.ADD:
            a, b = node.inputs
            e = ("add", self.mm(a, wt, at), self.mm(b, wt, at), shape)
        elif nid in self.region and node.op is Op.MATMUL:
            z, v = node.inputs
            vv = g.const_value(v)
            k = vv.shape[0]
            if k * wt.shape[1] <= k * wt.shape[0] + wt.shape[0] * wt.shape[1]:
                self.flops_old += 2.0 * node.size * k
                self.flops_new += 2.0 * np.prod(shape) * k
                e = ("mm", z, (vv @ wt).astype(node.dtype), shape)
            else:
                self.flops_new += 2.0 * np.prod(shape) * wt.shape[0]
                e = ("mm", nid, wt.astype(node.dtype), shape)
        else:
            self.flops_new += 2.0 * np.prod(shape) * wt.shape[0]
            e = ("mm", nid, wt.astype(node.dtype), shape)
        self.memo[key] = e
        return e


def _plan(g: Graph, users: list[list[int]], root: int) -> _Plan | None:
    w = _pointwise_weight(g, root)
    if w is None:
        return None
    walk = _Walk(g, users, root, w)
    if not walk.region:
        return None
    expr = walk.conv(g.nodes[root].inputs[0], w)
    return _Plan(expr, list(_leaves(expr, {})), walk.flops_old, walk.flops_new)


def _leaves(e: tuple, acc: dict[int, None]) -> dict[int, None]:
    """The graph nodes an expression reads, in first-read order."""
    if e[0] in ("conv", "mm"):
        acc[e[1]] = None
    elif e[0] == "add":
        _leaves(e[1], acc)
        _leaves(e[2], acc)
    elif e[0] in ("mul", "gather", "view"):
        _leaves(e[1], acc)
    return acc


def _matches(ctx: Ctx, nid: int) -> Iterator[Match]:
    g = ctx.graph
    if g.nodes[nid].op is not Op.CONV:
        return
    plan = _plan(g, ctx.users, nid)
    if plan is None or plan.flops_new > SINK_GAIN * plan.flops_old:
        return
    names = {f"l{i}": leaf for i, leaf in enumerate(plan.leaves)}
    yield Match(g, (nid,), names, tuple(names))


def _emit(b: GraphBuilder, e: tuple, leaf: dict[int, int], attrs: dict, dtype: str, memo: dict[int, int]) -> int:
    if id(e) in memo:
        return memo[id(e)]
    kind, shape = e[0], e[-1]
    if kind == "const":
        # without its leading ones: the [N] bias form the ONNX export passes to Gemm and
        # Conv fusions (Note [Raising])
        val = e[1].reshape(strip_ones(e[1].shape))
        out = b.broadcast_to(b.const(val), shape) if val.size > 1 else b.const(val.reshape(()))
    elif kind == "conv":
        out = b.add(Op.CONV, [leaf[e[1]], b.const(e[2].astype(dtype)[:, :, None, None])], **attrs)
    elif kind == "mm":
        out = b.add(Op.MATMUL, [leaf[e[1]], b.const(e[2])])
    elif kind == "add":
        out = b.add(Op.ADD, [_emit(b, e[1], leaf, attrs, dtype, memo), _emit(b, e[2], leaf, attrs, dtype, memo)])
    elif kind == "mul":
        x = _emit(b, e[1], leaf, attrs, dtype, memo)
        out = b.add(Op.MUL, [x, b.broadcast_to(b.const(e[2]), shape)])
    elif kind == "gather":
        out = b.add(Op.GATHER, [_emit(b, e[1], leaf, attrs, dtype, memo)], **e[2])
    elif kind == "view":
        m = _emit(b, e[1], leaf, attrs, dtype, memo)
        out = b.reshape(b.transpose(m, (0, 2, 1)), shape)
    else:
        raise AssertionError(kind)
    memo[id(e)] = out
    return out


def _sink(b: GraphBuilder, m: Match, v: Lookup) -> int:
    g = m.graph
    root = m.roots[0]
    plan = _plan(g, Ctx(g).users, root)  # the match's plan, found again (Match holds ids only)
    assert plan is not None
    leaf = {old: v(name) for name, old in m.nodes.items()}
    node = g.nodes[root]
    return _emit(b, plan.expr, leaf, dict(node.attrs), node.dtype, {})


# --- a narrowing MatMul on the channels-last view of NCHW data --------------------------
#
# Note [Narrowing before the transpose]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
#     matmul(f(cl(d)), V[K, N]) = cl(conv1x1(f(d), V^T))     (N < K)
#
# where cl(d) is the channels-last view of an NCHW tensor d[B, K, H, W] (a reshape and
# a transpose) and f is elementwise with scalar constants. The transpose then moves N
# channels instead of K. Segformer's Mix-FFN (HF SegformerMixFFN) expands to 4C
# channels, runs its depthwise convolution in NCHW and turns back to channels-last for
# GELU and the projection to C: onnxruntime spent 8.8 of its 73 ms on those
# [HW, 4C] transposes (segformer_b1, its profiler). The byte/flop cost counts a
# transpose fused into the elementwise kernel before it, so it sees no gain; the rule
# runs after the search, where an onnxruntime region pays for every transpose
# (``LIBRARY_LAYOUT_RULES``, applied by ``korch.rewrite.for_library``).


def _narrow_region(g: Graph, users: list[list[int]], root: int) -> tuple[list[int], dict[int, int]] | None:
    """(elementwise nodes in topological order, {cl view: its NCHW source}) feeding the
    root MatMul's left input, or None if the pattern does not hold."""
    node = g.nodes[root]
    if node.op is not Op.MATMUL or len(node.shape) != 3 or not is_float(node):
        return None
    m, v = node.inputs
    if g.nodes[v].op is not Op.CONST or len(g.nodes[v].shape) != 2:
        return None
    k, n = g.nodes[v].shape
    if n >= k:
        return None
    region: set[int] = set()
    views: dict[int, int] = {}
    stack = [m]
    while stack:
        nid = stack.pop()
        if nid in region or nid in views:
            continue
        src = _channels_last_of(g, nid)
        if src is not None:
            views[nid] = src
            continue
        x = g.nodes[nid]
        if x.op not in GroupOp.ELEMENTWISE or x.shape != g.nodes[m].shape or not is_float(x):
            return None
        region.add(nid)
        for i in x.inputs:
            if scalar_value(g, i) is None:
                stack.append(i)
    if not views or any(u != root and u not in region for r in region for u in users[r]):
        return None
    if m not in region and m not in views:
        return None
    return sorted(region), views


def _narrow_matches(ctx: Ctx, nid: int) -> Iterator[Match]:
    g = ctx.graph
    if g.nodes[nid].op is not Op.MATMUL:
        return
    found = _narrow_region(g, ctx.users, nid)
    if found is None:
        return
    _, views = found
    names = {f"d{i}": src for i, src in enumerate(dict.fromkeys(views.values()))}
    yield Match(g, (nid,), names, tuple(names))


def _narrow(b: GraphBuilder, m: Match, v: Lookup) -> int:
    g = m.graph
    root = m.roots[0]
    found = _narrow_region(g, Ctx(g).users, root)
    assert found is not None
    region, views = found
    src_new = {old: v(name) for name, old in m.nodes.items()}
    new: dict[int, int] = {view: src_new[src] for view, src in views.items()}
    for nid in region:
        x = g.nodes[nid]
        ins = []
        for i in x.inputs:
            if i in new:
                ins.append(new[i])
            else:
                ins.append(b.const(np.array(scalar_value(g, i), dtype=g.nodes[i].dtype)))
        new[nid] = b.add(x.op, ins, **dict(x.attrs))
    mm, w = g.nodes[root].inputs
    x = new[mm]
    nchw = b.shape(x)
    wt = g.const_value(w).T
    attrs = dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1)
    y = b.add(Op.CONV, [x, b.const(np.ascontiguousarray(wt)[:, :, None, None])], **attrs)
    bsz, n = nchw[0], wt.shape[0]
    return b.transpose(b.reshape(y, (bsz, n, nchw[2] * nchw[3])), (0, 2, 1))


LIBRARY_LAYOUT_RULES = (
    Rule(
        "narrow_before_transpose",
        _narrow_matches,
        _narrow,
        equation="matmul(f(cl(d)), V[K, N]) = cl(conv1x1(f(d), V^T))  (N < K, f elementwise; "
        "Note [Narrowing before the transpose])",
    ),
)

SINK_RULES = (
    Rule(
        "sink_pointwise_conv",
        _matches,
        _sink,
        equation="conv1x1(concat/gather/resize/nchw(matmul(z, V)), W) = its parts' "
        "resize(nchw(matmul(z, V W^T))) summed  (Note [Sinking pointwise convolutions])",
    ),
)
