"""An executable from chosen candidates: each kernel built by its backend, buffers planned."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from korch.executable import Executable, Step, TensorSpec, plan_buffers
from korch.executable.views import view_of
from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.ir.subgraph import extract, kernel_consts
from korch.kernels.registry import get_backend
from korch.orchestrate.choose import UNMEASURED_PENALTY_US
from korch.orchestrate.plan import Candidate


def build_executable(
    graph: Graph, chosen: Sequence[Candidate], num_threads: int, cuda_graph: bool = False, native: bool = False
) -> Executable:
    """Build every chosen kernel (one ``build_many`` per backend) into an executable that
    runs them in ``chosen``'s order. Raises RuntimeError naming the kernel whose build failed.
    ``native``: runs of generated and native linear kernels become native segments
    (``korch.executable.native``)."""
    g = graph
    steps: list[Step] = []
    by_backend: dict[str, list[int]] = {}
    for i, c in enumerate(chosen):
        cost = c.cost_us if math.isfinite(c.cost_us) and c.cost_us < UNMEASURED_PENALTY_US else None
        steps.append(
            Step(
                f"k{i}_{c.hash[:8]}", c.backend, c.hash, c.kernel.nodes, c.kernel.inputs, c.kernel.outputs, cost_us=cost
            )
        )
        view = view_of(g, c.kernel.nodes) if native else None
        if view is not None:  # Note [Views in a segment]
            steps[-1].meta["view"] = view
        by_backend.setdefault(c.backend, []).append(i)
    for name, idxs in by_backend.items():
        items = [(extract(g, chosen[i].kernel), kernel_consts(g, chosen[i].kernel)) for i in idxs]
        tiles = [chosen[i].tile_config for i in idxs]
        kw = {"tile_configs": tiles} if any(t is not None for t in tiles) else {}
        built = get_backend(name).build_many(items, num_threads, **kw)
        for i, k in zip(idxs, built):
            if isinstance(k, Exception):
                raise RuntimeError(f"building chosen kernel {steps[i].name} with {name} failed: {k}")
            steps[i].kernel = k
    inputs = {name: TensorSpec(nid, g.nodes[nid].shape, g.nodes[nid].dtype) for name, nid in g.inputs.items()}
    outputs = {name: TensorSpec(nid, g.nodes[nid].shape, g.nodes[nid].dtype) for name, nid in g.outputs.items()}
    if native:
        from korch.executable.native import fuse_native

        def const_value(nid: int) -> np.ndarray | None:
            return g.const_value(nid) if g.nodes[nid].op is Op.CONST else None

        steps = fuse_native(steps, {s.node for s in outputs.values()}, const_value, num_threads)
    consts: dict[int, np.ndarray] = {}
    for st in steps:
        for src in st.inputs:
            if g.nodes[src].op is Op.CONST:
                consts[src] = g.const_value(src)
    for spec in outputs.values():
        if g.nodes[spec.node].op is Op.CONST:
            consts[spec.node] = g.const_value(spec.node)
    sizes = {i: n.size * np.dtype(n.dtype).itemsize for i, n in enumerate(g.nodes)}
    free_after, stats = plan_buffers(steps, {s.node for s in outputs.values()}, sizes)
    exe = Executable(inputs, outputs, consts, steps, free_after, stats)
    exe.cuda_graph = cuda_graph  # device executables only (Note [Device kernels])
    return exe
