"""Fission's patterns raised back to ONNX operators for onnxruntime (Note [Raising]).

Used by ``korch.ir.to_onnx``; each ``_raise_*`` maps a node to (its source tensor, ONNX
op, attributes).
"""

from __future__ import annotations

import math

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op


def _upsample_factor(idx: np.ndarray, n_in: int) -> int:
    """k when ``idx`` is ``arange(k * n_in) // k`` (nearest upsampling by k >= 2), else 0."""
    if idx.ndim != 1 or n_in < 1 or idx.size % n_in or idx.size < 2 * n_in:
        return 0
    k = idx.size // n_in
    return k if np.array_equal(idx, np.arange(idx.size) // k) else 0


# Note [Raising]
# ~~~~~~~~~~~~~~
# A kernel run by onnxruntime (a linear kernel with its epilogue, a library region,
# Note [Library regions]) is exported primitive by primitive, but onnxruntime's CPU
# speed comes from fusing and blocking whole operators: MaxPool, Resize and Conv with
# a HardSigmoid/HardSwish activation run in its NCHWc layout; their fissioned forms
# (an im2col Gather and a ReduceMax; Gathers; Add/Max/Min/Mul) leave the layout and
# cost a reorder on each side. So the export recognises fission's own patterns and
# emits the operator: each raise maps one node to (its source tensor, ONNX op,
# attributes); the pattern's inner nodes must have no other user, and become dead.


def _raise_max_pools(graph: Graph) -> dict[int, tuple[int, str, dict]]:
    """MaxPool for each RESHAPE ending fission's PAD(-inf) + WINDOW + REDUCE_MAX.

    onnxruntime runs MaxPool in its blocked layout; the primitives would be an im2col
    Gather and a ReduceMax (yolo_b1's SPPF: 5 ms as primitives, 0.14 ms as MaxPool).
    Only when the intermediate tensors have no other user and the geometry gives the
    RESHAPE's shape exactly.
    """
    users = graph.users()
    outs = set(graph.outputs.values())
    private = lambda nid, user: users[nid] == [user] and nid not in outs
    found: dict[int, dict] = {}
    for rid, r in enumerate(graph.nodes):
        if r.op is not Op.RESHAPE or np.dtype(r.dtype).kind != "f":
            continue
        mid = r.inputs[0]
        m = graph.nodes[mid]
        if m.op is not Op.REDUCE_MAX or not private(mid, rid):
            continue
        wid = m.inputs[0]
        w = graph.nodes[wid]
        if w.op is not Op.WINDOW or not private(wid, mid):
            continue
        kernel, strides, dil = (list(w.attr(a)) for a in ("kernel", "strides", "dilations"))
        nsp = len(kernel)
        src = w.inputs[0]
        if sorted(m.attr("axes")) != list(range(len(w.shape) - nsp, len(w.shape))):
            continue
        if tuple(r.shape) != tuple(w.shape[: len(w.shape) - nsp]) or len(r.shape) != nsp + 2:
            continue
        begin, end = [0] * nsp, [0] * nsp
        p = graph.nodes[src]
        if (
            p.op is Op.PAD
            and private(src, wid)
            and p.attr("mode", "constant") == "constant"
            and p.attr("value") == -math.inf
            and all(tuple(q) == (0, 0) for q in p.attr("pads")[:2])
        ):
            begin = [int(q[0]) for q in p.attr("pads")[2:]]
            end = [int(q[1]) for q in p.attr("pads")[2:]]
            src = p.inputs[0]
        in_sp = graph.nodes[src].shape[2:]
        if len(in_sp) != nsp:
            continue
        sizes = [
            (n + b + e - d * (k - 1) - 1) // st + 1
            for n, b, e, d, k, st in zip(in_sp, begin, end, dil, kernel, strides)
        ]
        if sizes != list(r.shape[2:]):
            continue
        found[rid] = (
            src,
            "MaxPool",
            {"kernel_shape": kernel, "strides": strides, "dilations": dil, "pads": begin + end},
        )
    return found


def _scalar(graph: Graph, nid: int) -> float | None:
    node = graph.nodes[nid]
    return float(node.attr("value")) if node.is_scalar_const else None


def _raise_hard_activations(graph: Graph) -> dict[int, tuple[int, str, dict]]:
    """HardSigmoid for fission's MIN(MAX(ADD(MUL(x, a), b), 0), 1); HardSwish for
    MUL(x, HardSigmoid(x) with a = 1/6, b = 1/2) (activations.py)."""
    users = graph.users()
    outs = set(graph.outputs.values())
    private = lambda nid: len(users[nid]) == 1 and nid not in outs
    nodes = graph.nodes

    def split(nid: int, op: Op) -> tuple[int, float] | None:
        """(tensor operand, scalar operand) of a binary ``op`` node with one scalar."""
        node = nodes[nid]
        if node.op is not op or len(node.inputs) != 2:
            return None
        a, b = node.inputs
        if _scalar(graph, b) is not None and _scalar(graph, a) is None:
            return a, _scalar(graph, b)
        if _scalar(graph, a) is not None and _scalar(graph, b) is None:
            return b, _scalar(graph, a)
        return None

    found: dict[int, tuple[int, str, dict]] = {}
    for nid, node in enumerate(nodes):
        if node.op is not Op.MIN or np.dtype(node.dtype).kind != "f":
            continue
        top = split(nid, Op.MIN)
        if top is None or top[1] != 1.0 or not private(top[0]):
            continue
        mx = split(top[0], Op.MAX)
        if mx is None or mx[1] != 0.0 or not private(mx[0]):
            continue
        add = split(mx[0], Op.ADD)
        if add is None:
            continue
        x, alpha = add[0], 1.0
        mul = split(x, Op.MUL)
        if mul is not None and private(x):
            x, alpha = mul
        if nodes[x].shape != node.shape:
            continue
        found[nid] = (x, "HardSigmoid", {"alpha": alpha, "beta": add[1]})
    for nid, node in enumerate(nodes):
        if node.op is not Op.MUL or len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
            continue
        for x, h in (node.inputs, node.inputs[::-1]):
            hs = found.get(h)
            if (
                hs is not None
                and hs[0] == x
                and private(h)
                and abs(hs[2]["alpha"] - 1.0 / 6.0) < 1e-7
                and hs[2]["beta"] == 0.5
            ):
                found[nid] = (x, "HardSwish", {})
                del found[h]
                break
    return found
