"""Coalesced axes: a kernel's iteration space with its mergeable axes merged.

Note [Coalesced axes]
~~~~~~~~~~~~~~~~~~~~~
The fused schedule fuses a kernel's loops into one and splits it into vectors
(Note [Row tiling]). Each block still indexes its buffers by the original axes,
``x[f // 784, f % 784 // 28, f % 28]``. TVM simplifies each of those indices on
its own before it flattens the buffer. Then the pieces no longer add back up to
``f``: a vector of 8 lanes that crosses a row of 28 becomes a gather and a
scatter. On this AVX2 machine a lone ``x * c`` over [1, 96, 28, 28] ran 262 us
that way. Written as one flat loop it ran 14 us, which is what the tiling model
predicted (23 us). Every CNN epilogue whose rows are 7, 14, 28 or 56 wide paid
this. In mobilenetv3_small the generated kernels took 2.2 ms of its 11.6.

The fix is to remove the problem, not to patch the simplifier. Before lowering, a
kernel made only of elementwise, broadcast and keepdims-reduce primitives is
rewritten over coalesced axes. Two adjacent axes merge when every node of the
kernel either keeps both at full size or has size 1 on both. This is the rule
behind PyTorch's TensorIterator ``coalesce_dimensions``. The merge is exact: it
relabels each node's elements in their C order, and every node's data is
contiguous in that order. Axes of size 1 everywhere are dropped. The tile
config's ``parallel_axes`` is a boundary no merge crosses, so the parallel loop
still covers the same leading axes.

Merging leaves at most the rows of a broadcast operand, [240, 196] from a
per-channel [240, 1]. If the config fuses every axis, and the last axis is not a
multiple of the vector width, the vectors still cross rows: the per-channel
operand then becomes a gather (78 us against 21 us here). Such a kernel loops over
the rows instead, ``parallel_axes`` one less and no inner tile, and vectorises
along each row.

The generated function's buffers then take the coalesced shapes
(``Prepared.call_shapes``). The kernel's interface keeps the original shapes:
its arrays are reshaped, which costs no copy since they are contiguous.
A segment's DLTensors are built with the call shapes.
"""

from __future__ import annotations

import dataclasses

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp, Op

_OPS = GroupOp.ELEMENTWISE | GroupOp.REDUCE | frozenset({Op.BROADCAST})


@dataclasses.dataclass(frozen=True)
class Coalesced:
    graph: Graph  # the same nodes (same ids), over coalesced shapes
    groups: tuple[tuple[int, ...], ...]  # original axes of each coalesced axis
    parallel_axes: int  # the tile config's parallel_axes over the coalesced axes
    inner_tile: int  # and its inner_tile


def coalesce(g: Graph, parallel_axes: int, inner_tile: int = 0, vector_width: int = 1) -> Coalesced | None:
    """``g`` over merged axes, or None when nothing merges or ``g`` holds a primitive
    outside elementwise, broadcast and reduce (Note [Coalesced axes]). The arguments
    are the tile config's; the result carries them over the merged axes."""
    for node in g.nodes:
        if node.op in GroupOp.SOURCE:
            if node.op is Op.CONST and not node.is_scalar_const:
                return None
            continue
        if node.op not in _OPS:
            return None
    shaped = [n for n in g.nodes if n.shape != () and not n.is_scalar_const]
    if not shaped:
        return None
    rank = len(shaped[0].shape)
    if any(len(n.shape) != rank for n in shaped):
        return None
    full = [max(n.shape[d] for n in shaped) for d in range(rank)]
    # every dim of every node is the full extent or 1 (what broadcast and keepdims give)
    if any(s not in (1, f) for n in shaped for s, f in zip(n.shape, full)):
        return None
    keep = [d for d in range(rank) if full[d] > 1]
    if not keep:
        return None
    groups: list[list[int]] = [[keep[0]]]
    for d in keep[1:]:
        prev = groups[-1][-1]
        same = all((n.shape[prev] == 1) == (n.shape[d] == 1) for n in shaped)
        if same and not (prev < parallel_axes <= d):
            groups[-1].append(d)
        else:
            groups.append([d])
    if len(groups) == rank:
        return None  # nothing merged and nothing dropped
    tuples = tuple(tuple(gr) for gr in groups)

    def shape_of(shape: tuple[int, ...]) -> tuple[int, ...]:
        out = []
        for gr in tuples:
            size = 1
            for d in gr:
                size *= shape[d]
            out.append(size)
        return tuple(out)

    nodes = []
    for node in g.nodes:
        if node.shape == () or node.is_scalar_const:
            nodes.append(node)
            continue
        attrs = dict(node.attrs)
        if node.op is Op.BROADCAST:
            attrs["shape"] = shape_of(tuple(attrs["shape"]))
        elif node.op in GroupOp.REDUCE:
            axes = set(attrs["axes"])
            attrs["axes"] = tuple(j for j, gr in enumerate(tuples) if axes & set(gr))
            if not attrs["axes"]:
                return None  # a reduction over size-1 axes only: leave it as it is
        nodes.append(dataclasses.replace(node, shape=shape_of(node.shape), attrs=tuple(attrs.items())))
    p = parallel_axes
    new_p = len(tuples) if p >= rank else sum(1 for gr in tuples if gr[-1] < p)
    if p > 0 and new_p == 0:
        return None  # the common loop's axes all have size 1: keep the nest as it is
    inner = shape_of(tuple(full))[-1]
    if new_p == len(tuples) > 1 and inner % max(1, vector_width):
        # vectors of the one fused loop would cross the last axis's rows: loop over rows
        new_p, inner_tile = len(tuples) - 1, 0
    return Coalesced(Graph(nodes, dict(g.inputs), dict(g.outputs), dict(g.consts)), tuples, new_p, inner_tile)


__all__ = ["Coalesced", "coalesce"]
