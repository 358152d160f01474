"""Instances and brute-force references for the orchestration tests."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Sequence

from korch.ir.graph import Graph, Node
from korch.ir.ops import Op
from korch.ir.subgraph import Kernel, make_kernel

UNARY = (Op.EXP, Op.TANH, Op.NEG)
BINARY = (Op.ADD, Op.MUL, Op.SUB)


def build_graph(n_inputs: int, preds: Sequence[Sequence[int]], outputs: Sequence[int], shape=(4,)) -> Graph:
    """Inputs 0..n_inputs-1, then one compute node per entry of ``preds`` (1 or 2 producers)."""
    g = Graph()
    for i in range(n_inputs):
        g.nodes.append(Node(Op.INPUT, (), (("name", f"x{i}"),), shape, "float32"))
        g.inputs[f"x{i}"] = i
    for i, ps in enumerate(preds):
        op = UNARY[i % len(UNARY)] if len(ps) == 1 else BINARY[i % len(BINARY)]
        assert all(p < n_inputs + i for p in ps)
        g.nodes.append(Node(op, tuple(ps), (), shape, "float32"))
    for t, nid in enumerate(outputs):
        g.outputs[f"y{t}"] = nid
    return g


def descendants(graph: Graph) -> list[int]:
    """Bitmask of the strict descendants of each node."""
    users = graph.users()
    desc = [0] * len(graph)
    for nid in reversed(range(len(graph))):
        for u in users[nid]:
            desc[nid] |= desc[u] | (1 << u)
    return desc


def is_convex(mask: int, desc: Sequence[int]) -> bool:
    reach = 0
    m = mask
    while m:
        low = m & -m
        reach |= desc[low.bit_length() - 1]
        m ^= low
    outside = reach & ~mask
    back = 0
    while outside:
        low = outside & -outside
        back |= desc[low.bit_length() - 1]
        outside ^= low
    return back & mask == 0


def all_convex(graph: Graph, part: Sequence[int]) -> list[Kernel]:
    """Every non-empty convex subset of ``part`` as a kernel (tiny partitions only)."""
    desc, users = descendants(graph), graph.users()
    out = []
    for r in range(1, len(part) + 1):
        for sub in itertools.combinations(part, r):
            if is_convex(sum(1 << j for j in sub), desc):
                out.append(make_kernel(graph, users, sub))
    return out


def connected_convex(graph: Graph, part: Sequence[int], max_size: int) -> list[Kernel]:
    """Every weakly connected convex subset of ``part`` with at most ``max_size`` members."""
    desc, users = descendants(graph), graph.users()
    pset = set(part)
    nbrs = {j: {n for n in (*graph.nodes[j].inputs, *users[j]) if n in pset} for j in part}
    found: set[frozenset[int]] = set()
    frontier = {frozenset([j]) for j in part}
    while frontier:
        found |= frontier
        grown = set()
        for s in frontier:
            if len(s) == max_size:
                continue
            for j in set().union(*(nbrs[n] for n in s)) - s:
                t = s | {j}
                if t not in found:
                    grown.add(t)
        frontier = grown
    subsets = sorted((sorted(s) for s in found if is_convex(sum(1 << j for j in s), desc)), key=lambda s: (len(s), s))
    return [make_kernel(graph, users, s) for s in subsets]


def needed_outputs(graph: Graph, part: Sequence[int]) -> set[int]:
    pset, users, outs = set(part), graph.users(), set(graph.outputs.values())
    return {j for j in part if j in outs or any(u not in pset for u in users[j])}


def brute_force(graph: Graph, part: Sequence[int], cands: Sequence[Kernel], costs: Sequence[float]) -> float:
    """Cheapest orchestration by Dijkstra over sets of written members (costs >= 0).

    Running a kernel needs the members it reads written and adds the members it writes;
    an orchestration is a path from nothing written to every needed output written.
    """
    pos = {j: b for b, j in enumerate(sorted(part))}
    target = sum(1 << pos[j] for j in needed_outputs(graph, part))
    moves = [
        (sum(1 << pos[j] for j in k.inputs if j in pos), sum(1 << pos[j] for j in k.outputs), c)
        for k, c in zip(cands, costs)
        if math.isfinite(c)
    ]
    dist = {0: 0.0}
    heap = [(0.0, 0)]
    while heap:
        d, s = heapq.heappop(heap)
        if d > dist[s]:
            continue
        if s & target == target:
            return d
        for need, adds, c in moves:
            if need & ~s == 0 and adds & ~s:
                s2 = s | adds
                if d + c < dist.get(s2, math.inf):
                    dist[s2] = d + c
                    heapq.heappush(heap, (d + c, s2))
    return math.inf


def brute_force_subsets(
    graph: Graph, part: Sequence[int], cands: Sequence[Kernel], costs: Sequence[float], disjoint: bool = False
) -> float:
    """Cheapest orchestration by trying every subset of the available candidates
    (only subsets of pairwise disjoint kernels, no redundancy, with ``disjoint``)."""
    pset = set(part)
    target = needed_outputs(graph, part)
    avail = [i for i, c in enumerate(costs) if math.isfinite(c)]
    best = math.inf
    for r in range(len(avail) + 1):
        for sub in itertools.combinations(avail, r):
            cost = sum(costs[i] for i in sub)
            if cost >= best:
                continue
            if disjoint and sum(len(cands[i].nodes) for i in sub) != len({n for i in sub for n in cands[i].nodes}):
                continue
            written: set[int] = set()
            left = list(sub)
            progress = True
            while left and progress:
                progress = False
                for i in list(left):
                    if all(j in written for j in cands[i].inputs if j in pset):
                        written.update(cands[i].outputs)
                        left.remove(i)
                        progress = True
            if not left and target <= written:
                best = cost
    return best


def dnn_instance(blocks: int = 40, max_size: int = 6, seed: int = 0):
    """A DNN-like chain: per block a = exp(x), b = tanh(x), c = a * b, x' = c + x.

    Returns (graph, part, candidates, costs). A kernel's cost models a memory-bound
    GPU kernel: a launch, one unit per tensor read or written, a little compute per
    primitive, times noise.
    """
    preds: list[list[int]] = []
    x = 0
    for _ in range(blocks):
        base = 1 + len(preds)
        preds += [[x], [x], [base, base + 1], [base + 2, x]]
        x = base + 3
    graph = build_graph(1, preds, [x])
    part = list(range(1, len(graph)))
    cands = connected_convex(graph, part, max_size)
    rng = random.Random(seed)
    costs = [(3.0 + len(k.inputs) + len(k.outputs) + 0.2 * len(k.nodes)) * rng.uniform(0.8, 1.2) for k in cands]
    return graph, part, cands, costs
