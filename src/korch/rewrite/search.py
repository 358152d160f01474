"""TASO's cost-guided backtracking search over rewritten graphs.

Note [Rewrite search]
~~~~~~~~~~~~~~~~~~~~~
A priority queue holds graphs by cost (ties by discovery order, so the search is
deterministic). Each step pops the cheapest graph and applies every SEARCH rule at
every match (driver.find_matches), simplifying each result (the SIMPLIFY table). A new
graph enters the queue when its hash (korch.ir.print_graph text plus constant
contents) is new and its cost is below ``alpha`` times the best cost so far: alpha > 1
admits rewrites that make the graph slightly worse, which is how the search gets past
enabling steps (``div_const_to_mul`` before a fold into Conv weights). The best graph
ever seen is the answer.

The search runs on the whole graph, not per partition: rewrites such as merging two
MatMuls or moving a scale across a MatMul cross the partition cuts, and partitioning
comes after rewriting in the pipeline. Its time is bounded by ``budget`` (popped
graphs; deterministic), ``patience`` (stop after that many pops in a row found nothing
better; deterministic) and ``time_limit_s`` (wall clock; when it is what stops the
search, the result depends on the machine's speed and load, and a second optimize of
the same model may produce other kernels to measure). On the test models the best
graph turns up within the first 8 pops, so the pipeline passes a small patience and
the time limit is only a safety net.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence

from korch.diagnostics import guarded
from korch.ir.graph import Graph
from korch.rewrite.cost import default_cost
from korch.rewrite.driver import find_matches, graph_hash, rebuild
from korch.rewrite.pattern import Rule

log = logging.getLogger("korch.rewrite")

Cost = Callable[[Graph], float]


@dataclasses.dataclass
class RewriteStats:
    """What the search did.

    ``applied`` counts the rules on the path to the returned graph, simplifications
    (const_fold, layout) included; costs are in the cost function's unit (seconds for
    the default).
    """

    applied: dict[str, int]
    cost_before: float
    cost_after: float
    steps: int
    seconds: float
    explored: int = 0  # distinct graphs costed
    failed: int = 0  # replacements that raised (a rule bug; logged)
    stopped: str = ""  # what ended the search: exhausted, budget, patience or time


def optimize_graph(
    graph: Graph,
    cost: Cost | None = None,
    alpha: float = 1.05,
    budget: int = 100,
    time_limit_s: float = 10.0,
    rules: Sequence[Rule] | None = None,
    simplify: Sequence[Rule] | None = None,
    patience: int | None = None,
) -> tuple[Graph, RewriteStats]:
    """Rewrite ``graph`` to lower ``cost`` (Note [Rewrite search]).

    Precondition: ``graph`` is a verified primitive graph. Returns an equivalent graph
    (never costlier than the input under ``cost``) and the statistics. ``rules``
    defaults to the SEARCH table, ``simplify`` to the SIMPLIFY table; pass ``()`` to
    turn either off. ``patience``: stop after that many pops in a row without a new
    best graph (None: no such limit).
    """
    from korch.rewrite.rules import SEARCH, SIMPLIFY

    cost = cost or default_cost
    rules = SEARCH if rules is None else tuple(rules)
    simplify = SIMPLIFY if simplify is None else tuple(simplify)
    start = time.perf_counter()
    deadline = start + time_limit_s

    cost_before = cost(graph)
    counts0: Counter = Counter()
    g0 = rebuild(graph, (), simplify, counts0)
    c0 = cost(g0)
    best, best_cost, best_counts = graph, cost_before, Counter()
    if counts0 and c0 <= cost_before:
        # g0 is a rebuilt copy even when nothing simplified, with its nodes in another
        # topological order, which changes the partition downstream; keep the input then
        best, best_cost, best_counts = g0, c0, counts0
    seen = {graph_hash(g0)}
    order = 0
    queue: list[tuple[float, int, Graph, Counter]] = [(c0, order, g0, counts0)]
    steps = failed = since_best = 0
    stopped = "exhausted"
    while queue:
        if steps >= budget:
            stopped = "budget"
            break
        if patience is not None and since_best >= patience:
            stopped = "patience"
            break
        if time.perf_counter() >= deadline:
            stopped = "time"
            break
        c, _, g, counts = heapq.heappop(queue)
        steps += 1
        since_best += 1
        for rule, m in find_matches(g, rules):
            if time.perf_counter() >= deadline:
                stopped = "time"
                break
            new_counts = Counter(counts)
            # a rule whose replacement raises is skipped here (Note [Skipped optimizations])
            g2 = guarded("rewrite", rule.name, rebuild, g, [(rule, m)], simplify, new_counts, simplified=True)
            if g2 is None:
                failed += 1
                continue
            h = graph_hash(g2)
            if h in seen:
                continue
            seen.add(h)
            c2 = cost(g2)
            if c2 < best_cost:
                best, best_cost, best_counts = g2, c2, new_counts
                since_best = 0
            if c2 < alpha * best_cost:
                order += 1
                heapq.heappush(queue, (c2, order, g2, new_counts))
        if stopped == "time":
            break
    stats = RewriteStats(
        applied=dict(sorted(best_counts.items())),
        cost_before=cost_before,
        cost_after=best_cost,
        steps=steps,
        seconds=time.perf_counter() - start,
        explored=len(seen),
        failed=failed,
        stopped=stopped,
    )
    log.info(
        "rewrite: cost %.3g -> %.3g s in %d steps (%.2f s, stopped by %s), applied %s",
        cost_before,
        best_cost,
        steps,
        stats.seconds,
        stats.stopped,
        stats.applied,
    )
    return best, stats
