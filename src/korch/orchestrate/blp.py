"""Kernel orchestration as a binary linear program, solved by HiGHS.

Note [Strengthened BLP]
~~~~~~~~~~~~~~~~~~~~~~~
Korch's BLP (seed §4) has a binary u_i per candidate, an output row per needed output
(some chosen kernel writes it) and a dependency row per (kernel k, member j it reads):
sum of u_i over writers of j >= u_k. It is correct, but its LP relaxation is weak
(~98% gap on DNN-like instances, DESIGN.md): a fraction of each writer pays for many
readers. We solve the same integer program with two additions (same integer optimum):

* a materialisation variable w_j in [0, 1] per member j some kernel reads or that is
  a needed output: sum of u_i over writers of j >= w_j, and w_j >= u_k for every
  kernel k reading j (w_j = 1 for needed outputs). A writer now pays for a member
  once, however many kernels read it.
* a cover row per needed primitive (Note [Orchestration problem]): the kernels that
  compute it sum to >= 1. Every integer solution satisfies it (a needed output is in
  a chosen kernel; a producer of a member of a chosen kernel is in that kernel or is
  read by it, hence written by a chosen kernel), the LP optimum usually not.

``form="plain"`` builds the paper's rows instead, for benchmarks only.

Note [Lazy order cuts]
~~~~~~~~~~~~~~~~~~~~~~
Neither form forbids chosen kernels that feed each other in a cycle (e.g. {a, d} and
{b, c} in a -> c, b -> d: each reads what the other writes). After each solve we
look for an order (``schedule``). If chosen kernels are stuck and the others already
do the job, the stuck ones are dropped (cost >= 0). Otherwise take a minimal *closed*
stuck set R: each k in R reads a member j whose chosen writers all lie in R (its
blocking members B). In any orchestration holding all of R, the first kernel of R to
run must read its blocking members from writers outside R, so
    sum_{k in R} u_k - sum_{i not in R, i writes some j in B} u_i <= |R| - 1
is valid, and the current solution violates it. The plain cycle cut (sum over R <=
|R| - 1) is not valid with redundancy: an extra writer outside R can break the cycle
and make all of R usable, so we keep the escape terms.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence

import highspy
import numpy as np

from korch.ir.graph import Graph
from korch.ir.subgraph import Kernel
from korch.orchestrate.problem import OrchestrationError, Problem, prepare, runs_in_order, schedule
from korch.orchestrate.states import shortest_path

Row = tuple[list[int], list[float], float, float]  # columns, coefficients, lower, upper


@dataclasses.dataclass(frozen=True)
class Orchestration:
    """The chosen candidate kernels of one partition (indices into the caller's list)."""

    chosen: tuple[int, ...]  # ascending
    order: tuple[int, ...]  # the chosen kernels in a valid execution order
    objective: float  # sum of the chosen kernels' costs
    lower_bound: float  # proven lower bound on the optimum
    gap: float  # (objective - lower_bound) / objective, 0 when proven optimal
    seconds: float  # wall time of solve(), presolve and warm start included
    status: str  # "optimal", "time_limit" (best found, gap > 0) or "warm_start" (no better found)
    n_cuts: int  # lazy order cuts added (Note [Lazy order cuts])
    warm_start: float | None  # objective of the best orchestration without redundancy


@dataclasses.dataclass
class _Model:
    n_u: int
    col_cost: list[float]
    col_lower: list[float]
    col_upper: list[float]
    rows: list[Row]
    w_col: dict[int, int]  # member -> its w column


def build_model(prob: Problem, form: str = "strengthened") -> _Model:
    """Columns and rows of the BLP; see Note [Strengthened BLP]."""
    m = len(prob.kernels)
    inf = highspy.kHighsInf
    cost, lower, upper = list(prob.costs), [0.0] * m, [1.0] * m
    rows: list[Row] = []
    w_col: dict[int, int] = {}
    if form == "plain":
        for j in prob.needed_outputs:
            rows.append((list(prob.writers[j]), [1.0] * len(prob.writers[j]), 1.0, inf))
        for k in range(m):
            for j in prob.reads[k]:
                ws = list(prob.writers[j])
                rows.append((ws + [k], [1.0] * len(ws) + [-1.0], 0.0, inf))
    elif form == "strengthened":
        outs = set(prob.needed_outputs)
        for j in sorted(outs | set(prob.readers)):
            w_col[j] = len(cost)
            cost.append(0.0)
            lower.append(1.0 if j in outs else 0.0)
            upper.append(1.0)
        for j, w in w_col.items():
            ws = list(prob.writers[j])
            rows.append((ws + [w], [1.0] * len(ws) + [-1.0], 0.0, inf))
            for k in prob.readers.get(j, ()):
                rows.append(([w, k], [1.0, -1.0], 0.0, inf))
        for j in prob.needed:
            cs = list(prob.containers[j])
            rows.append((cs, [1.0] * len(cs), 1.0, inf))
    else:
        raise ValueError(f"unknown BLP form {form!r}")
    return _Model(m, cost, lower, upper, rows, w_col)


def _add_rows(h: highspy.Highs, rows: Sequence[Row]) -> None:
    starts, index, value = [], [], []
    for cols, coefs, _, _ in rows:
        starts.append(len(index))
        index.extend(cols)
        value.extend(coefs)
    h.addRows(
        len(rows),
        np.array([r[2] for r in rows], dtype=np.float64),
        np.array([r[3] for r in rows], dtype=np.float64),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value, dtype=np.float64),
    )


