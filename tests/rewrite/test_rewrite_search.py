"""The driver, the simplifier and the cost-guided search: structure and numbers."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from korch.ir import GraphBuilder, Op, assert_structural_equal, evaluate, parse_graph, print_graph, verify
from korch.rewrite import ByteFlopCost, RewriteStats, optimize_graph, simplify_graph

RTOL, ATOL = 1e-4, 1e-5


def _feed(g, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(g.nodes[i].shape).astype(g.nodes[i].dtype) for n, i in g.inputs.items()}


def _same_numbers(g1, g2, seed=0):
    feed = _feed(g1, seed)
    want, got = evaluate(g1, feed), evaluate(g2, feed)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


def _ops(g):
    return [n.op for n in g.nodes]


def test_simplify_cancels_layout_chains_and_folds_constants():
    before = parse_graph("""
    %0 = input() {'name': 'x'} : float32[2, 3, 4]
    %1 = transpose(%0) {'perm': (0, 2, 1)} : float32[2, 4, 3]
    %2 = transpose(%1) {'perm': (0, 2, 1)} : float32[2, 3, 4]
    %3 = reshape(%2) {'shape': (6, 4)} : float32[6, 4]
    %4 = reshape(%3) {'shape': (24,)} : float32[24]
    %5 = const() {'name': 'w'} : float32[24]
    %6 = const() {'value': 2.0} : float32[]
    %7 = mul(%5, %6) : float32[24]
    %8 = add(%4, %7) : float32[24]
    %9 = reshape(%8) {'shape': (24,)} : float32[24]
    output 'y' = %9
    """)
    after = simplify_graph(before)
    verify(after)
    expected = parse_graph("""
    %0 = input() {'name': 'x'} : float32[2, 3, 4]
    %1 = reshape(%0) {'shape': (24,)} : float32[24]
    %2 = const() {'name': 'c1'} : float32[24]
    %3 = add(%1, %2) : float32[24]
    output 'y' = %3
    """)
    assert_structural_equal(after, expected)
    np.testing.assert_array_equal(after.consts["c1"], before.consts["w"] * 2)
    _same_numbers(before, after)


_LAYOUT = st.sampled_from(["transpose", "reshape", "slice", "tanh"])


@settings(max_examples=40, deadline=None)
@given(
    dims=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    ops=st.lists(_LAYOUT, min_size=1, max_size=6),
    seed=st.integers(0, 1000),
)
def test_simplify_random_layout_chains(dims, ops, seed):
    """Random chains of layout primitives: simplification keeps the numbers and never grows the graph."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", tuple(dims), "float32")
    for op in ops:
        shape = b.shape(x)
        if op == "transpose":
            x = b.add(Op.TRANSPOSE, [x], perm=[int(i) for i in rng.permutation(len(shape))])
        elif op == "reshape":
            x = b.add(Op.RESHAPE, [x], shape=tuple(int(d) for d in rng.permutation(shape)))
        elif op == "slice":
            starts = [int(rng.integers(0, d)) for d in shape]
            lengths = [int(rng.integers(1, d - s + 1)) for d, s in zip(shape, starts)]
            x = b.add(Op.SLICE, [x], starts=starts, steps=[1] * len(shape), lengths=lengths)
        else:
            x = b.unary(Op.TANH, x)
    b.output("y", x)
    g = b.graph
    g2 = simplify_graph(g)
    verify(g2)
    assert len(g2) <= len(g)
    _same_numbers(g, g2, seed)


def _conv_bn(rng):
    """Conv with bias, then BatchNorm as fission writes it: (y - mean) / sqrt(var + eps) * gamma + beta."""
    b = GraphBuilder()
    x = b.input("x", (1, 4, 6, 6), "float32")
    y = b.add(
        Op.CONV,
        [x, b.const(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))],
        strides=(1, 1),
        dilations=(1, 1),
        pads=(1, 1, 1, 1),
        group=1,
    )
    y = b.binary(Op.ADD, y, b.const(rng.standard_normal((1, 8, 1, 1)).astype(np.float32)))

    def c(lo=-1.0, hi=1.0):
        return b.const(rng.uniform(lo, hi, (1, 8, 1, 1)).astype(np.float32))

    sd = b.unary(Op.SQRT, b.binary(Op.ADD, c(0.5, 2.0), b.scalar(1e-5, y)))
    z = b.binary(Op.DIV, b.binary(Op.SUB, y, c()), sd)
    b.output("z", b.binary(Op.ADD, b.binary(Op.MUL, z, c()), c()))
    return b.graph


def test_search_folds_batchnorm_into_conv():
    g = _conv_bn(np.random.default_rng(0))
    g2, stats = optimize_graph(g)
    verify(g2)
    ops = _ops(g2)
    assert ops.count(Op.CONV) == 1 and ops.count(Op.ADD) == 1
    assert not {Op.MUL, Op.DIV, Op.SUB, Op.SQRT} & set(ops)
    assert stats.applied.get("fold_scale_into_conv_bias", 0) + stats.applied.get("fold_scale_into_conv", 0) >= 1
    assert stats.cost_after < stats.cost_before and stats.failed == 0
    _same_numbers(g, g2)


def _qkv(rng, m=16, k=32):
    b = GraphBuilder()
    x = b.input("x", (m, k), "float32")
    outs = []
    for name in "qkv":
        y = b.add(Op.MATMUL, [x, b.const(rng.standard_normal((k, k)).astype(np.float32))])
        outs.append(b.binary(Op.ADD, y, b.const(rng.standard_normal((k,)).astype(np.float32))))
        b.output(name, b.unary(Op.TANH, outs[-1]))
    return b.graph


