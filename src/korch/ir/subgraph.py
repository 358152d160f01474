"""Candidate kernels as subgraphs of the primitive graph, and their canonical form.

Note [Kernel boundary]
~~~~~~~~~~~~~~~~~~~~~~
A candidate kernel is a convex set of compute primitives. It reads every external
node it uses (graph inputs, named constants, primitives outside the set) except
scalar constants, which it inlines. It writes every member that has a user outside
the set or is a graph output; other members stay inside the tile (true fusion).
The canonical form, ``extract``, renames external inputs ``in0..`` and outputs
``out0..`` in a fixed order, so structurally equal kernels in two models (or two
places of one model) hash the same and share one measurement.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable

import numpy as np

from korch.ir.graph import Graph, GraphBuilder
from korch.ir.ops import GroupOp, Op
from korch.ir.text import print_graph


class KernelKind(str, enum.Enum):
    """What kind of kernel a candidate is, which decides the backends that may build it."""

    MEMORY = "memory"  # memory-bound primitives only: a kernel generator's (TVM, Triton)
    LINEAR = "linear"  # one linear primitive and its epilogue: a library's
    OPAQUE = "opaque"  # an opaque primitive: onnxruntime's
    REGION = "region"  # a library region, several linear primitives (Note [Library regions])

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Kernel:
    nodes: tuple[int, ...]  # compute primitives, ascending (a topological order)
    inputs: tuple[int, ...]  # external nodes read, ascending
    outputs: tuple[int, ...]  # members written to memory, ascending


def make_kernel(graph: Graph, users: list[list[int]], nodes: Iterable[int]) -> Kernel:
    members = tuple(sorted(set(nodes)))
    mset = set(members)
    out_ids = set(graph.outputs.values())
    inputs: set[int] = set()
    for nid in members:
        for src in graph.nodes[nid].inputs:
            if src not in mset and not graph.nodes[src].is_scalar_const:
                inputs.add(src)
    outputs = [n for n in members if n in out_ids or any(u not in mset for u in users[n])]
    return Kernel(members, tuple(sorted(inputs)), tuple(outputs))


def extract(graph: Graph, kernel: Kernel) -> Graph:
    """The kernel as a standalone graph: inputs ``in{i}``, outputs ``out{j}``.

    A named constant read by the kernel becomes an INPUT whose name ends in ``_c``
    (``in{i}_c``) so backends can bake it in, while the hash ignores its values.
    """
    b = GraphBuilder()
    remap: dict[int, int] = {}
    for i, src in enumerate(kernel.inputs):
        node = graph.nodes[src]
        suffix = "_c" if node.op is Op.CONST else ""
        remap[src] = b.input(f"in{i}{suffix}", node.shape, node.dtype)
    for nid in kernel.nodes:
        node = graph.nodes[nid]
        for src in node.inputs:
            if src not in remap:
                snode = graph.nodes[src]
                assert snode.is_scalar_const, f"%{src} is outside kernel and not an input"
                remap[src] = b.const(graph.const_value(src))
        attrs = dict(node.attrs)
        if node.op is Op.OPAQUE:
            attrs.update(shape=node.shape, dtype=node.dtype)
        remap[nid] = b.add(node.op, [remap[s] for s in node.inputs], **attrs)
    for j, nid in enumerate(kernel.outputs):
        b.output(f"out{j}", remap[nid])
    return b.graph


def canonical_hash(graph: Graph, kernel: Kernel) -> str:
    return hashlib.sha256(print_graph(extract(graph, kernel)).encode()).hexdigest()[:24]


def kernel_class(graph: Graph, kernel: Kernel) -> KernelKind:
    """OPAQUE, LINEAR (a linear primitive plus epilogue) or MEMORY (generated)."""
    ops = {graph.nodes[n].op for n in kernel.nodes}
    if ops & GroupOp.OPAQUE:
        return KernelKind.OPAQUE
    if ops & GroupOp.LINEAR:
        return KernelKind.LINEAR
    return KernelKind.MEMORY


def kernel_consts(graph: Graph, kernel: Kernel) -> dict[str, np.ndarray]:
    """The values of the named constants ``kernel`` reads, by their ``extract`` names
    (``in{i}_c``): what a backend bakes into the kernel it builds."""
    out = {}
    for i, src in enumerate(kernel.inputs):
        if graph.nodes[src].op is Op.CONST:
            out[f"in{i}_c"] = graph.const_value(src)
    return out
