"""Automatic partitioning: the cap, coverage, convexity and order of partitions."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from korch.identify import count_states
from korch.ir.ops import GroupOp
from korch.models.synthetic import from_edges, transformer_layer, wide
from korch.partition import branch_order, graph_order, partition, partition_io


def ancestors(graph) -> list[set[int]]:
    anc: list[set[int]] = []
    for node in graph.nodes:
        a: set[int] = set()
        for src in node.inputs:
            a |= {src} | anc[src]
        anc.append(a)
    return anc


def check_partitions(graph, parts, cap):
    compute = graph.compute_ids()
    flat = [n for p in parts for n in p]
    assert sorted(flat) == compute  # cover every primitive exactly once
    anc = ancestors(graph)
    where = {n: k for k, p in enumerate(parts) for n in p}
    for k, p in enumerate(parts):
        assert p == sorted(p) and p
        assert count_states(graph, p, cap) <= cap
        members = set(p)
        # convex: no outside node lies on a path between two members
        for j in compute:
            if j not in members:
                assert not (anc[j] & members and any(j in anc[m] for m in members))
        # execution in sequence: producers come from this or an earlier partition
        for n in p:
            for src in graph.nodes[n].inputs:
                if graph.nodes[src].op not in GroupOp.SOURCE:
                    assert where[src] <= k


@st.composite
def dags(draw):
    n = draw(st.integers(1, 14))
    return from_edges([[j for j in range(i) if draw(st.integers(0, 3)) == 0] for i in range(n)])


@settings(max_examples=100, deadline=None)
@given(dags(), st.integers(2, 30))
def test_random_dags(graph, cap):
    check_partitions(graph, partition(graph, cap), cap)


def test_orders_are_topological():
    g = wide(branches=5, depth=2)
    for order in (graph_order(g), branch_order(g)):
        assert sorted(order) == g.compute_ids()
        pos = {n: i for i, n in enumerate(order)}
        for n in order:
            assert all(pos[s] < pos[n] for s in g.nodes[n].inputs if s in pos)


@pytest.mark.parametrize("interleaved", [True, False])
def test_wide_graph_partitions_quickly(interleaved):
    g = wide(branches=30, depth=3, interleaved=interleaved)
    t0 = time.perf_counter()
    parts = partition(g, 400)
    assert time.perf_counter() - t0 < 2.0
    check_partitions(g, parts, 400)
    # 121 primitives; one branch (4 primitives) has 5 states, so a segment of 3.5
    # branches fits under 400: the branch order packs 14 primitives per partition.
    assert len(parts) == 9


def test_transformer_layer():
    g = transformer_layer()
    parts = partition(g, 400)
    check_partitions(g, parts, 400)
    # 4, not 3: segments end before a MatMul, not right after it (Note [Cuts before a
    # linear primitive]), and the last one holds the final bias alone
    assert len(parts) == 4
    check_partitions(g, partition(g, 50), 50)
    chain = from_edges([[i - 1] if i else [] for i in range(50)])
    assert partition(chain, 51) == [chain.compute_ids()]
    assert len(partition(chain, 50)) == 2


def test_cap_below_two_is_rejected():
    with pytest.raises(ValueError):
        partition(from_edges([[]]), 1)


def test_partition_io():
    # 0 -> 1 -> 2, 0 -> 3; output at 2 and 3 (node id = primitive index + 1)
    g = from_edges([[], [0], [1], [0]])
    assert partition_io(g, [1, 2]) == ([1, 2], [0])  # 1 feeds 4, 2 feeds 3: both outside
    assert partition_io(g, [1, 2, 3]) == ([1, 3], [0])  # 2 feeds only 3, inside
    assert partition_io(g, [3, 4]) == ([3, 4], [1, 2])  # graph outputs


def test_constants_sit_beside_their_consumer():
    """Note [Constants beside their consumer]: biases reshaped and broadcast up front
    (small ids, as fission writes them with the weights) come, in both orders, right
    before the ADD that reads them; without it the graph's order put them all first."""
    import numpy as np

    from korch.ir import GraphBuilder, Op
    from korch.partition import constants_beside_consumers

    b = GraphBuilder()
    x = b.input("x", (8, 16), "float32")
    biases = [b.broadcast_to(b.const(np.full(16, i + 1.0, np.float32)), (8, 16)) for i in range(4)]
    for i, bias in enumerate(biases):  # (distinct values: the builder shares equal constants)
        x = b.add(Op.ADD, [b.add(Op.MATMUL, [x, b.const(np.full((16, 16), i + 1.0, np.float32))]), bias])
    b.output("y", x)
    g = b.graph
    assert graph_order(g)[:2] == [2, 3]  # the first bias's reshape and broadcast, before any MatMul
    for order in (graph_order(g), branch_order(g)):
        moved = constants_beside_consumers(g, order)
        assert sorted(moved) == sorted(order)
        for n, node in enumerate(g.nodes):
            if node.op is Op.ADD:
                bc = node.inputs[1]
                reshape = g.nodes[bc].inputs[0]
                assert moved.index(n) - 1 == moved.index(bc) and moved.index(bc) - 1 == moved.index(reshape)
    check_partitions(g, partition(g, 8), 8)


def test_no_cut_between_a_linear_primitive_and_its_bias():
    """Note [Cuts before a linear primitive]: a bias's constant-only reshape and
    broadcast multiply a segment's states, so greedy segments ended right before them,
    after the MatMul they are added to; a candidate lies within one partition, so the
    MatMul then ran without its bias. Segments now end before a linear primitive."""
    import numpy as np

    from korch.ir import GraphBuilder, Op

    b = GraphBuilder()
    x = b.input("x", (8, 16), "float32")
    for i in range(12):
        w = b.const(np.full((16, 16), i + 1.0, np.float32))
        bias = b.broadcast_to(b.const(np.full(16, i + 1.0, np.float32)), (8, 16))
        y = b.add(Op.ADD, [b.add(Op.MATMUL, [x, w]), bias])
        x = b.binary(Op.MAX, y, b.scalar(0.0, y))
    b.output("y", x)
    g = b.graph
    users = g.users()
    for cap in (12, 20, 40):
        parts = partition(g, cap)
        check_partitions(g, parts, cap)
        assert len(parts) > 1
        where = {n: k for k, p in enumerate(parts) for n in p}
        for n, node in enumerate(g.nodes):
            if node.op is Op.MATMUL:
                assert all(where[u] == where[n] for u in users[n]), (cap, n)