def _highs(model: _Model, integer: bool, threads: int | None) -> highspy.Highs:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", int(threads or os.cpu_count() or 1))
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 0.0)
    n = len(model.col_cost)
    empty_i = np.array([], dtype=np.int32)
    h.addCols(
        n,
        np.array(model.col_cost, dtype=np.float64),
        np.array(model.col_lower, dtype=np.float64),
        np.array(model.col_upper, dtype=np.float64),
        0,
        empty_i,
        empty_i,
        np.array([], dtype=np.float64),
    )
    if integer and model.n_u:
        h.changeColsIntegrality(
            model.n_u,
            np.arange(model.n_u, dtype=np.int32),
            np.array([highspy.HighsVarType.kInteger] * model.n_u),
        )
    if model.rows:
        _add_rows(h, model.rows)
    return h


def _run(h: highspy.Highs) -> None:
    """``h.run()``; HiGHS's thread pool is process-wide and refuses a solve asking for
    another thread count than the first solve did, so rebuild the pool then."""
    if h.run() == highspy.HighsStatus.kError:
        highspy.Highs.resetGlobalScheduler(True)
        if h.run() == highspy.HighsStatus.kError:
            raise RuntimeError(f"HiGHS failed: {h.modelStatusToString(h.getModelStatus())}")


def _start_values(model: _Model, prob: Problem, chosen: Sequence[int]) -> np.ndarray:
    x = np.zeros(len(model.col_cost))
    x[list(chosen)] = 1.0
    written = {j for i in chosen for j in prob.writes[i]}
    for j, w in model.w_col.items():
        x[w] = 1.0 if j in written else 0.0
    return x


def _order_cut(prob: Problem, chosen: Sequence[int], stuck: Sequence[int]) -> Row:
    """The cut of Note [Lazy order cuts] for a stuck subset of ``chosen``."""
    chosen_writers: dict[int, set[int]] = {}
    for i in chosen:
        for j in prob.writes[i]:
            chosen_writers.setdefault(j, set()).add(i)

    def closed(xs: set[int]) -> set[int]:
        xs = set(xs)
        while True:
            drop = {k for k in xs if not any(chosen_writers.get(j, set()) <= xs for j in prob.reads[k])}
            if not drop:
                return xs
            xs -= drop

    ring = closed(set(stuck))
    assert ring, "a stuck set is closed"
    for r in sorted(ring):
        if r in ring:
            smaller = closed(ring - {r})
            if smaller:
                ring = smaller
    blocking = {j for k in ring for j in prob.reads[k] if chosen_writers.get(j, set()) <= ring}
    escape = sorted({i for j in blocking for i in prob.writers[j]} - ring)
    cols = sorted(ring) + escape
    coefs = [1.0] * len(ring) + [-1.0] * len(escape)
    return cols, coefs, -highspy.kHighsInf, float(len(ring) - 1)


