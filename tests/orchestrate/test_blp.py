"""Orchestration BLP: hand-built cases, brute force on random DAGs, a DNN-sized instance."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orch_cases import (
    all_convex,
    brute_force,
    brute_force_subsets,
    build_graph,
    dnn_instance,
)

from korch.ir.subgraph import make_kernel
from korch.orchestrate import OrchestrationError, check, lp_relaxation_gap, solve


def kernels(graph, sets):
    users = graph.users()
    return [make_kernel(graph, users, s) for s in sets]


def solve_checked(graph, part, cands, costs, **kw):
    orch = solve(graph, part, cands, costs, **kw)
    check(graph, part, cands, orch, costs)
    return orch


# --- hand-built -----------------------------------------------------------------------
# chain x -> a -> b -> c (ids 1, 2, 3), c is the output
CHAIN = build_graph(1, [[0], [1], [2]], [3])
CHAIN_SETS = [(1,), (2,), (3,), (1, 2), (2, 3), (1, 2, 3)]


@pytest.mark.parametrize(
    "costs, chosen, objective",
    [
        ([3, 3, 3, 4, 4, 5], [5], 5),  # fusing the whole chain wins
        ([3, 3, 3, 10, 10, 100], [0, 1, 2], 9),  # fusing loses
        ([9, 9, 3, 4, 10, 100], [2, 3], 7),  # {a, b} then {c}
        ([3, 9, 3, 10, 4, math.inf], [0, 4], 7),  # {a} then {b, c}; the full fusion is unavailable
    ],
)
def test_chain(costs, chosen, objective):
    cands = kernels(CHAIN, CHAIN_SETS)
    assert [k.outputs for k in cands] == [(1,), (2,), (3,), (2,), (3,), (3,)]
    orch = solve_checked(CHAIN, [1, 2, 3], cands, costs)
    assert orch.chosen == tuple(chosen)
    assert orch.objective == pytest.approx(objective)
    assert orch.status == "optimal" and orch.gap == 0.0 and orch.n_cuts == 0


def test_chain_order_follows_data():
    cands = kernels(CHAIN, CHAIN_SETS)
    orch = solve_checked(CHAIN, [1, 2, 3], cands, [3, 3, 3, 10, 10, 100])
    assert orch.order == (0, 1, 2)
    assert orch.warm_start == pytest.approx(9)


def test_diamond_redundancy():
    # x -> p (cheap), p -> q, p -> r; outputs q and r. Computing p inside both consumer
    # kernels ({p, q} and {p, r}) beats any disjoint cover.
    g = build_graph(1, [[0], [1], [1]], [2, 3])
    sets = [(1,), (2,), (3,), (1, 2), (1, 3), (1, 2, 3)]
    costs = [5, 7, 7, 6, 6, 100]
    cands = kernels(g, sets)
    orch = solve_checked(g, [1, 2, 3], cands, costs)
    assert orch.chosen == (3, 4)
    assert orch.objective == pytest.approx(12)
    assert orch.warm_start == pytest.approx(13)  # best without redundancy: {p, q} then {r}


def test_cycle_cut_keeps_redundant_escape():
    # x -> a -> c and x -> b -> d. {a, d} reads b and {b, c} reads a: chosen together
    # they form a cycle, yet adding a third kernel that writes a breaks it. The optimum
    # {a}, {b, c}, {a, d} computes a twice and would be lost to a plain cycle cut.
    g = build_graph(1, [[0], [0], [1], [2]], [3, 4])
    sets = [(1, 4), (2, 3), (1,), (2,), (3,), (4,), (1, 3), (2, 4)]
    costs = [1, 1, 2, 2.5, 2, 2, 3, 3]
    cands = kernels(g, sets)
    orch = solve_checked(g, [1, 2, 3, 4], cands, costs)
    assert orch.n_cuts >= 1
    assert orch.chosen == (0, 1, 2)
    assert orch.objective == pytest.approx(4)
    assert orch.order == (2, 1, 0)
    assert orch.objective == brute_force(g, [1, 2, 3, 4], cands, costs)


def test_partition_inputs_are_free_and_dead_members_skipped():
    # chain of four; partition = {b, c, d} where d is dead code (no users, not an output)
    g = build_graph(1, [[0], [1], [2], [2]], [3])
    part = [2, 3, 4]
    cands = kernels(g, [(2,), (3,), (4,), (2, 3), (2, 4)])
    orch = solve_checked(g, part, cands, [1, 1, 0, 3, 2.5])
    assert orch.chosen == (0, 1) and orch.objective == pytest.approx(2)


def test_partition_without_needed_outputs():
    g = build_graph(1, [[0], [0]], [1])
    orch = solve_checked(g, [2], kernels(g, [(2,)]), [1.0])
    assert orch.chosen == () and orch.objective == 0 and orch.status == "optimal"


def test_infeasible():
    cands = kernels(CHAIN, CHAIN_SETS)
    with pytest.raises(OrchestrationError):
        solve(CHAIN, [1, 2, 3], cands, [1, 1, math.inf, 1, math.inf, math.nan])
    with pytest.raises(ValueError):
        solve(CHAIN, [2, 3], cands, [1] * 6)  # a candidate outside the partition


# --- random DAGs against brute force ---------------------------------------------------
@st.composite
def instances(draw, max_nodes=6):
    n_in = draw(st.integers(1, 2))
    n = draw(st.integers(1, max_nodes))
    preds = []
    for i in range(n):
        avail = n_in + i
        k = draw(st.integers(1, min(2, avail)))
        preds.append(sorted(draw(st.lists(st.integers(0, avail - 1), min_size=k, max_size=k, unique=True))))
    compute = list(range(n_in, n_in + n))
    outs = draw(st.lists(st.sampled_from(compute), min_size=1, max_size=3, unique=True))
    graph = build_graph(n_in, preds, outs)
    lo = draw(st.integers(0, n - 1))
    hi = draw(st.integers(lo + 1, n))
    part = compute[lo:hi]  # an id interval is convex
    cands = all_convex(graph, part)
    costs = draw(
        st.lists(
            # cheap kernels of any size make large, overlapping choices (and cycles) likely
            st.one_of(st.integers(1, 20).map(float), st.integers(1, 3).map(float), st.just(math.inf)),
            min_size=len(cands),
            max_size=len(cands),
        )
    )
    return graph, part, cands, costs


FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(instances(max_nodes=7))
def test_random_dags_match_brute_force(inst):
    graph, part, cands, costs = inst
    best = brute_force(graph, part, cands, costs)
    if math.isinf(best):
        with pytest.raises(OrchestrationError):
            solve(graph, part, cands, costs)
        return
    orch = solve_checked(graph, part, cands, costs)
    assert orch.status == "optimal"
    assert orch.objective == pytest.approx(best)
    if orch.warm_start is not None:
        assert orch.warm_start >= orch.objective - 1e-9
    plain = solve_checked(graph, part, cands, costs, form="plain", warm_start=False)
    assert plain.objective == pytest.approx(best)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_nodes=4))
def test_brute_force_references_agree(inst):
    # the Dijkstra reference against plain enumeration of candidate subsets
    graph, part, cands, costs = inst
    best = brute_force(graph, part, cands, costs)
    assert best == brute_force_subsets(graph, part, cands, costs)
    if math.isfinite(best):
        # the warm start is the best orchestration without redundancy
        disjoint = brute_force_subsets(graph, part, cands, costs, disjoint=True)
        warm = solve(graph, part, cands, costs).warm_start
        assert (math.inf if warm is None else warm) == pytest.approx(disjoint)


# --- a DNN-sized instance --------------------------------------------------------------
def test_dnn_instance_solves_fast():
    graph, part, cands, costs = dnn_instance(blocks=40, max_size=6)
    assert 1000 <= len(cands) <= 3000
    t0 = time.perf_counter()
    orch = solve_checked(graph, part, cands, costs)
    seconds = time.perf_counter() - t0
    assert orch.status == "optimal" and orch.gap == 0.0
    assert orch.objective <= orch.warm_start + 1e-9
    assert seconds < 10
    gaps = {f: lp_relaxation_gap(graph, part, cands, costs, orch.objective, form=f) for f in ("plain", "strengthened")}
    assert gaps["strengthened"] < 0.05 < 0.5 < gaps["plain"]
    print(
        f"\n{len(part)} primitives, {len(cands)} candidates: optimal {orch.objective:.2f} "
        f"(no redundancy {orch.warm_start:.2f}) in {seconds:.2f} s, {orch.n_cuts} cuts; "
        f"LP gap plain {gaps['plain']:.1%}, strengthened {gaps['strengthened']:.1%}"
    )


def test_time_limit_falls_back_to_warm_start():
    graph, part, cands, costs = dnn_instance(blocks=10, max_size=4)
    orch = solve_checked(graph, part, cands, costs, time_limit_s=0.0)
    assert orch.status == "warm_start"
    assert orch.objective == pytest.approx(orch.warm_start)
    assert 0.0 < orch.gap <= 1.0
