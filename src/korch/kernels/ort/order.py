"""The order onnxruntime's fusions need in korch's export (Note [Operand order]).

Used by ``korch.kernels.ort.export``.
"""

from __future__ import annotations

import heapq

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.ort.raising import const_input_ids, effective, is_constant


# Note [Operand order]
# ~~~~~~~~~~~~~~~~~~~~
# onnxruntime's graph fusions match operand order: it folds a bias or scale into the
# Conv before it only as Add(Conv(x), B) / Mul(Conv(x), S), and its NCHWc Conv
# accumulates a Sum and fuses a Relu only when the constant was added to the Conv
# first. A fissioned graph keeps whatever order the model or a rewrite gave, so the
# exporter puts a constant operand of Add/Mul second (``_Exporter.lower``) and
# reassociates (conv + rest) + B (below); then it emits nodes in an order that
# respects the new inputs (``emit_order``). Each cost segformer's rewritten decode
# head its blocked layout (benchmarks/RESULTS.md in git history).
def reassociate_conv_biases(
    graph: Graph, eff: dict[int, tuple[int, ...]], const_inputs: dict, raised: dict
) -> dict[int, tuple[int, ...]]:
    """New inputs for ``(conv + rest) + B`` with a constant B: ``(conv + B) + rest``
    (``conv`` may already carry its own constant bias).

    onnxruntime fuses a constant Add into the Conv before it, and then ``+ rest`` (a Sum
    its NCHWc Conv accumulates into) and a following Relu, but not a constant added
    after the Sum: that Add and the Relu ran outside the blocked layout with a reorder
    on each side (segformer_b1's rewritten decode head, at 256x128x128). Only when the
    inner Add is private to the outer one and the Conv's output has the full shape;
    the sum is reassociated in float (within rounding).
    """
    ins, users = effective(graph, eff)
    nodes = graph.nodes
    outs = set(graph.outputs.values())

    const_ids = const_input_ids(graph, const_inputs)

    def const(nid: int) -> bool:
        return is_constant(graph, nid, ins, const_ids)

    def conv_biased(nid: int) -> bool:
        """A CONV, or a private constant ADD of one (a Conv with its bias)."""
        if nodes[nid].op is Op.CONV:
            return True
        if nodes[nid].op is not Op.ADD or nid in raised or len(ins(nid)) != 2:
            return False
        x, b = ins(nid)
        x, b = (x, b) if const(b) else (b, x)
        return const(b) and not const(x) and users[x] == [nid] and conv_biased(x)

    found: dict[int, tuple[int, ...]] = {}
    for outer, node in enumerate(nodes):
        if node.op is not Op.ADD or outer in raised or np.dtype(node.dtype).kind != "f" or len(ins(outer)) != 2:
            continue
        a, b = ins(outer)
        inner, c = (a, b) if const(b) else (b, a)
        if not const(c) or const(inner) or nodes[inner].op is not Op.ADD or inner in raised or inner in found:
            continue
        if users[inner] != [outer] or inner in outs or len(ins(inner)) != 2:
            continue
        p, q = ins(inner)
        if not conv_biased(p):
            p, q = q, p
        if not conv_biased(p) or nodes[p].shape != node.shape or users[p] != [inner] or const(q):
            continue
        found[inner] = (p, c)
        found[outer] = (inner, q)
    return found


def emit_order(graph: Graph, eff: dict[int, tuple[int, ...]], live: list[bool]) -> list[int]:
    """The live nodes in id order, except that a node comes after the inputs ``eff``
    gives it (a reassociated Add may take a constant with a larger id)."""
    ins = {nid: tuple(eff.get(nid, graph.nodes[nid].inputs)) for nid in range(len(graph.nodes)) if live[nid]}
    if all(i < nid for nid, srcs in ins.items() for i in srcs):
        return sorted(ins)
    pending = {nid: len(srcs) for nid, srcs in ins.items()}
    users: dict[int, list[int]] = {}
    for nid, srcs in ins.items():
        for i in srcs:
            users.setdefault(i, []).append(nid)
    ready = [nid for nid, n in pending.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        nid = heapq.heappop(ready)
        order.append(nid)
        for u in users.get(nid, ()):
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return order
