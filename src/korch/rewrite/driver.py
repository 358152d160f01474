"""The one driver that applies rules: rebuild a graph with a match substituted.

Graphs are lists of frozen nodes in topological order, so a rewrite does not edit in
place: ``rebuild`` copies the graph through a ``GraphBuilder`` in a depth-first order
from the outputs, emitting a match's replacement in place of its roots. Copying from
the outputs is dead-code elimination and a canonical topological order at once; the
builder's hash-consing merges common subexpressions. Simplification rules (the
SIMPLIFY table: constant folding, layout cancellation) run bottom-up on every node as
it is emitted, so each graph the search sees is already simplified.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from korch.diagnostics import guarded, record
from korch.ir.graph import Graph, GraphBuilder, Node
from korch.ir.ops import GroupOp, Op
from korch.rewrite.pattern import Ctx, Match, Rule

_MAX_SIMPLIFY_DEPTH = 16


class RewriteBuilder(GraphBuilder):
    """A GraphBuilder that applies ``simplify`` rules to every node it adds."""

    def __init__(self, graph: Graph, simplify: Sequence[Rule] = (), counts: Counter | None = None):
        super().__init__(graph)
        self.simplify = tuple(simplify)
        self.counts = counts if counts is not None else Counter()
        self._depth = 0
        self._by_op: dict[Op, tuple[Rule, ...]] = {}

    def _rules_for(self, op: Op) -> tuple[Rule, ...]:
        rules = self._by_op.get(op)
        if rules is None:
            rules = tuple(r for r in self.simplify if r.root_ops is None or op in r.root_ops)
            self._by_op[op] = rules
        return rules

    def add(self, op: Op, inputs=(), **attrs: Any) -> int:
        return self.simplified(super().add(op, inputs, **attrs))

    def simplified(self, nid: int) -> int:
        """Apply the simplification rules at ``nid`` until none matches; the final id."""
        if not self.simplify or self._depth >= _MAX_SIMPLIFY_DEPTH:
            return nid
        self._depth += 1
        try:
            for _ in range(_MAX_SIMPLIFY_DEPTH):
                op = self.graph.nodes[nid].op
                if op in GroupOp.SOURCE:
                    break
                ctx = Ctx(self.graph)
                for rule in self._rules_for(op):
                    # a rule that raises is not applied here (Note [Skipped optimizations]);
                    # what a failed replacement added is dead, and dropped by ``compact``
                    try:
                        m = rule.match(ctx, nid)
                        if m is None:
                            continue
                        new = _replace(rule, self, m, lambda name, m=m: m.nodes[name])[nid]
                    except Exception as e:  # noqa: BLE001
                        record("rewrite", rule.name, e)
                        continue
                    self.counts[rule.name] += 1
                    break
                else:
                    break
                if new == nid:
                    break
                nid = new
        finally:
            self._depth -= 1
        return nid

    def copy(self, node: Node, inputs: Sequence[int], simplify: bool = True) -> int:
        """Add ``node`` (from another graph) on new ``inputs`` of the same shapes and dtypes."""
        if node.op is Op.OPAQUE or node.op is Op.INPUT:
            attrs = dict(node.attrs)
            return self.add(node.op, inputs, shape=node.shape, dtype=node.dtype, **attrs)
        # shape rules already hold (the inputs kept their shapes; a named constant's value
        # travels in ``consts``): skip inference
        new = Node(node.op, tuple(inputs), node.attrs, node.shape, node.dtype)
        nid = self._memo.get(new)
        if nid is None:
            self.graph.nodes.append(new)
            nid = len(self.graph.nodes) - 1
            self._memo[new] = nid
        return self.simplified(nid) if simplify and node.op is not Op.CONST else nid


def _replace(rule: Rule, b: GraphBuilder, m: Match, v) -> dict[int, int]:
    out = rule.replacement(b, m, v)
    if isinstance(out, dict):
        return out
    return {m.roots[0]: int(out)}


def _copy(
    graph: Graph,
    subst: Sequence[tuple[Rule, Match]],
    simplify: Sequence[Rule],
    counts: Counter,
    simplified: bool = False,
) -> Graph:
    """Copy ``graph`` from its outputs, substituting matches; see ``rebuild``.

    With ``simplified`` (``graph`` is already simplified) the simplification rules run
    only where something changed below: at nodes with a new input.
    """
    b = RewriteBuilder(Graph(consts=dict(graph.consts)), simplify, counts)
    new: dict[int, int] = {}
    plain: set[int] = set()  # new ids that are unchanged copies of old nodes (with plain inputs)
    for name, nid in graph.inputs.items():
        node = graph.nodes[nid]
        new[nid] = b.input(name, node.shape, node.dtype)
        plain.add(new[nid])
    at_root = {r: (rule, m) for rule, m in subst for r in m.roots}
    stack = [(nid, False) for nid in reversed(list(graph.outputs.values()))]
    nodes = graph.nodes
    while stack:
        nid, ready = stack.pop()
        if nid in new:
            continue
        if nid in at_root:
            rule, m = at_root[nid]
            deps: Sequence[int] = [m.nodes[name] for name in m.leaves]
        else:
            deps = nodes[nid].inputs
        if not ready:
            stack.append((nid, True))
            stack.extend((d, False) for d in reversed(deps) if d not in new)
            continue
        if nid in at_root:
            rule, m = at_root[nid]
            new.update(_replace(rule, b, m, lambda name, m=m: new[m.nodes[name]]))
            counts[rule.name] += 1
            continue
        node = nodes[nid]
        ins = [new[i] for i in deps]
        if any(
            b.graph.nodes[j].shape != nodes[i].shape or b.graph.nodes[j].dtype != nodes[i].dtype
            for i, j in zip(deps, ins)
        ):
            # a replacement changed a shape: a rule bug; infer to fail loudly (or agree)
            new[nid] = b.add(node.op, ins, **dict(node.attrs))
            continue
        unchanged = simplified and all(j in plain for j in ins)
        new[nid] = b.copy(node, ins, simplify=not unchanged)
        if unchanged or node.op in GroupOp.SOURCE:
            plain.add(new[nid])
    for name, nid in graph.outputs.items():
        b.output(name, new[nid])
    return b.graph


def compact(graph: Graph) -> Graph:
    """Dead-code elimination, canonical topological order, CSE, unused constants dropped."""
    g = _copy(graph, (), (), Counter())
    used = {n.attr("name") for n in g.nodes if n.op is Op.CONST and n.attr("name") is not None}
    g.consts = {k: v for k, v in g.consts.items() if k in used}
    return g


def rebuild(
    graph: Graph,
    subst: Sequence[tuple[Rule, Match]] = (),
    simplify: Sequence[Rule] = (),
    counts: Counter | None = None,
    simplified: bool = False,
) -> Graph:
    """``graph`` with each match's roots replaced by its rule's replacement, simplified.

    Precondition: matches do not overlap and no leaf of a match depends on one of its
    roots (rule conditions guarantee this). ``counts`` gains one per rule applied.
    ``simplified`` says ``graph`` is already simplified, so only changed nodes are tried.
    """
    counts = counts if counts is not None else Counter()
    return compact(_copy(graph, subst, simplify, counts, simplified))


def find_matches(graph: Graph, rules: Sequence[Rule]) -> Iterator[tuple[Rule, Match]]:
    """Every (rule, match) in ``graph``: rules in table order, nodes in order, first match each.

    Rule-major, so that the search, which may stop on its time limit in the middle of a
    graph's matches, meets the rules at the head of the table first: on segformer_b1
    the first graph's matches took most of the 5 s limit on a loaded machine, and the
    decode head's ``sink_pointwise_conv`` (the last node) was not reached."""
    ctx = Ctx(graph)
    compute = [nid for nid in range(len(graph.nodes)) if graph.nodes[nid].op not in GroupOp.SOURCE]
    for rule in rules:
        ops = rule.root_ops
        for nid in compute:
            if ops is not None and graph.nodes[nid].op not in ops:
                continue
            try:
                m = rule.match(ctx, nid)
            except Exception as e:  # noqa: BLE001 - a rule that raises does not match (Note [Skipped optimizations])
                record("rewrite", rule.name, e)
                continue
            if m is not None:
                yield rule, m


