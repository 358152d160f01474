"""An elementwise op applied alike to every part of a split, applied once before it.

Note [Pointwise over a split]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Where slices of ``x`` along one axis partition it (``split``), and each part goes
through the same elementwise op whose other operands are, part by part, the same
scalar, a constant varying only along that axis, or the same part of another split,
the op commutes with the split::

    op(x[i], c[i], y[i]) for each part i  =  split(op(x, concat(c), y))[i]

``merge_conv_shared_input`` leaves this shape behind: yolo's C3 blocks read one input
with two 1x1 convolutions, each followed by its bias and SiLU; merged, the bias and
SiLU come after the split, so neither is an epilogue of the merged convolution and
each part ran as a kernel of its own (yolo_b1: ten such kernels, 0.27 ms of 7.3).
Applied three times (the bias, the sigmoid, the product of the two), the chain moves
above the split and the convolution takes it as its epilogue; the slices left are
blocks of one buffer at batch 1 (Note [Views in a segment]).

The flops and bytes are the same and the ops fewer, but the search's cost (Note
[Rewrite cost]) fuses neither form into the convolution, so it sees no gain: the rule
runs after the search, greedily, with the library layouts (``for_library``). Its
matches need every part's op at once, which a bottom-up simplification has not yet
built. Parts another op also reads stay as they are for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import GroupOp, Op
from korch.rewrite.pattern import Ctx, Lookup, Match, Rule, channel_vector, is_float, scalar_value
from korch.rewrite.rules.common import channel_shape, slice_axis


def split_parts(g: Graph, users: list[int], x: int) -> tuple[int, list[int]] | None:
    """(axis, the slices ordered by start) where the slices of ``x`` among ``users``
    cover it exactly along one axis with unit steps, else None."""
    shape = g.nodes[x].shape
    start: dict[int, int] = {}  # slice -> its start along the axis
    axis = None
    for u in users:
        node = g.nodes[u] if u >= 0 else None
        if node is None or node.op is not Op.SLICE:
            continue
        cut = [i for i, (ln, d) in enumerate(zip(node.attr("lengths"), shape)) if ln != d]
        if len(cut) != 1 or node.attr("steps")[cut[0]] != 1 or (axis is not None and cut[0] != axis):
            return None
        axis = cut[0]
        start[u] = node.attr("starts")[axis]
    if axis is None or len(start) < 2:
        return None
    parts = sorted(start, key=start.__getitem__)
    at = 0
    for s in parts:
        if start[s] != at:
            return None  # a gap or an overlap (two slices of the same range)
        at += g.nodes[s].attr("lengths")[axis]
    return (axis, parts) if at == shape[axis] else None


def _pointwise_over_split(ctx: Ctx, nid: int) -> Iterator[Match]:
    g = ctx.graph
    e = g.nodes[nid]
    if e.op not in GroupOp.ELEMENTWISE or e.op is Op.WHERE or not is_float(e):
        return
    for pos, src in enumerate(e.inputs):
        if g.nodes[src].op is not Op.SLICE:
            continue
        x = g.nodes[src].inputs[0]
        split = split_parts(g, ctx.users[x], x)
        if split is None or split[1][0] != src:  # rooted at the first part's op
            continue
        axis, parts = split
        group = [_alike(g, ctx.users[p], e, pos, p) for p in parts]
        if any(u is None for u in group) or group[0] != nid:
            continue
        operands = _operands(g, ctx, group, pos, axis, parts)
        if operands is None:
            continue
        names = {"x": x, **{f"y{q}": y for q, y in operands.items()}}
        yield Match(g, tuple(group), names, tuple(names))
        return


def _alike(g: Graph, users: list[int], e, pos: int, part: int) -> int | None:
    """The first user of ``part`` that is ``e``'s op with its attributes, reading the part
    at ``pos``."""
    for u in users:
        if u >= 0 and g.nodes[u].op is e.op and g.nodes[u].attrs == e.attrs and g.nodes[u].inputs[pos] == part:
            return u
    return None


def _operands(g: Graph, ctx: Ctx, group: list[int], pos: int, axis: int, parts: list[int]) -> dict[int, int] | None:
    """Whether the parts' ops agree at every operand position but ``pos`` (the same
    scalar, constants along ``axis``, or the same parts of another split): the positions
    of the latter, with the tensor split; None where they disagree."""
    out: dict[int, int] = {}
    for q in range(len(g.nodes[group[0]].inputs)):
        if q == pos:
            continue
        ops = [g.nodes[u].inputs[q] for u in group]
        values = [scalar_value(g, o) for o in ops]
        if all(v is not None for v in values) and len(set(values)) == 1:
            continue
        vecs = [channel_vector(g, o, axis, g.nodes[p].shape) for o, p in zip(ops, parts)]
        if all(v is not None for v in vecs):
            continue
        if not all(g.nodes[o].op is Op.SLICE for o in ops):
            return None
        y = g.nodes[ops[0]].inputs[0]
        other = split_parts(g, ctx.users[y], y)
        if other is None or other[0] != axis or other[1] != ops:
            return None
        if any(g.nodes[o].attr("starts") != g.nodes[p].attr("starts") for o, p in zip(ops, parts)):
            return None
        out[q] = y
    return out


def _hoist(b: GraphBuilder, m: Match, v: Lookup) -> dict[int, int]:
    g = m.graph
    e = g.nodes[m.roots[0]]
    axis, parts = split_parts(g, Ctx(g).users[m.nodes["x"]], m.nodes["x"])  # type: ignore[misc]
    pos = next(q for q, src in enumerate(e.inputs) if src == parts[0])
    x = v("x")
    shape = b.shape(x)
    args = []
    for q, src in enumerate(e.inputs):
        if q == pos:
            args.append(x)
            continue
        n = g.nodes[src]
        sv = scalar_value(g, src)
        if f"y{q}" in m.nodes:
            args.append(v(f"y{q}"))
        elif sv is not None and all(scalar_value(g, g.nodes[r].inputs[q]) == sv for r in m.roots):
            args.append(b.const(np.array(sv, dtype=n.dtype)))
        else:
            vec = np.concatenate(
                [channel_vector(g, g.nodes[r].inputs[q], axis, g.nodes[p].shape) for r, p in zip(m.roots, parts)]
            )
            c = b.const(vec.astype(n.dtype).reshape(channel_shape(len(shape), axis, shape[axis])))
            args.append(b.broadcast_to(c, shape))
    whole = b.add(e.op, args, **dict(e.attrs))
    out, at = {}, 0
    for r, p in zip(m.roots, parts):
        n = g.nodes[p].attr("lengths")[axis]
        out[r] = slice_axis(b, whole, axis, at, n)
        at += n
    return out


SPLIT_RULES = (
    Rule(
        "pointwise_over_split",
        _pointwise_over_split,
        _hoist,
        equation="op(x[i], c[i], y[i]) for every part i of a split = split(op(x, concat(c), y))",
    ),
)
