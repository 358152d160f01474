"""Execution states and candidate kernels, checked against brute force on random DAGs."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from korch.identify import (
    TooManyStates,
    bits,
    candidates,
    count_states,
    execution_states,
    generatable,
    group_by_hash,
    local_dag,
)
from korch.ir.graph import GraphBuilder
from korch.ir.ops import Op
from korch.ir.subgraph import make_kernel
from korch.models.synthetic import from_edges, transformer_layer
from korch.partition import partition

OPS = [Op.EXP, Op.ADD, Op.MATMUL, Op.REDUCE_SUM, Op.BROADCAST, Op.RESHAPE, Op.TRANSPOSE, Op.OPAQUE]


@st.composite
def dags(draw, max_nodes: int = 9, with_ops: bool = False):
    n = draw(st.integers(1, max_nodes))
    preds = [[j for j in range(i) if draw(st.booleans()) and draw(st.booleans())] for i in range(n)]
    ops = [draw(st.sampled_from(OPS)) for _ in range(n)] if with_ops else None
    return from_edges(preds, ops)


def brute_force(graph):
    """(states, convex sets) of all compute primitives, as local bitsets."""
    dag = local_dag(graph, graph.compute_ids())
    anc, desc = dag.ancestors(), dag.descendants()
    states, convex = {0}, set()
    for m in range(1, 1 << dag.n):
        if all(anc[i] & ~m == 0 for i in bits(m)):
            states.add(m)
        outside = (j for j in range(dag.n) if not (m >> j) & 1)
        if not any(anc[j] & m and desc[j] & m for j in outside):
            convex.add(m)
    return dag, states, convex


@settings(max_examples=150, deadline=None)
@given(dags())
def test_states_and_candidates_match_brute_force(graph):
    dag, states, convex = brute_force(graph)
    found = execution_states(graph, graph.compute_ids())
    assert len(found) == len(set(found)) == len(states)
    assert set(found) == states
    assert [s.bit_count() for s in found] == sorted(s.bit_count() for s in found)
    kernels = candidates(graph, graph.compute_ids(), None, filter=False, states=found)
    masks = [dag.to_local(k.nodes) for k in kernels]
    assert len(masks) == len(set(masks))  # each convex set once
    assert set(masks) == convex
    users = graph.users()
    assert kernels == sorted((make_kernel(graph, users, k.nodes) for k in kernels), key=lambda k: k.nodes)


@settings(max_examples=100, deadline=None)
@given(dags(with_ops=True), st.integers(1, 5))
def test_filter_and_size_limit_agree_with_the_predicate(graph, k):
    dag, _, convex = brute_force(graph)
    nodes = graph.compute_ids()
    limited = {dag.to_local(c.nodes) for c in candidates(graph, nodes, k, filter=False)}
    assert limited == {m for m in convex if m.bit_count() <= k}
    filtered = [c.nodes for c in candidates(graph, nodes, k)]
    expected = sorted(dag.to_global(m) for m in convex if generatable(graph, dag.to_global(m), k))
    assert filtered == expected


@settings(max_examples=60, deadline=None)
@given(dags(), st.integers(1, 40))
def test_state_limit(graph, limit):
    _, states, _ = brute_force(graph)
    nodes = graph.compute_ids()
    assert count_states(graph, nodes, limit) == min(len(states), limit + 1)
    if len(states) > limit:
        with pytest.raises(TooManyStates):
            execution_states(graph, nodes, limit)
    else:
        assert len(execution_states(graph, nodes, limit)) == len(states)


def test_sources_are_rejected():
    graph = from_edges([[]])
    with pytest.raises(ValueError, match="source"):
        execution_states(graph, [0, 1])


def _linear_graph():
    """x[8,16] @ w + bias, relu-ish max, then layer-norm-like reductions and an opaque."""
    b = GraphBuilder()
    x = b.input("x", (8, 16), "float32")
    w = b.const([[0.5] * 16] * 16, "float32")
    t = b.transpose(x, (1, 0))  # 1: a layout op feeding nothing linear
    mm = b.add(Op.MATMUL, [x, w])  # 2
    bias = b.broadcast_to(b.const([1.0] * 16, "float32"), (8, 16))  # 3 reshape, 4 broadcast
    y = b.binary(Op.ADD, mm, bias)  # 5
    r = b.binary(Op.MAX, y, b.scalar(0.0, y))  # 7 (6 is the scalar)
    s = b.reduce(Op.REDUCE_SUM, r, [1])  # 8
    mm2 = b.add(Op.MATMUL, [r, w])  # 9
    op = b.add(Op.OPAQUE, [r], name="TopK", shape=(8, 16), dtype="float32")
    b.output("t", t)
    b.output("s", s)
    b.output("m", mm2)
    b.output("o", op)
    return b.graph, dict(t=t, mm=mm, bias=bias, y=y, r=r, s=s, mm2=mm2, op=op)


def test_generatable_rules():
    g, n = _linear_graph()
    reshape = g.nodes[n["bias"]].inputs[0]
    epilogue = [n["mm"], reshape, n["bias"], n["y"], n["r"]]
    assert generatable(g, epilogue)  # MatMul + bias broadcast/add + relu
    assert generatable(g, [n["mm"], n["y"]])
    assert not generatable(g, epilogue, max_kernel_size=4)
    assert not generatable(g, [*epilogue, n["s"]])  # a reduction is no epilogue
    assert not generatable(g, [n["r"], n["mm2"], n["y"]])  # the epilogue must follow the linear
    assert not generatable(g, [*epilogue, n["mm2"]])  # two linears
    assert generatable(g, [n["op"]])
    assert not generatable(g, [n["r"], n["op"]])  # opaque only alone
    assert generatable(g, [n["t"]])  # layout-only
    assert not generatable(g, [n["t"], n["y"]])  # not connected
    assert generatable(g, [reshape, n["bias"], n["y"], n["r"], n["s"]])  # memory-bound


def test_reduction_limit():
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    subs = []
    for _ in range(5):
        x = b.binary(Op.SUB, x, b.reduce(Op.REDUCE_MAX, x, [1]))
        subs.append(x)
    g = b.graph
    assert not generatable(g, g.compute_ids())  # five reductions
    assert generatable(g, [i for i in g.compute_ids() if i <= subs[3]])


def test_group_by_hash_shares_equal_linears():
    b = GraphBuilder()
    x = b.input("x", (8, 16), "float32")
    outs = []
    for i in range(3):
        w = b.const([[float(i)] * 16] * 16, "float32")
        bias = b.const([float(i + 1)] * 16, "float32")
        outs.append(b.binary(Op.ADD, b.add(Op.MATMUL, [x, w]), b.broadcast_to(bias, (8, 16))))
    b.output("y", b.add(Op.CONCAT, outs, axis=1))
    g = b.graph
    kernels = candidates(g, g.compute_ids(), 24)
    groups = group_by_hash(g, kernels)
    assert sum(len(v) for v in groups.values()) == len(kernels)
    linear_groups = [v for v in groups.values() if any(g.nodes[i].op is Op.MATMUL for i in v[0].nodes)]
    # {mm}, {mm, add}, {mm, broadcast, add}, {mm, reshape, broadcast, add}: each seen three times
    assert sorted(len(v) for v in linear_groups) == [3, 3, 3, 3]


def test_transformer_layer_structure_and_speed():
    g = transformer_layer()
    t0 = time.perf_counter()
    parts = partition(g, 400)
    total = 0
    users = g.users()
    for p in parts:
        states = execution_states(g, p, 400)
        kernels = candidates(g, p, 24, states=states, users=users)
        assert all(len(k.nodes) <= 24 for k in kernels)
        assert all(generatable(g, k.nodes) for k in kernels)
        total += len(kernels)
    elapsed = time.perf_counter() - t0
    assert len(parts) <= 4
    assert total > 300
    # Every primitive is a candidate alone, so the BLP can always cover the graph.
    singles = {k.nodes[0] for p in parts for k in candidates(g, p, 1, users=users)}
    assert singles == set(g.compute_ids())
    assert elapsed < 5.0, elapsed


@pytest.mark.parametrize("name", ["attention", "mlp", "candy_block", "segformer_block", "yolo_block", "opaque"])
def test_models_after_fission(name):
    fission = pytest.importorskip("korch.fission").fission
    load_model = pytest.importorskip("korch.frontend").load_model
    from korch import models
    from korch.ir.ops import GroupOp
    from korch.ir.subgraph import kernel_class

    g = fission(load_model(models.build(name)))
    t0 = time.perf_counter()
    parts = partition(g, 400)
    users = g.users()
    kernels = []
    for p in parts:
        kernels += candidates(g, p, 24, states=execution_states(g, p, 400), users=users)
    assert time.perf_counter() - t0 < 5.0
    assert {k.nodes[0] for k in kernels if len(k.nodes) == 1} == set(g.compute_ids())
    for k in kernels:
        ops = [g.nodes[i].op for i in k.nodes]
        if kernel_class(g, k) == "opaque":
            assert len(ops) == 1
        elif kernel_class(g, k) == "linear":
            assert sum(op in GroupOp.LINEAR for op in ops) == 1
    if name == "opaque":
        assert any(kernel_class(g, k) == "opaque" for k in kernels)
    else:
        # some linear primitive fuses with an epilogue
        assert any(kernel_class(g, k) == "linear" and len(k.nodes) > 1 for k in kernels)
