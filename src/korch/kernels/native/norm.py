"""Native LayerNorm: fission's LayerNorm over the trailing axis, run by korch's runtime
(Note [Native LayerNorm] in ``korch_rt.cc``) as one step of a native segment. It
competes with TVM's kernel for the same primitives: both are measured.

A kernel graph qualifies when its compute nodes are exactly this chain over one
float32 input x (the statistics over its last axis, N elements)::

    mean = REDUCE_SUM(x) / N              (or * (1 / N))
    d    = x - BROADCAST(mean)
    var  = REDUCE_SUM(d * d) / N          (or * (1 / N))
    s    = SQRT(var + eps)
    y    = d * BROADCAST(RECIPROCAL(s))   (or d / BROADCAST(s))
    y    = y * gamma                      (optional: an input of N elements, reshaped
    y    = y + beta                        and broadcast along the rows; optional too)

The code the runtime reads (``korch_linear_create``, op 7)::

    1, 7, n inputs, 1, 0, 0, x pos, 0, D, shape[D], rows, N, eps (float64 bits),
    gamma pos (-1: none), beta pos (-1: none), 0 steps
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.native.rtkernel import SpecKernel


@dataclass
class LayerNormSpec:
    x_pos: int
    shape: tuple[int, ...]
    eps: float
    gamma_pos: int = -1
    beta_pos: int = -1


class _Match:
    """Walks the chain backwards, collecting the nodes it passes."""

    def __init__(self, kgraph: Graph, shape: tuple[int, ...]):
        self.nodes, self.shape, self.seen = kgraph.nodes, shape, set()
        self.inputs = list(kgraph.inputs.values())

    def take(self, nid: int, op: Op) -> tuple[int, ...] | None:
        node = self.nodes[nid]
        if node.op is not op:
            return None
        self.seen.add(nid)
        return tuple(node.inputs)

    def scalar(self, nid: int) -> float | None:
        node = self.nodes[nid]
        return float(node.attr("value")) if node.is_scalar_const else None

    def row_stat(self, nid: int, n: int) -> int | None:
        """The REDUCE_SUM over the last axis that ``nid`` (its sum / N, or * 1 / N) is
        made of, spread back to ``shape``: its input, or None."""
        src = self.take(nid, Op.BROADCAST)
        if src is None or tuple(self.nodes[nid].shape) != self.shape:
            return None
        return self.mean_of(src[0], n)

    def mean_of(self, nid: int, n: int) -> int | None:
        node = self.nodes[nid]
        if node.op not in (Op.DIV, Op.MUL):
            return None
        a, b = node.inputs
        c = self.scalar(b)  # N for a division, 1 / N for a product
        if not c or not math.isclose(c if node.op is Op.DIV else 1.0 / c, n, rel_tol=1e-6):
            return None
        self.seen.add(nid)
        red = self.take(a, Op.REDUCE_SUM)
        rank = len(self.shape)
        if red is None or tuple(self.nodes[a].attr("axes") or ()) not in ((rank - 1,), (-1,)):
            return None
        return red[0]

    def row_operand(self, nid: int) -> int | None:
        """An input of N elements spread along the rows through RESHAPE/BROADCAST: its
        position among the kernel's inputs, or None."""
        walked = []
        while self.nodes[nid].op in (Op.RESHAPE, Op.BROADCAST):
            walked.append(nid)
            nid = self.nodes[nid].inputs[0]
        node = self.nodes[nid]
        if node.op is not Op.INPUT or node.dtype != "float32" or node.size != self.shape[-1]:
            return None
        self.seen.update(walked)
        return self.inputs.index(nid)


def layernorm_spec(kgraph: Graph) -> LayerNormSpec | None:
    """The kernel as a LayerNorm the runtime runs, or None (module docstring)."""
    nodes = kgraph.nodes
    if len(kgraph.outputs) != 1:
        return None
    out_id = next(iter(kgraph.outputs.values()))
    out = nodes[out_id]
    shape = tuple(int(d) for d in out.shape)
    if out.dtype != "float32" or not shape or 0 in shape:
        return None
    m = _Match(kgraph, shape)
    n = shape[-1]
    gamma = beta = -1
    y = out_id
    for op in (Op.ADD, Op.MUL):  # the affine map, beta then gamma, each optional
        node = nodes[y]
        if node.op is not op:
            continue
        for mine, other in (node.inputs, node.inputs[::-1]):
            pos = m.row_operand(other)
            if pos is not None and nodes[mine].op in (Op.MUL, Op.DIV):
                m.seen.add(y)
                beta, gamma = (pos, gamma) if op is Op.ADD else (beta, pos)
                y = mine
                break
    node = nodes[y]
    if node.op not in (Op.MUL, Op.DIV):
        return None
    m.seen.add(y)
    d, rb = node.inputs
    if m.take(rb, Op.BROADCAST) is None or tuple(nodes[rb].shape) != shape:
        return None
    s = nodes[rb].inputs[0]
    if node.op is Op.MUL:
        r = m.take(s, Op.RECIPROCAL)
        if r is None:
            return None
        s = r[0]
    sq = m.take(s, Op.SQRT)
    if sq is None:
        return None
    add = m.take(sq[0], Op.ADD)
    if add is None:
        return None
    var, eps_id = add if m.scalar(add[1]) is not None else add[::-1]
    eps = m.scalar(eps_id)
    if eps is None:
        return None
    sq_id = m.mean_of(var, n)
    sqr = m.take(sq_id, Op.MUL) if sq_id is not None else None
    if sqr is None or sqr[0] != d or sqr[1] != d:
        return None
    sub = m.take(d, Op.SUB)
    if sub is None:
        return None
    x_id, mb = sub
    if m.row_stat(mb, n) != x_id:
        return None
    x = nodes[x_id]
    if x.op is not Op.INPUT or x.dtype != "float32" or tuple(x.shape) != shape:
        return None
    if m.seen != set(kgraph.compute_ids()):
        return None  # something else is computed
    return LayerNormSpec(m.inputs.index(x_id), shape, eps, gamma, beta)


def encode_layernorm(spec: LayerNormSpec, n_inputs: int) -> np.ndarray:
    rows, n = math.prod(spec.shape[:-1]), spec.shape[-1]
    eps = int(np.array(spec.eps, dtype=np.float64).view(np.int64))
    code = [1, 7, n_inputs, 1, 0, 0, spec.x_pos, 0, len(spec.shape), *spec.shape, rows, n, eps]
    code += [spec.gamma_pos, spec.beta_pos, 0]
    return np.asarray(code, dtype=np.int64)


class NativeLayerNormKernel(SpecKernel):
    op = "layernorm"
    spec_type = LayerNormSpec
    encoder = staticmethod(encode_layernorm)

    def input_positions(self) -> tuple[int, ...]:
        return tuple(p for p in (self.spec.x_pos, self.spec.gamma_pos, self.spec.beta_pos) if p >= 0)
