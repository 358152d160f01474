"""The default cost of a primitive graph: a byte/flop estimate with a crude fusion model.

Note [Rewrite cost]
~~~~~~~~~~~~~~~~~~~
The search needs a cost for whole graphs, thousands of times, before any kernel
exists; it takes any ``Callable[[Graph], float]`` (seconds), so the auto-tiling model
can replace this one. The default:

* memory-bound primitives (elementwise, broadcast, layout) fuse into a kernel along an
  edge whose producer has exactly one user (and is not a graph output); a reduction
  may end such a chain. Those groups are convex (only their sink has users outside),
  so each is a real candidate kernel. A group costs the bytes it reads (each
  external tensor once; a tensor read only through SLICEs costs the sliced bytes) and
  writes, at ``bandwidth``, plus ``launch``. A group of RESHAPEs only is free (a view);
  rank-0 constants are inlined and free.
* linear primitives cost ``max(2*flops / flops_per_s, bytes / bandwidth) + launch``
  (a roofline: a MatMul with a ones column is memory-bound, like the reduction it
  replaces). A convolution's output channels count rounded up to
  ``CONV_CHANNEL_BLOCK``: blocked convolutions (onnxruntime's NCHWc on AVX-512) compute
  a block of 16 output channels at a time, so 3 cost as much as 16 (Note
  [Space-to-depth convolutions]).
* opaque primitives cost their bytes plus ``launch``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from korch.ir.graph import Graph, Node
from korch.ir.ops import GroupOp, Op

CONV_CHANNEL_BLOCK = 16
_FUSABLE = GroupOp.ELEMENTWISE | GroupOp.BROADCAST | GroupOp.LAYOUT


def _bytes(node: Node) -> int:
    if node.is_scalar_const:
        return 0
    return node.size * np.dtype(node.dtype).itemsize


def _flops(g: Graph, node: Node) -> int:
    if node.op is Op.MATMUL:
        a, b = (g.nodes[i] for i in node.inputs)
        return math.prod(node.shape) * a.shape[-1]
    if node.op is Op.CONV:
        w = g.nodes[node.inputs[1]]
        co = node.shape[1]
        blocked = -(-co // CONV_CHANNEL_BLOCK) * CONV_CHANNEL_BLOCK
        return math.prod(node.shape) // co * blocked * math.prod(w.shape[1:])
    return 0


@dataclasses.dataclass(frozen=True)
class ByteFlopCost:
    """Predicted seconds of a primitive graph (Note [Rewrite cost])."""

    bandwidth: float = 20e9  # bytes/s
    flops_per_s: float = 100e9
    launch: float = 2e-6  # s per kernel

    def kernels(self, g: Graph) -> list[list[int]]:
        """The fused groups of memory-bound primitives (each a list of node ids)."""
        users = g.users()
        outputs = set(g.outputs.values())
        parent = list(range(len(g.nodes)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for c, node in enumerate(g.nodes):
            if node.op not in _FUSABLE and node.op not in GroupOp.REDUCE:
                continue
            for p in node.inputs:
                if g.nodes[p].op in _FUSABLE and len(users[p]) == 1 and p not in outputs:
                    parent[find(p)] = find(c)
        groups: dict[int, list[int]] = {}
        for nid, node in enumerate(g.nodes):
            if node.op in _FUSABLE or node.op in GroupOp.REDUCE:
                groups.setdefault(find(nid), []).append(nid)
        return list(groups.values())

    def _group_cost(self, g: Graph, members: list[int], users: list[list[int]], outputs: set[int]) -> float:
        if all(g.nodes[i].op is Op.RESHAPE for i in members):
            return 0.0
        inside = set(members)
        written = sum(_bytes(g.nodes[i]) for i in members if i in outputs or any(u not in inside for u in users[i]))
        reads: dict[int, list[int]] = {}
        for i in members:
            for src in dict.fromkeys(g.nodes[i].inputs):
                if src not in inside:
                    reads.setdefault(src, []).append(i)
        read = 0
        for src, readers in reads.items():
            full = _bytes(g.nodes[src])
            if all(g.nodes[r].op is Op.SLICE for r in readers):
                read += min(full, sum(_bytes(g.nodes[r]) for r in readers))
            else:
                read += full
        return (read + written) / self.bandwidth + self.launch

    def __call__(self, g: Graph) -> float:
        users = g.users()
        outputs = set(g.outputs.values())
        total = 0.0
        for members in self.kernels(g):
            total += self._group_cost(g, members, users, outputs)
        for node in g.nodes:
            if node.op in GroupOp.LINEAR:
                moved = sum(_bytes(g.nodes[i]) for i in node.inputs) + _bytes(node)
                total += max(2 * _flops(g, node) / self.flops_per_s, moved / self.bandwidth) + self.launch
            elif node.op is Op.OPAQUE:
                moved = sum(_bytes(g.nodes[i]) for i in node.inputs) + _bytes(node)
                total += moved / self.bandwidth + self.launch
        return total

    def linear_kernel(self, g: Graph) -> float:
        """Predicted seconds of one candidate kernel built around a single linear
        primitive, its elementwise epilogue fused (Note [Register post-ops] in
        korch_gemm.h): the linear roofline with the kernel's outputs for its output,
        plus every input the linear primitive does not read (a residual) once. Through
        ``__call__``, the epilogue was a second kernel reading the linear output back,
        so a Conv with its bias and HardSwish cost two more passes over its output than
        the Conv alone: model-guided profiling never measured mobilenetv3_small's
        fused candidates, and its plan ran each conv and a generated bias+HardSwish
        kernel instead."""
        lin = [n for n in g.nodes if n.op in GroupOp.LINEAR]
        if len(lin) != 1 or any(n.op is Op.OPAQUE for n in g.nodes):
            return self(g)
        node = lin[0]
        read = sum(_bytes(g.nodes[i]) for i in node.inputs)
        mine = set(node.inputs)
        for i in node.inputs:  # a scaled input (Note [Scaled inputs]): read once, as the product
            mine |= set(g.nodes[i].inputs) if g.nodes[i].op is not Op.INPUT else set()
        extra = sum(_bytes(n) for i, n in enumerate(g.nodes) if n.op is Op.INPUT and i not in mine)
        written = sum(_bytes(g.nodes[i]) for i in dict.fromkeys(g.outputs.values()))
        return max(2 * _flops(g, node) / self.flops_per_s, (read + extra + written) / self.bandwidth) + self.launch


default_cost = ByteFlopCost()
