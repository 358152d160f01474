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

Note [Constants beside their consumer]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A primitive computed from constants alone (a bias reshaped and broadcast to a
MatMul's output shape) has a small id, fission having written it with the weights, so
in the graph's order it sat partitions before the MatMul that reads it: no candidate
could hold it, and it ran as a kernel of its own writing the broadcast tensor out
(bert_mini: 14 us a layer), which its consumer then read instead of the bias. Both
orders place such a primitive right before its first consumer, so a segment holds it
with that consumer unless the segment ends between the two. (Ending segments only
after such primitives also made transformer_layer's partitions 3 -> 4: not done.)

Note [Cuts before a linear primitive]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A constant-only chain placed before its consumer is a branch of its own in the
segment, and a branch multiplies the state count (each of its states combines with
each of the rest's). So greedy segments ended, over and over, right before a bias's
reshape and broadcast, that is right after the Conv or MatMul the bias is added to:
7 of mobilenetv3_small's 7 cuts, 12 of deit_tiny's 13, 8 of 8 in efficientnet_b0
and regnety_002. A candidate lies within one partition, so each of those linear
primitives ran alone, and its bias (and activation) as a generated kernel reading
its output back. A segment now ends right before a linear primitive, where the cut
costs no fusion (a candidate holds one linear primitive, and the native backend takes
nothing before it but a conv's scale or pad, which only it reads: no cut there), the
last such place in the segment's second half. Where there is none, a segment that
would end with a linear primitive (and constant-only primitives after it) ends before
it. Either way the segment is shorter, so it still fits (its states only shrink).
More partitions may result (transformer_layer: 3 -> 4, deit_tiny: 14 -> 19). With
the same database, alternating the executables in one process (benchmarks/exe_ab.py,
composed-only optimizations): mobilenetv3_small 0.94x the time, regnety_002 0.89x,
efficientnet_b0 0.98x, deit_tiny 0.97x.
"""

from __future__ import annotations

from collections.abc import Sequence

from korch.identify.states import count_states
from korch.ir.graph import Graph
from korch.ir.ops import GroupOp, Op


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


def constant_only(graph: Graph, order: Sequence[int]) -> set[int]:
    """The primitives of ``order`` computed from constants alone."""
    nodes, const_only = graph.nodes, set()
    for n in sorted(order):
        if all(nodes[i].op is Op.CONST or i in const_only for i in nodes[n].inputs):
            const_only.add(n)
    return const_only


def constants_beside_consumers(graph: Graph, order: Sequence[int]) -> list[int]:
    """``order`` with each primitive computed from constants alone moved right before
    its first consumer (Note [Constants beside their consumer])."""
    nodes = graph.nodes
    const_only = constant_only(graph, order)
    if not const_only:
        return list(order)
    placed: set[int] = set()
    out: list[int] = []

    def place(n: int) -> None:  # n's constant-only producers first, then n
        for i in nodes[n].inputs:
            if i in const_only and i not in placed:
                place(i)
        placed.add(n)
        out.append(n)

    for n in order:
        if n not in const_only:
            place(n)
    for n in order:  # read by nothing but graph outputs: where they were, at the end
        if n not in placed:
            place(n)
    return out


def segment(graph: Graph, order: Sequence[int], max_states: int) -> list[list[int]]:
    """Greedy maximal segments of ``order`` with at most ``max_states`` states each."""
    if max_states < 2:
        raise ValueError("max_states must be at least 2 (one primitive has two states)")
    fits = lambda a, b: count_states(graph, order[a:b], max_states) <= max_states
    users, const_only = graph.users(), constant_only(graph, order)
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
        good = _before_linear(graph, users, order, start, good, const_only)
        parts.append(sorted(order[start:good]))
        start = good
    return parts


def _clean_cut(graph: Graph, users: list[list[int]], n: int) -> bool:
    """Whether a segment may end right before primitive ``n`` losing no fusion: ``n``
    is linear, and none of its operands is a prologue a candidate takes with it (a
    scale or pad read by ``n`` alone: Notes [Scaled inputs], [Reflected padding])."""
    node = graph.nodes[n]
    if node.op not in GroupOp.LINEAR:
        return False
    return not any(graph.nodes[i].op in (Op.MUL, Op.PAD) and users[i] == [n] for i in node.inputs)


def _before_linear(
    graph: Graph, users: list[list[int]], order: Sequence[int], start: int, end: int, const_only: set[int]
) -> int:
    """Where a segment ``order[start:end]`` that is not the last ends instead (Note
    [Cuts before a linear primitive]): right before the last linear primitive in its
    second half that is a clean cut; else, where it would end with a linear primitive
    (and constant-only primitives after it), before that one; else ``end``."""
    if end >= len(order):
        return end
    for e in range(end, start + (end - start) // 2, -1):
        if _clean_cut(graph, users, order[e]):
            return e
    e = end
    while e - 1 > start and order[e - 1] in const_only:
        e -= 1
    if e - 1 > start and graph.nodes[order[e - 1]].op in GroupOp.LINEAR:
        return e - 1
    return end


def partition(graph: Graph, max_states: int) -> list[list[int]]:
    """Split the compute primitives into partitions of at most ``max_states`` states.

    Returns lists of node ids (each ascending); concatenated in the returned order
    they form a topological order, and each partition is convex. See Note
    [Automatic partitioning].
    """
    best: list[list[int]] | None = None
    for order in (graph_order(graph), branch_order(graph)):
        parts = segment(graph, constants_beside_consumers(graph, order), max_states)
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
