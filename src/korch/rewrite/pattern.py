"""Rules as data: tree patterns over primitives, matches, and the ``Rule`` value.

Note [Rewrite rules]
~~~~~~~~~~~~~~~~~~~~
A rule is ``Rule(name, pattern, replacement, condition)`` plus the equation it
implements, written in its ``equation`` field so that a table reads like a list of
identities. The pieces:

* ``pattern`` — usually a tree of ``P(op, *inputs)`` nodes with ``X(name)`` leaves
  (``Alt`` for alternatives). A name bound twice must bind the same node, so
  ``P(Op.DIV, X("e"), P(Op.BROADCAST, P(Op.REDUCE_SUM, X("e"))))`` matches only a
  division of ``e`` by its own sum. Commutative ops are tried in both orders. A
  pattern may instead be a function ``(Ctx, root) -> Iterator[Match]`` for rules
  with several roots (two MatMuls sharing an input).
* ``condition(graph, match) -> bool`` — shapes, attributes and constant values the
  tree cannot say.
* ``replacement(builder, match, v) -> id | {root: id}`` — builds the right-hand side
  in a ``GraphBuilder``; ``v(name)`` is the new id of a leaf. It reads attributes and
  constant values of the matched (old) nodes through ``match``. It may read only the
  leaves, never interior pattern nodes: the driver (driver.py) emits the leaves,
  calls the replacement, and drops what became dead.

Every rule in a table is checked numerically on random instances
(tests/rewrite/test_rules.py); a rule without an instance fails that test.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from korch.ir.graph import Graph, GraphBuilder, Node
from korch.ir.ops import Op

COMMUTATIVE = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN, Op.EQUAL, Op.AND, Op.OR})


@dataclasses.dataclass(frozen=True)
class Pat:
    """One pattern node: ``ops`` None matches any op; ``inputs`` None makes it a leaf."""

    ops: frozenset[Op] | None = None
    inputs: tuple[Pattern, ...] | None = None
    name: str | None = None


@dataclasses.dataclass(frozen=True)
class Alt:
    """Matches when any alternative matches (tried in order)."""

    alts: tuple[Pattern, ...]


Pattern = Pat | Alt


def _ops(op: Op | frozenset[Op] | set[Op] | None) -> frozenset[Op] | None:
    if op is None:
        return None
    return frozenset({op}) if isinstance(op, Op) else frozenset(op)


def P(op: Op | frozenset[Op] | set[Op], *inputs: Pattern, name: str | None = None) -> Pat:
    """An interior pattern node: ``op`` applied to ``inputs`` (arity must agree)."""
    return Pat(_ops(op), tuple(inputs), name)


def X(name: str, op: Op | frozenset[Op] | set[Op] | None = None) -> Pat:
    """A leaf capturing any node (or one of ``op``) under ``name``."""
    return Pat(_ops(op), None, name)


def A(*alts: Pattern) -> Alt:
    return Alt(tuple(alts))


def _match(p: Pattern, g: Graph, nid: int, env: dict[str, int]) -> Iterator[dict[str, int]]:
    if isinstance(p, Alt):
        for alt in p.alts:
            yield from _match(alt, g, nid, env)
        return
    if p.name is not None and p.name in env:
        if env[p.name] != nid:
            return
        if p.inputs is None:
            yield env
            return
    node = g.nodes[nid]
    if p.ops is not None and node.op not in p.ops:
        return
    if p.name is not None:
        env = {**env, p.name: nid}
    if p.inputs is None:
        yield env
        return
    if len(p.inputs) != len(node.inputs):
        return
    orders = [node.inputs]
    if node.op in COMMUTATIVE and len(node.inputs) == 2 and node.inputs[0] != node.inputs[1]:
        orders.append(node.inputs[::-1])
    for ins in orders:
        yield from _match_seq(p.inputs, ins, g, env)


def _match_seq(ps: tuple[Pattern, ...], ids: tuple[int, ...], g: Graph, env: dict[str, int]):
    if not ps:
        yield env
        return
    for env2 in _match(ps[0], g, ids[0], env):
        yield from _match_seq(ps[1:], ids[1:], g, env2)


def _leaf_names(p: Pattern) -> tuple[str, ...]:
    if isinstance(p, Alt):
        return tuple(dict.fromkeys(n for a in p.alts for n in _leaf_names(a)))
    if p.inputs is None:
        return (p.name,) if p.name else ()
    return tuple(dict.fromkeys(n for q in p.inputs for n in _leaf_names(q)))


def _root_ops(p: Pattern) -> frozenset[Op] | None:
    if isinstance(p, Alt):
        sets = [_root_ops(a) for a in p.alts]
        return None if any(s is None for s in sets) else frozenset().union(*sets)  # type: ignore[arg-type]
    return p.ops


# --- matches -------------------------------------------------------------------------


class Ctx:
    """What a pattern sees: the graph, and its users computed once on demand."""

    def __init__(self, graph: Graph):
        self.graph = graph

    @functools.cached_property
    def users(self) -> list[list[int]]:
        users = self.graph.users()
        for nid in self.graph.outputs.values():
            users[nid].append(-1)  # a graph output is a use no rewrite may remove
        return users


@dataclasses.dataclass(frozen=True)
class Match:
    """A binding of a rule's names to node ids of ``graph``.

    ``roots`` are the nodes the replacement stands for (their users are redirected);
    ``leaves`` are the names the replacement may read as new ids.
    """

    graph: Graph
    roots: tuple[int, ...]
    nodes: dict[str, int]
    leaves: tuple[str, ...]

    def node(self, name: str) -> Node:
        return self.graph.nodes[self.nodes[name]]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.nodes[self.nodes[name]].shape

    def value(self, name: str) -> np.ndarray:
        """The value of a CONST leaf."""
        return self.graph.const_value(self.nodes[name])


Lookup = Callable[[str], int]
Replacement = Callable[[GraphBuilder, Match, Lookup], "int | dict[int, int]"]
Condition = Callable[[Graph, Match], bool]
PatternFn = Callable[[Ctx, int], Iterator[Match]]


def always(graph: Graph, match: Match) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Rule:
    """``name: equation``, matched by ``pattern`` and ``condition``, built by ``replacement``."""

    name: str
    pattern: Pattern | PatternFn
    replacement: Replacement
    condition: Condition = always
    equation: str = ""

    @functools.cached_property
    def root_ops(self) -> frozenset[Op] | None:
        return _root_ops(self.pattern) if isinstance(self.pattern, (Pat, Alt)) else None

    @functools.cached_property
    def leaves(self) -> tuple[str, ...]:
        return _leaf_names(self.pattern) if isinstance(self.pattern, (Pat, Alt)) else ()

    def matches(self, ctx: Ctx, nid: int) -> Iterator[Match]:
        """Every match rooted at ``nid`` that satisfies the condition."""
        g = ctx.graph
        ops = self.root_ops
        if ops is not None and g.nodes[nid].op not in ops:
            return
        if not isinstance(self.pattern, (Pat, Alt)):
            for m in self.pattern(ctx, nid):
                if self.condition(g, m):
                    yield m
            return
        seen = set()
        for env in _match(self.pattern, g, nid, {}):
            key = tuple(sorted(env.items()))
            if key in seen:
                continue
            seen.add(key)
            leaves = tuple(n for n in self.leaves if n in env)
            m = Match(g, (nid,), env, leaves)
            if self.condition(g, m):
                yield m

    def match(self, ctx: Ctx, nid: int) -> Match | None:
        """The first match rooted at ``nid`` (deterministic), or None."""
        return next(self.matches(ctx, nid), None)


# --- helpers conditions share -----------------------------------------------------------


def is_float(node: Node) -> bool:
    return node.dtype.startswith("float")


def bcast_const(g: Graph, nid: int) -> np.ndarray | None:
    """The small constant a node broadcasts, at the node's rank, or None.

    Accepts a rank-0 scalar CONST, a CONST, a RESHAPE of a CONST, and a BROADCAST of
    one of those (or of a RESHAPE of a one-element one).
    """
    node = g.nodes[nid]
    rank = len(node.shape)
    if node.op is Op.CONST:
        val = g.const_value(nid)
        return val.reshape((1,) * rank) if val.ndim == 0 else val
    if node.op is Op.BROADCAST:
        inner = bcast_const(g, node.inputs[0])
        return None if inner is None else inner.reshape(g.nodes[node.inputs[0]].shape)
    if node.op is Op.RESHAPE:
        src = node.inputs[0]
        if g.nodes[src].op is Op.CONST:
            return g.const_value(src).reshape(node.shape)
        if g.nodes[src].size == 1:
            inner = bcast_const(g, src)
            return None if inner is None else inner.reshape((1,) * rank)
    return None


def scalar_value(g: Graph, nid: int) -> Any:
    """The value of a scalar constant (rank-0, or a broadcast of one element), or None."""
    val = bcast_const(g, nid)
    if val is None or val.size != 1:
        return None
    return val.reshape(()).item()


def channel_vector(g: Graph, nid: int, axis: int, shape: tuple[int, ...]) -> np.ndarray | None:
    """A constant that varies only along ``axis`` of ``shape`` (the tensor it meets), as a
    vector of ``shape[axis]`` elements; None if ``nid`` is no such constant."""
    val = bcast_const(g, nid)
    if val is None:
        return None
    if val.size == 1:
        return np.full(shape[axis], val.reshape(()).item(), dtype=val.dtype)
    if val.ndim != len(shape):
        return None
    axis %= len(shape)
    if any(d != 1 for i, d in enumerate(val.shape) if i != axis):
        return None
    return np.broadcast_to(val.reshape(-1), (shape[axis],)).copy()


def is_last_axis_reduce(node: Node) -> bool:
    return len(node.shape) >= 1 and tuple(node.attr("axes")) == (len(node.shape) - 1,)