def apply_rule(graph: Graph, rule: Rule, root: int | None = None, simplify: Sequence[Rule] = ()) -> Graph | None:
    """``graph`` with ``rule`` applied at its first match (at ``root`` if given); None if none."""
    ctx = Ctx(graph)
    roots = [root] if root is not None else range(len(graph.nodes))
    for nid in roots:
        m = rule.match(ctx, nid)
        if m is not None:
            return rebuild(graph, [(rule, m)], simplify)
    return None


def simplify_graph(graph: Graph, rules: Sequence[Rule] | None = None, counts: Counter | None = None) -> Graph:
    """Apply the simplification rules (default: the SIMPLIFY table) everywhere, bottom-up."""
    if rules is None:
        from korch.rewrite.rules import SIMPLIFY

        rules = SIMPLIFY
    return rebuild(graph, (), rules, counts)


_DIGESTS: dict[int, tuple[np.ndarray, str]] = {}


def _digest(arr: np.ndarray) -> str:
    hit = _DIGESTS.get(id(arr))
    if hit is not None and hit[0] is arr:
        return hit[1]
    if len(_DIGESTS) > 4096:
        _DIGESTS.clear()
    d = hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]
    _DIGESTS[id(arr)] = (arr, d)
    return d


def graph_hash(graph: Graph) -> str:
    """Hash of the printed graph plus the constants' contents (names alone do not say)."""
    from korch.ir.text import print_graph

    h = hashlib.sha1(print_graph(graph).encode())
    for name in sorted(graph.consts):
        h.update(f"{name}={_digest(graph.consts[name])};".encode())
    return h.hexdigest()


def for_library(graph: Graph, rules: Sequence[Rule] | None = None, counts: Counter | None = None) -> Graph:
    """Apply the LIBRARY_LAYOUT rules greedily, one match at a time on the whole graph
    (their conditions read every user of a node, which a bottom-up pass has not yet
    built), until none matches."""
    if rules is None:
        from korch.rewrite.rules import LIBRARY_LAYOUT

        rules = LIBRARY_LAYOUT
    counts = counts if counts is not None else Counter()
    for _ in range(len(graph.nodes)):
        for rule, m in find_matches(graph, rules):
            # the first match whose replacement builds (Note [Skipped optimizations])
            one: Counter = Counter()
            new = guarded("rewrite", rule.name, rebuild, graph, [(rule, m)], (), one)
            if new is not None:
                graph = new
                counts.update(one)
                break
        else:
            break
    return graph
