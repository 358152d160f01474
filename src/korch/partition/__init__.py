"""Partitioning: split the primitive graph into pieces small enough to enumerate.

Note [Automatic partitioning]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Korch's public code needs hand-written cut points; we cut automatically. A
partition is a contiguous segment of a topological order of the compute
primitives, so it is convex (a path between two members runs through positions
between them) and the partitions execute in sequence. We walk the order and make
each segment as long as its execution-state count allows (``Settings.max_states``),
finding the end by exponential then binary search: the count only grows as a
segment gains a node at either end (S ↦ S ∪ {first} embeds the states of the
shorter segment), so the property is hereditary and greedy maximal segments give
the fewest partitions for the order. Each probe counts with ``limit=max_states``,
so it costs at most that many states.

The order decides how wide segments are. The graph's own order usually follows the
model; a depth-first order (each consumer's producers finished operand by operand)
finishes one branch before starting the next, which keeps interleaved parallel
branches narrow. We try both and keep the one with fewer partitions.
"""

from __future__ import annotations

from collections.abc import Sequence

from korch.identify.states import count_states
from korch.ir.graph import Graph
from korch.ir.ops import GroupOp


def graph_order(graph: Graph) -> list[int]:
    """The compute primitives in node-id order (the graph is stored topologically)."""
    return graph.compute_ids()


def branch_order(graph: Graph) -> list[int]:
    """A topological order that finishes each operand's subgraph before the next.

    Post-order DFS over producers, started from the graph outputs, then from every
    other sink, in id order.
    """
    users = graph.users()
    roots = list(dict.fromkeys(graph.outputs.values()))
    roots += [i for i, u in enumerate(users) if not u and i not in graph.outputs.values()]
    seen: set[int] = set()
    order: list[int] = []
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter(graph.nodes[root].inputs))]
        while stack:
            nid, it = stack[-1]
            for src in it:
                if src not in seen:
                    seen.add(src)
                    stack.append((src, iter(graph.nodes[src].inputs)))
                    break
            else:
                stack.pop()
                order.append(nid)
    # Sinks cover every node; keep only compute primitives.
    return [n for n in order if graph.nodes[n].op not in GroupOp.SOURCE]


def segment(graph: Graph, order: Sequence[int], max_states: int) -> list[list[int]]:
    """Greedy maximal segments of ``order`` with at most ``max_states`` states each."""
    if max_states < 2:
        raise ValueError("max_states must be at least 2 (one primitive has two states)")
    fits = lambda a, b: count_states(graph, order[a:b], max_states) <= max_states
    parts: list[list[int]] = []
    start, n = 0, len(order)
    while start < n:
        good, step = start + 1, 1  # one primitive always fits
        bad = n + 1
        while good < n:  # exponential probe
            probe = min(start + 2 * step, n)
            if fits(start, probe):
                good, step = probe, 2 * step
            else:
                bad = probe
                break
        while bad - good > 1:  # binary search in (good, bad)
            mid = (good + bad) // 2
            if fits(start, mid):
                good = mid
            else:
                bad = mid
        parts.append(sorted(order[start:good]))
        start = good
    return parts


def partition(graph: Graph, max_states: int) -> list[list[int]]:
    """Split the compute primitives into partitions of at most ``max_states`` states.

    Returns lists of node ids (each ascending); concatenated in the returned order
    they form a topological order, and each partition is convex. See Note
    [Automatic partitioning].
    """
    best: list[list[int]] | None = None
    for order in (graph_order(graph), branch_order(graph)):
        parts = segment(graph, order, max_states)
        if best is None or len(parts) < len(best):
            best = parts
    assert best is not None
    return best


def partition_io(
    graph: Graph, part: Sequence[int], users: list[list[int]] | None = None
) -> tuple[list[int], list[int]]:
    """(needed outputs, external inputs) of a partition, both ascending.

    Needed outputs are members that are graph outputs or have users outside the
    partition; external inputs are non-members the members read, scalar constants
    excepted (kernels inline them, Note [Kernel boundary]).
    """
    if users is None:
        users = graph.users()
    members = set(part)
    out_ids = set(graph.outputs.values())
    needed = [n for n in sorted(members) if n in out_ids or any(u not in members for u in users[n])]
    external = {
        src
        for n in members
        for src in graph.nodes[n].inputs
        if src not in members and not graph.nodes[src].is_scalar_const
    }
    return needed, sorted(external)


__all__ = ["branch_order", "graph_order", "partition", "partition_io", "segment"]
