"""Orchestration without redundant computation: a shortest path over execution states.

Note [No-redundancy shortest path]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Without redundancy the chosen kernels are disjoint and run one after another, so
after each kernel the computed members form an *execution state*: a down-closed set
``S`` (every producer inside the partition of a member of ``S`` is in ``S``). A
candidate ``k`` moves ``S`` to ``S | k`` when ``k`` is disjoint from ``S`` and every
member ``k`` reads is in ``S`` (which also makes ``S | k`` down-closed). The cheapest
path from the empty state to a state holding every needed output is the best
orchestration without redundancy: an upper bound for the BLP and its warm start.

Only the given candidates are used (states are those reachable with them). A member
``k`` reads lies in an earlier, disjoint kernel, so it has a user outside that kernel
and that kernel writes it (Note [Kernel boundary]); the path is still replayed
through ``schedule`` in case a caller's kernels write less than that rule says.

Any kernel that can move from ``S`` contains a *frontier* member (not in ``S``, all
producers in ``S``): its lowest-id node. Candidates are indexed by that node so each
state only tries the kernels that start on its frontier.
"""

from __future__ import annotations

from korch.ir.graph import Graph
from korch.orchestrate.problem import Problem, runs_in_order


def shortest_path(graph: Graph, prob: Problem, max_states: int = 200_000) -> tuple[float, list[int]] | None:
    """(cost, local kernels in execution order) of the best disjoint orchestration.

    None when the candidates admit no disjoint orchestration or the reachable states
    exceed ``max_states``.
    """
    members = sorted(prob.part)
    position = {j: b for b, j in enumerate(members)}
    bit = {j: 1 << b for b, j in enumerate(members)}
    producers = [0] * len(members)
    for b, j in enumerate(members):
        for src in graph.nodes[j].inputs:
            if src in bit:
                producers[b] |= bit[src]
    kmask = []
    rmask = []
    by_first: dict[int, list[int]] = {}
    for loc, k in enumerate(prob.kernels):
        m = 0
        for j in k.nodes:
            m |= bit[j]
        r = 0
        for j in prob.reads[loc]:
            r |= bit[j]
        kmask.append(m)
        rmask.append(r)
        by_first.setdefault(position[k.nodes[0]], []).append(loc)
    target = 0
    for j in prob.needed_outputs:
        target |= bit[j]

    dist: dict[int, float] = {0: 0.0}
    back: dict[int, tuple[int, int]] = {}
    buckets: dict[int, list[int]] = {0: [0]}
    best: int | None = None
    for size in range(len(members) + 1):
        for s in buckets.pop(size, ()):
            d = dist[s]
            if s & target == target:
                if best is None or d < dist[best]:
                    best = s
                continue  # costs are >= 0: extending a goal state never helps
            for b in range(len(members)):
                if s >> b & 1 or producers[b] & ~s:
                    continue
                for loc in by_first.get(b, ()):
                    if kmask[loc] & s or rmask[loc] & ~s:
                        continue
                    s2 = s | kmask[loc]
                    d2 = d + prob.costs[loc]
                    if s2 not in dist:
                        if len(dist) >= max_states:
                            return None
                        buckets.setdefault(s2.bit_count(), []).append(s2)
                    elif dist[s2] <= d2:
                        continue
                    dist[s2] = d2
                    back[s2] = (s, loc)
    if best is None:
        return None
    path: list[int] = []
    s = best
    while s:
        s, loc = back[s]
        path.append(loc)
    path.reverse()
    if not runs_in_order(prob, path):
        return None
    return dist[best], path
