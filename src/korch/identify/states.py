"""Execution states of a partition, as bitsets over its local index.

Note [Execution states]
~~~~~~~~~~~~~~~~~~~~~~~
An execution state is a down-closed set of compute primitives: if a primitive is in
it, so are all its compute producers *within the considered node set* (producers
outside the set, and sources, count as already available). The considered node set
is a partition, which is convex, so "down-closed within it" is the right notion.

We number the set's primitives 0..n-1 in ascending node id (a topological order,
since a Graph is stored topologically) and represent a set of them as a Python int
whose bit i stands for local primitive i. Bit operations on ints are fast in
CPython, and ints hash, so a plain ``set`` memoises visited states.

States are enumerated breadth-first from the empty state: from a state, add any
primitive whose producers are all in it ("ready"). The ready mask is carried with
each state and updated from the added primitive's users only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from korch.ir.graph import Graph
from korch.ir.ops import GroupOp


class TooManyStates(Exception):
    """Raised by ``execution_states`` when a node set has more states than ``limit``."""

    def __init__(self, limit: int):
        super().__init__(f"more than {limit} execution states")
        self.limit = limit


@dataclasses.dataclass(frozen=True)
class LocalDag:
    """A node set's dependency structure over local indices (bit i = ``nodes[i]``)."""

    nodes: tuple[int, ...]  # global ids, ascending
    preds: tuple[int, ...]  # preds[i]: mask of local producers of i
    succs: tuple[int, ...]  # succs[i]: mask of local users of i

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def full(self) -> int:
        return (1 << len(self.nodes)) - 1

    def to_global(self, mask: int) -> tuple[int, ...]:
        return tuple(self.nodes[i] for i in bits(mask))

    def to_local(self, ids: Sequence[int]) -> int:
        index = {g: i for i, g in enumerate(self.nodes)}
        mask = 0
        for g in ids:
            mask |= 1 << index[g]
        return mask

    def initial_ready(self, state: int = 0) -> int:
        """Primitives outside ``state`` whose local producers are all in it."""
        ready = 0
        for i, p in enumerate(self.preds):
            if not (state >> i) & 1 and p & ~state == 0:
                ready |= 1 << i
        return ready

    def descendants(self) -> list[int]:
        """desc[i]: mask of strict local descendants of i."""
        desc = [0] * self.n
        for i in range(self.n - 1, -1, -1):
            d = 0
            for u in bits(self.succs[i]):
                d |= (1 << u) | desc[u]
            desc[i] = d
        return desc

    def ancestors(self) -> list[int]:
        """anc[i]: mask of strict local ancestors of i."""
        anc = [0] * self.n
        for i in range(self.n):
            a = 0
            for p in bits(self.preds[i]):
                a |= (1 << p) | anc[p]
            anc[i] = a
        return anc


def bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def local_dag(graph: Graph, nodes: Sequence[int]) -> LocalDag:
    """The local view of ``nodes``, which must all be compute primitives of ``graph``."""
    ordered = tuple(sorted(set(nodes)))
    index = {g: i for i, g in enumerate(ordered)}
    preds = [0] * len(ordered)
    succs = [0] * len(ordered)
    for i, g in enumerate(ordered):
        node = graph.nodes[g]
        if node.op in GroupOp.SOURCE:
            raise ValueError(f"%{g} is a source ({node.op.value}); states hold compute primitives only")
        for src in node.inputs:
            j = index.get(src)
            if j is not None:
                preds[i] |= 1 << j
                succs[j] |= 1 << i
    return LocalDag(ordered, tuple(preds), tuple(succs))


def _enumerate(dag: LocalDag, limit: int | None) -> list[int] | None:
    """All states in nondecreasing size order, or None once there are more than ``limit``."""
    preds, succs = dag.preds, dag.succs
    start_ready = dag.initial_ready()
    seen = {0}
    out = [0]
    frontier = [(0, start_ready)]
    while frontier:  # one BFS layer per state size
        layer: list[tuple[int, int]] = []
        for state, ready in frontier:
            r = ready
            while r:
                low = r & -r
                r ^= low
                new = state | low
                if new in seen:
                    continue
                seen.add(new)
                out.append(new)
                if limit is not None and len(out) > limit:
                    return None
                new_ready = ready ^ low
                for u in bits(succs[low.bit_length() - 1]):
                    if preds[u] & ~new == 0:
                        new_ready |= 1 << u
                layer.append((new, new_ready))
        frontier = layer
    return out


def execution_states(graph: Graph, nodes: Sequence[int], limit: int | None = None) -> list[int]:
    """Every execution state of ``nodes`` as a bitset over ``local_dag(graph, nodes)``.

    Precondition: ``nodes`` are compute primitives (no INPUT/CONST). The empty state
    comes first and states come in nondecreasing size. Raises ``TooManyStates`` when
    there are more than ``limit``.
    """
    out = _enumerate(local_dag(graph, nodes), limit)
    if out is None:
        assert limit is not None
        raise TooManyStates(limit)
    return out


def count_states(graph: Graph, nodes: Sequence[int], limit: int) -> int:
    """The number of execution states of ``nodes``, or ``limit + 1`` if it exceeds ``limit``.

    Costs at most ``limit`` states of work, which is what lets partitioning probe
    many candidate segments cheaply.
    """
    out = _enumerate(local_dag(graph, nodes), limit)
    return limit + 1 if out is None else len(out)
