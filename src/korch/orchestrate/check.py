"""An independent checker for orchestrations, used by tests and under the debug setting."""

from __future__ import annotations

import math
from collections.abc import Sequence

from korch.ir.graph import Graph
from korch.ir.subgraph import Kernel
from korch.orchestrate.blp import Orchestration


def check(
    graph: Graph,
    part_nodes: Sequence[int],
    candidates: Sequence[Kernel],
    orch: Orchestration,
    costs: Sequence[float] | None = None,
) -> None:
    """Raise AssertionError unless ``orch`` is a valid orchestration of the partition.

    Recomputes everything from the graph: the partition's needed outputs, each chosen
    kernel's boundary, and a replay of ``orch.order`` in which a kernel may read only
    nodes outside the partition or members written by an earlier kernel.
    """
    part = set(part_nodes)
    users = graph.users()
    out_ids = set(graph.outputs.values())
    needed = {j for j in part if j in out_ids or any(u not in part for u in users[j])}

    assert len(set(orch.chosen)) == len(orch.chosen), f"repeated kernels in {orch.chosen}"
    assert sorted(orch.order) == sorted(orch.chosen), f"order {orch.order} is not a permutation of {orch.chosen}"
    assert all(0 <= i < len(candidates) for i in orch.chosen), f"bad index in {orch.chosen}"
    written: set[int] = set()
    for i in orch.order:
        k = candidates[i]
        members = set(k.nodes)
        assert members and members <= part, f"kernel {i} computes {sorted(members - part)} outside the partition"
        for nid in k.nodes:
            for src in graph.nodes[nid].inputs:
                if src not in members and not graph.nodes[src].is_scalar_const:
                    assert src in k.inputs, f"kernel {i} reads %{src} but does not list it as an input"
        must_write = {n for n in members if n in out_ids or any(u not in members for u in users[n])}
        assert must_write <= set(k.outputs) <= members, f"kernel {i} writes {k.outputs}, should write {must_write}"
        for src in k.inputs:
            assert src not in part or src in written, f"kernel {i} reads %{src} before any kernel writes it"
        written.update(k.outputs)
    missing = needed - written
    assert not missing, f"needed outputs {sorted(missing)} are never written"
    if costs is not None:
        total = math.fsum(costs[i] for i in orch.chosen)
        assert math.isfinite(total), "an unavailable kernel was chosen"
        assert math.isclose(total, orch.objective, rel_tol=1e-9, abs_tol=1e-9), f"{total} != {orch.objective}"
        assert orch.lower_bound <= orch.objective * (1 + 1e-9) + 1e-9