def test_search_merges_matmuls_sharing_an_input():
    g = _qkv(np.random.default_rng(1))
    g2, stats = optimize_graph(g)
    verify(g2)
    mms = [n for n in g2.nodes if n.op is Op.MATMUL]
    assert len(mms) == 1 and mms[0].shape == (16, 96)
    assert _ops(g2).count(Op.SLICE) == 3
    assert stats.applied["merge_matmul_shared_lhs"] == 2
    _same_numbers(g, g2)


def test_search_is_deterministic_and_bounded():
    g = _qkv(np.random.default_rng(2))
    runs = [optimize_graph(g, budget=20, time_limit_s=60) for _ in range(2)]
    assert print_graph(runs[0][0]) == print_graph(runs[1][0])
    assert runs[0][1].applied == runs[1][1].applied
    assert runs[0][1].steps <= 20
    g0, s0 = optimize_graph(g, budget=0)
    assert s0.steps == 0 and s0.cost_after <= s0.cost_before
    _, s1 = optimize_graph(g, time_limit_s=0.0)
    assert s1.steps == 0
    assert isinstance(s1, RewriteStats)


def test_patience_stops_early_with_the_same_answer():
    g = _qkv(np.random.default_rng(2))
    g_full, s_full = optimize_graph(g, budget=30, time_limit_s=60)
    g_pat, s_pat = optimize_graph(g, budget=30, time_limit_s=60, patience=3)
    assert s_pat.stopped in ("patience", "exhausted") and s_pat.steps <= s_full.steps
    assert s_full.stopped in ("budget", "exhausted")
    assert print_graph(g_pat) == print_graph(g_full) and s_pat.applied == s_full.applied
    _, s0 = optimize_graph(g, time_limit_s=0.0)
    assert s0.stopped == "time"


def test_nothing_applied_returns_the_input_graph():
    # a rebuilt copy would list the same nodes in another topological order, and the
    # partition (contiguous segments of that order) would change for nothing
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    b.output("y", b.unary(Op.TANH, b.unary(Op.EXP, x)))
    g2, stats = optimize_graph(b.graph)
    assert stats.applied == {} and g2 is b.graph


def test_cost_is_pluggable():
    """A cost that only counts REDUCE_SUM primitives makes the search trade them for MatMuls."""
    b = GraphBuilder()
    x = b.input("x", (4, 8), "float32")
    b.output("y", b.unary(Op.EXP, b.reduce(Op.REDUCE_SUM, b.unary(Op.TANH, x), [1])))
    g = b.graph
    g2, stats = optimize_graph(g, cost=lambda gr: float(sum(n.op is Op.REDUCE_SUM for n in gr.nodes)))
    assert Op.REDUCE_SUM not in _ops(g2) and Op.MATMUL in _ops(g2)
    assert stats.applied == {"reduce_sum_to_matmul": 1} and stats.cost_after == 0.0
    _same_numbers(g, g2)
    # and the default cost sees no reason to (same bytes, one kernel either way)
    assert ByteFlopCost()(g2) >= ByteFlopCost()(g) - 1e-12


def test_default_cost_fuses_elementwise_chains():
    cost = ByteFlopCost(bandwidth=1.0, launch=0.0)  # cost in bytes
    b = GraphBuilder()
    x = b.input("x", (10, 10), "float32")
    y = b.unary(Op.TANH, b.unary(Op.EXP, b.unary(Op.NEG, x)))
    b.output("y", y)
    assert cost(b.graph) == 2 * 400  # one fused kernel: read x, write y
    assert len(cost.kernels(b.graph)) == 1


def test_linear_kernel_cost_fuses_its_epilogue():
    """A candidate kernel around one Conv costs the Conv's roofline with its epilogue
    in registers (Note [Register post-ops]): a bias and HardSwish add only the bias's
    bytes; a residual adds its read; the whole-graph cost charges the epilogue as a
    second kernel reading the Conv's output back."""
    cost = ByteFlopCost(bandwidth=1.0, flops_per_s=1e30, launch=0.0)  # cost in bytes

    def kernel(epilogue: str):
        b = GraphBuilder()
        x = b.input("x", (1, 4, 8, 8), "float32")
        y = b.add(
            Op.CONV,
            [x, b.input("w", (8, 4, 1, 1), "float32")],
            strides=(1, 1),
            dilations=(1, 1),
            pads=(0, 0, 0, 0),
            group=1,
        )
        if epilogue != "none":
            y = b.binary(Op.ADD, y, b.input("bias", (1, 8, 1, 1), "float32"))
            hs = b.binary(Op.ADD, b.binary(Op.MUL, y, b.scalar(1 / 6, y)), b.scalar(0.5, y))
            y = b.binary(Op.MUL, y, b.binary(Op.MIN, b.binary(Op.MAX, hs, b.scalar(0.0, y)), b.scalar(1.0, y)))
        if epilogue == "residual":
            y = b.binary(Op.ADD, y, b.input("r", (1, 8, 8, 8), "float32"))
        b.output("y", y)
        return b.graph

    conv = 4 * (4 * 64 + 8 * 4 + 8 * 64)  # x, w, y
    assert cost.linear_kernel(kernel("none")) == conv
    assert cost.linear_kernel(kernel("hardswish")) == conv + 4 * 8
    assert cost.linear_kernel(kernel("residual")) == conv + 4 * 8 + 4 * 8 * 64
    assert cost(kernel("hardswish")) >= conv + 2 * 4 * 8 * 64