def solve(
    graph: Graph,
    part_nodes: Sequence[int],
    candidates: Sequence[Kernel],
    costs: Sequence[float],
    time_limit_s: float = 60.0,
    *,
    threads: int | None = None,
    form: str = "strengthened",
    warm_start: bool = True,
) -> Orchestration:
    """The cheapest orchestration of one partition (Note [Orchestration problem]).

    Preconditions: ``part_nodes`` is a convex set of compute primitives of ``graph``;
    every candidate computes only members and has the boundary of ``make_kernel``;
    costs are >= 0 (inf or NaN: the candidate is unavailable). Proves optimality
    within ``time_limit_s`` when it can, else returns the best found (status
    "time_limit"). Raises OrchestrationError when no orchestration exists.
    ``form="plain"`` and ``warm_start=False`` exist for benchmarks.
    """
    t0 = time.perf_counter()
    prob = prepare(graph, part_nodes, candidates, costs)
    if not prob.needed_outputs:  # dead code only: nothing to run
        return Orchestration((), (), 0.0, 0.0, 0.0, time.perf_counter() - t0, "optimal", 0, 0.0)
    warm = shortest_path(graph, prob) if warm_start else None
    model = build_model(prob, form)
    h = _highs(model, integer=True, threads=threads)
    start = _start_values(model, prob, warm[1]) if warm else None
    n_cuts = 0
    result: tuple[list[int], float, str] | None = None  # order, lower bound, status
    lower_bound = -math.inf
    while True:
        remaining = time_limit_s - (time.perf_counter() - t0)
        if remaining <= 0:
            break
        h.setOptionValue("time_limit", remaining)
        if start is not None:
            h.setSolution(len(start), np.arange(len(start), dtype=np.int32), start)
        _run(h)
        status = h.getModelStatus()
        info = h.getInfo()
        if status == highspy.HighsModelStatus.kInfeasible:
            raise OrchestrationError("no orchestration of the partition exists with the given candidates")
        lower_bound = max(lower_bound, info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else -math.inf)
        if info.primal_solution_status != 2:  # no feasible point found
            break
        x = h.getSolution().col_value
        chosen = [i for i in range(model.n_u) if x[i] > 0.5]
        order, stuck = schedule(prob, chosen)
        if stuck and not runs_in_order(prob, order):
            if status != highspy.HighsModelStatus.kOptimal:
                break  # out of time: fall back to the warm start
            _add_rows(h, [_order_cut(prob, chosen, stuck)])
            n_cuts += 1
            continue
        label = "optimal" if status == highspy.HighsModelStatus.kOptimal else "time_limit"
        result = (order, lower_bound, label)
        break

    objective = lambda order: math.fsum(prob.costs[i] for i in order)
    if result is None or (result[2] != "optimal" and warm is not None and warm[0] < objective(result[0])):
        if warm is None:
            raise OrchestrationError(f"no orchestration found within {time_limit_s} s")
        result = (warm[1], lower_bound, "warm_start")
    order, lb, label = result
    obj = objective(order)
    if label == "optimal":
        lb = obj  # HiGHS proved it to its tolerances (mip_rel_gap 0)
    lb = max(lb, 0.0)  # costs are >= 0
    gap = 0.0 if obj <= 0 else max(0.0, obj - lb) / obj
    return Orchestration(
        chosen=tuple(sorted(prob.keep[i] for i in order)),
        order=tuple(prob.keep[i] for i in order),
        objective=obj,
        lower_bound=lb,
        gap=gap,
        seconds=time.perf_counter() - t0,
        status=label,
        n_cuts=n_cuts,
        warm_start=warm[0] if warm else None,
    )


def lp_relaxation(
    graph: Graph,
    part_nodes: Sequence[int],
    candidates: Sequence[Kernel],
    costs: Sequence[float],
    form: str = "strengthened",
    threads: int | None = None,
) -> float:
    """Optimum of the BLP's LP relaxation in ``form`` (benchmark only)."""
    prob = prepare(graph, part_nodes, candidates, costs)
    h = _highs(build_model(prob, form), integer=False, threads=threads)
    _run(h)
    return float(h.getInfo().objective_function_value)


def lp_relaxation_gap(
    graph: Graph,
    part_nodes: Sequence[int],
    candidates: Sequence[Kernel],
    costs: Sequence[float],
    optimum: float,
    form: str = "strengthened",
) -> float:
    """(optimum - LP bound) / optimum for ``form``; ``optimum`` from ``solve`` (benchmark only)."""
    lp = lp_relaxation(graph, part_nodes, candidates, costs, form)
    return 0.0 if optimum <= 0 else max(0.0, optimum - lp) / optimum
