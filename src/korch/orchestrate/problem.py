"""The orchestration problem of one partition, in index form.

Note [Orchestration problem]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A partition ``P`` is a convex set of compute primitives that runs after every earlier
partition, so a node outside ``P`` is available for free. Its *needed outputs* ``T``
are the members that are graph outputs or have a user outside ``P``; its *needed
primitives* are ``T`` and their ancestors inside ``P`` (convexity keeps every path
between two members inside ``P``). A chosen kernel reads ``k.inputs`` and writes
``k.outputs`` (Note [Kernel boundary]); an orchestration is a set of candidates that
writes every needed output and writes every member some chosen kernel reads, in an
order where each kernel runs after a writer of each member it reads. A primitive may
be computed by several chosen kernels (redundant computation).

Every needed output has a user outside ``P``, hence outside any kernel, so a kernel
that contains it writes it: for needed outputs "computed" and "written" coincide.

Presolve drops candidates that cannot appear in any orchestration: a non-finite cost
(no backend could build it), a member input that no surviving candidate writes, or
nothing written that is a needed output or read by a surviving candidate (repeated
to a fixpoint). Note that a kernel without any needed primitive can still matter: it
may write a member that a kernel carrying dead members along reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from korch.errors import KorchError
from korch.ir.graph import Graph
from korch.ir.subgraph import Kernel


class OrchestrationError(KorchError):
    """No set of the given candidate kernels computes the partition's outputs."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """Presolved problem. Kernels are numbered 0..m-1 locally; ``keep`` maps to callers'."""

    part: frozenset[int]
    needed_outputs: tuple[int, ...]  # T, ascending
    needed: tuple[int, ...]  # T and its ancestors inside the partition, ascending
    keep: tuple[int, ...]  # local kernel index -> candidate index
    kernels: tuple[Kernel, ...]  # local kernel index -> kernel
    costs: tuple[float, ...]
    reads: tuple[tuple[int, ...], ...]  # members of the partition each kernel reads
    writes: tuple[tuple[int, ...], ...]  # members of the partition each kernel writes
    writers: dict[int, tuple[int, ...]]  # member -> local kernels writing it
    readers: dict[int, tuple[int, ...]]  # member -> local kernels reading it
    containers: dict[int, tuple[int, ...]]  # needed primitive -> local kernels computing it


def needed_sets(graph: Graph, part: frozenset[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(needed outputs, needed primitives) of a partition; see Note [Orchestration problem]."""
    users = graph.users()
    out_ids = set(graph.outputs.values())
    outs = sorted(j for j in part if j in out_ids or any(u not in part for u in users[j]))
    needed = set(outs)
    stack = list(outs)
    while stack:
        for src in graph.nodes[stack.pop()].inputs:
            if src in part and src not in needed:
                needed.add(src)
                stack.append(src)
    return tuple(outs), tuple(sorted(needed))


def prepare(graph: Graph, part_nodes: Sequence[int], candidates: Sequence[Kernel], costs: Sequence[float]) -> Problem:
    """Index and presolve. Raises ValueError on malformed input, OrchestrationError if infeasible."""
    if len(candidates) != len(costs):
        raise ValueError(f"{len(candidates)} candidates but {len(costs)} costs")
    part = frozenset(int(j) for j in part_nodes)
    outs, needed = needed_sets(graph, part)
    for i, (k, c) in enumerate(zip(candidates, costs)):
        if not set(k.nodes) <= part:
            raise ValueError(f"candidate {i} computes nodes outside the partition: {sorted(set(k.nodes) - part)}")
        if c < 0:
            raise ValueError(f"candidate {i} has a negative cost {c}")
    alive = [i for i, (k, c) in enumerate(zip(candidates, costs)) if math.isfinite(c) and k.nodes]
    while True:
        written = {j for i in alive for j in candidates[i].outputs}
        kept = [i for i in alive if all(j in written for j in candidates[i].inputs if j in part)]
        wanted = set(outs).union(*(candidates[i].inputs for i in kept))
        kept = [i for i in kept if wanted.intersection(candidates[i].outputs)]
        if len(kept) == len(alive):
            break
        alive = kept
    missing = [j for j in outs if j not in written]
    if missing:
        raise OrchestrationError(f"no available candidate kernel writes needed output(s) {missing}")

    kernels = tuple(candidates[i] for i in alive)
    reads = tuple(tuple(j for j in k.inputs if j in part) for k in kernels)
    writes = tuple(tuple(j for j in k.outputs if j in part) for k in kernels)
    writers: dict[int, list[int]] = {}
    readers: dict[int, list[int]] = {}
    containers: dict[int, list[int]] = {j: [] for j in needed}
    for loc, k in enumerate(kernels):
        for j in writes[loc]:
            writers.setdefault(j, []).append(loc)
        for j in reads[loc]:
            readers.setdefault(j, []).append(loc)
        for j in k.nodes:
            if j in containers:
                containers[j].append(loc)
    return Problem(
        part=part,
        needed_outputs=outs,
        needed=needed,
        keep=tuple(alive),
        kernels=kernels,
        costs=tuple(float(costs[i]) for i in alive),
        reads=reads,
        writes=writes,
        writers={j: tuple(v) for j, v in writers.items()},
        readers={j: tuple(v) for j, v in readers.items()},
        containers={j: tuple(v) for j, v in containers.items()},
    )


def schedule(prob: Problem, chosen: Sequence[int]) -> tuple[list[int], list[int]]:
    """Order local kernels so each runs after a writer of every member it reads.

    A kernel becomes runnable once each member it reads has been written by *some*
    earlier kernel (with redundancy there may be several writers; any will do), and
    stays runnable, so running every runnable kernel greedily finds a valid order of
    the largest runnable subset. Returns (order, stuck): ``stuck`` is empty iff the
    whole set admits an order.
    """
    written: set[int] = set()
    left = sorted(set(chosen), key=lambda i: (prob.kernels[i].nodes[0], i))
    order: list[int] = []
    progress = True
    while left and progress:
        progress = False
        rest = []
        for i in left:
            if all(j in written for j in prob.reads[i]):
                order.append(i)
                written.update(prob.writes[i])
                progress = True
            else:
                rest.append(i)
        left = rest
    return order, left


def runs_in_order(prob: Problem, order: Sequence[int]) -> bool:
    """Whether running ``order`` reads only written members and writes every needed output."""
    written: set[int] = set()
    for i in order:
        if not all(j in written for j in prob.reads[i]):
            return False
        written.update(prob.writes[i])
    return all(j in written for j in prob.needed_outputs)
