"""The TVM memory-bound kernel generator against the numpy reference interpreter.

Numbers: every primitive and the fused patterns (softmax, layernorm, instance norm,
GELU, max-pool, a two-output kernel) match ``korch.ir.evaluate`` within rtol 1e-5,
atol 1e-6. Structure: the fused softmax is one parallel loop with its reductions
inside. All kernels of the table are compiled in one ``build_many`` call (one LLVM
run) to keep the suite fast.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from korch.ir import GraphBuilder, Op, evaluate

tvm = pytest.importorskip("tvm")

from korch.kernels.base import aligned_empty  # noqa: E402
from korch.kernels.registry import get_backend  # noqa: E402
from korch.kernels.tvm.backend import TvmBackend, prepare  # noqa: E402
from korch.kernels.tvm.tiling import TileConfig, default_tile_config, model_tile_config, root_nests  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
# float32 sums are added in another order than numpy's pairwise sum: results near zero
# after cancellation differ by a few ulps of the summands, not of the result
ATOL_SUM = 2e-5
THREADS = 2
F = "float32"


def _unary(op, shape=(8, 40), **attrs):
    def build(b):
        x = b.input("in0", shape, F)
        return [b.add(op, [x], **attrs)]

    return build


def _binary(op, dtype=F, shape=(8, 40)):
    def build(b):
        x, y = b.input("in0", shape, dtype), b.input("in1", shape, dtype)
        return [b.add(op, [x, y])]

    return build


def _layout(op, in_shape, dtype=F, **attrs):
    def build(b):
        return [b.add(op, [b.input("in0", in_shape, dtype)], **attrs)]

    return build


def _softmax(b, shape=(64, 384)):
    x = b.input("in0", shape, F)
    m = b.reduce(Op.REDUCE_MAX, x, [-1])
    e = b.unary(Op.EXP, b.binary(Op.SUB, x, m))
    return [b.binary(Op.DIV, e, b.reduce(Op.REDUCE_SUM, e, [-1]))]


def _norm(b, x, axes, n):
    mu = b.binary(Op.MUL, b.reduce(Op.REDUCE_SUM, x, axes), b.scalar(1.0 / n, x))
    d = b.binary(Op.SUB, x, mu)
    var = b.binary(Op.MUL, b.reduce(Op.REDUCE_SUM, b.binary(Op.MUL, d, d), axes), b.scalar(1.0 / n, x))
    return b.binary(Op.DIV, d, b.unary(Op.SQRT, b.binary(Op.ADD, var, b.scalar(1e-5, x))))


def _layernorm(b):
    x = b.input("in0", (2, 16, 96), F)
    g, beta = b.input("in1_c", (96,), F), b.input("in2_c", (96,), F)
    return [b.binary(Op.ADD, b.binary(Op.MUL, _norm(b, x, [2], 96), g), beta)]


def _instance_norm(b):
    x = b.input("in0", (2, 8, 12, 12), F)
    return [_norm(b, x, [2, 3], 144)]


def _instance_norm_reshaped(b):
    # the shape fission produces for InstanceNorm: (N, C, H*W) rows
    x = b.input("in0", (2, 8, 12, 12), F)
    r = b.reshape(x, (2, 8, 144))
    return [b.reshape(_norm(b, r, [2], 144), (2, 8, 12, 12))]


def _gelu(b):
    x = b.input("in0", (16, 256), F)
    e = b.unary(Op.ERF, b.binary(Op.MUL, x, b.scalar(1 / math.sqrt(2), x)))
    return [b.binary(Op.MUL, b.binary(Op.MUL, x, b.scalar(0.5, x)), b.binary(Op.ADD, e, b.scalar(1.0, x)))]


def _maxpool(b):
    x = b.input("in0", (1, 4, 16, 16), F)
    p = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), (1, 1), (1, 1)), mode="constant", value=-math.inf)
    w = b.add(Op.WINDOW, [p], kernel=(3, 3), strides=(2, 2), dilations=(1, 1))
    r = b.reduce(Op.REDUCE_MAX, w, [4, 5])
    return [b.reshape(r, (1, 4, 8, 8))]


def _sppf(b):
    # YOLO's SPPF: three chained 5x5 max-pools (stride 1, pad 2), each pool an output
    x = b.input("in0", (1, 4, 12, 12), F)
    outs = []
    for _ in range(3):
        p = b.add(Op.PAD, [x], pads=((0, 0), (0, 0), (2, 2), (2, 2)), mode="constant", value=-math.inf)
        w = b.add(Op.WINDOW, [p], kernel=(5, 5), strides=(1, 1), dilations=(1, 1))
        x = b.reshape(b.reduce(Op.REDUCE_MAX, w, [4, 5]), (1, 4, 12, 12))
        outs.append(x)
    return outs


def _avgpool_spatial(b):
    # reduce over a non-trailing window axis: vectorised along output columns
    x = b.input("in0", (2, 3, 10, 66), F)
    w = b.add(Op.WINDOW, [x], kernel=(3,), strides=(1,), dilations=(1,))
    r = b.reduce(Op.REDUCE_SUM, b.transpose(w, (0, 1, 2, 4, 3)), [3])
    return [b.binary(Op.MUL, r, b.scalar(1 / 3, r))]


def _two_outputs(b):
    x = b.input("in0", (32, 80), F)
    s = b.reduce(Op.REDUCE_SUM, b.unary(Op.EXP, x), [1])
    return [s, b.binary(Op.DIV, b.unary(Op.EXP, x), s)]


def _chain(b):
    x, y = b.input("in0", (3, 5, 7), F), b.input("in1", (3, 1, 7), F)
    z = b.binary(Op.MUL, b.binary(Op.ADD, x, y), b.scalar(0.25, x))
    return [b.unary(Op.TANH, b.binary(Op.MAX, z, b.scalar(-0.5, z)))]


def _rank0(b):
    x = b.input("in0", (), F)
    v = b.input("in1", (6,), F)
    return [b.add(Op.MUL, [v, x]), b.add(Op.EXP, [x])]


def _where(b):
    c = b.input("in0", (8, 40), "bool")
    return [b.add(Op.WHERE, [c, b.input("in1", (8, 40), F), b.input("in2", (8, 40), F)])]


def _f64(b):
    x = b.input("in0", (8, 40), "float64")
    return [b.add(Op.EXP, [b.add(Op.TANH, [x])])]


CASES = {
    **{
        op.value: _unary(op)
        for op in (
            Op.NEG,
            Op.EXP,
            Op.LOG,
            Op.SQRT,
            Op.RECIPROCAL,
            Op.TANH,
            Op.ERF,
            Op.SIGMOID,
            Op.ABS,
            Op.FLOOR,
            Op.CEIL,
        )
    },
    "not": _layout(Op.NOT, (8, 40), "bool"),
    "cast_f2i": _unary(Op.CAST, to="int32"),
    "cast_f2b": _unary(Op.CAST, to="bool"),
    "cast_i2f": _layout(Op.CAST, (8, 40), "int32", to="float32"),
    **{
        op.value: _binary(op)
        for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.EQUAL, Op.LESS, Op.GREATER)
    },
    "div_int": _binary(Op.DIV, "int32"),
    "and": _binary(Op.AND, "bool"),
    "or": _binary(Op.OR, "bool"),
    "where": _where,
    "reduce_sum_last": _layout(Op.REDUCE_SUM, (6, 10, 32), axes=(2,)),
    "reduce_sum_02": _layout(Op.REDUCE_SUM, (6, 10, 32), axes=(0, 2)),
    "reduce_max_mid": _layout(Op.REDUCE_MAX, (6, 10, 32), axes=(1,)),
    "reduce_min_first": _layout(Op.REDUCE_MIN, (6, 10, 32), axes=(0,)),
    "reduce_max_all": _layout(Op.REDUCE_MAX, (6, 10, 32), axes=(0, 1, 2)),
    "broadcast": _layout(Op.BROADCAST, (4, 1, 8), shape=(4, 6, 8)),
    "reshape": _layout(Op.RESHAPE, (6, 8, 5), shape=(2, 3, 40)),
    "transpose": _layout(Op.TRANSPOSE, (4, 6, 8), perm=(2, 0, 1)),
    "slice_step": _layout(Op.SLICE, (9, 20), starts=(1, 2), steps=(2, 3), lengths=(4, 6)),
    "concat": lambda b: [b.add(Op.CONCAT, [b.input(f"in{i}", (4, 2 + i, 8), F) for i in range(3)], axis=1)],
    "pad_constant": _layout(Op.PAD, (5, 7), pads=((1, 2), (0, 3)), mode="constant", value=1.5),
    "pad_reflect": _layout(Op.PAD, (2, 5, 7), pads=((0, 0), (2, 1), (3, 3)), mode="reflect"),
    "pad_edge": _layout(Op.PAD, (5, 7), pads=((2, 2), (1, 4)), mode="edge"),
    "gather_progression": _layout(Op.GATHER, (5, 9, 4), axis=1, indices=(1, 3, 5, 7), indices_shape=(2, 2)),
    "gather_scalar": _layout(Op.GATHER, (5, 9, 4), axis=2, indices=(3,), indices_shape=()),
    "gather_table": _layout(Op.GATHER, (5, 9, 4), axis=1, indices=(8, 0, 3, 3, 1), indices_shape=(5,)),
    "window": _layout(Op.WINDOW, (2, 3, 9, 11), kernel=(3, 2), strides=(2, 1), dilations=(1, 2)),
    "softmax": _softmax,
    "layernorm": _layernorm,
    "instance_norm": _instance_norm,
    "instance_norm_reshaped": _instance_norm_reshaped,
    "gelu_erf": _gelu,
    "maxpool": _maxpool,
    "avgpool_spatial": _avgpool_spatial,
    "sppf": _sppf,
    "two_outputs": _two_outputs,
    "chain_broadcast": _chain,
    "rank0": _rank0,
    "float64": _f64,
}


def make_graph(name):
    b = GraphBuilder()
    for j, out in enumerate(CASES[name](b)):
        b.output(f"out{j}", out)
    return b.graph


def random_inputs(graph, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, nid in graph.inputs.items():
        node = graph.nodes[nid]
        if node.dtype == "bool":
            out[name] = rng.random(node.shape) < 0.5
        elif node.dtype.startswith("int"):
            v = rng.integers(-20, 20, node.shape).astype(node.dtype)
            out[name] = np.where(v == 0, 3, v).astype(node.dtype)
        else:
            v = rng.standard_normal(node.shape).astype(node.dtype) * 2
            out[name] = np.abs(v) + 0.1 if name == "in0" and graph.nodes[-1].op in (Op.LOG, Op.SQRT, Op.POW) else v
    return out


@pytest.fixture(scope="module")
def built():
    names = list(CASES)
    graphs = [make_graph(n) for n in names]
    kernels = get_backend("tvm").build_many([(g, {}) for g in graphs], THREADS)
    return {n: (g, k) for n, g, k in zip(names, graphs, kernels)}


def check(graph, kernel, seed=0):
    ins = random_inputs(graph, seed)
    got = kernel([ins[n] for n in graph.inputs])
    want = evaluate(graph, ins)
    assert len(got) == len(want)
    atol = ATOL_SUM if any(n.op is Op.REDUCE_SUM for n in graph.nodes) else ATOL
    for g_, (name, w) in zip(got, want.items()):
        assert g_.shape == w.shape and g_.dtype == w.dtype, name
        np.testing.assert_allclose(g_, w, rtol=RTOL, atol=atol, err_msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(built, name):
    graph, kernel = built[name]
    assert not isinstance(kernel, Exception), kernel
    assert TvmBackend().supports(graph)
    check(graph, kernel)


@pytest.mark.parametrize(
    "name",
    [
        "softmax",
        "layernorm",
        "instance_norm",
        "instance_norm_reshaped",
        "gelu_erf",
        "maxpool",
        "two_outputs",
        "avgpool_spatial",
    ],
)
def test_fused_patterns_get_the_fused_schedule(built, name):
    _, kernel = built[name]
    assert kernel.meta["report"].mode == "fused", kernel.meta["report"]
    assert not kernel.meta["report"].at_root


def _top_level_loops(script: str) -> list[str]:
    lines = script.splitlines()
    body = [ln for ln in lines if re.match(r"\s+for ", ln)]
    indent = min(len(ln) - len(ln.lstrip()) for ln in body)
    return [ln.strip() for ln in body if len(ln) - len(ln.lstrip()) == indent]


def test_softmax_is_one_parallel_pass_over_rows():
    g = make_graph("softmax")
    prep = prepare(g, THREADS, dataclass_replace(default_tile_config(g, THREADS), parallel=True))
    script = prep.func.script()
    top = _top_level_loops(script)
    assert len(top) == 1 and "T.parallel(64)" in top[0], top
    # both reductions (and their rfactor partial sums) live inside the row loop
    for block in ("n1", "n5", "n1_rf", "n5_rf"):
        assert f'T.sblock("{block}' in script
    assert "T.vectorized" in script
    assert script.count("T.parallel") == 1


def dataclass_replace(cfg: TileConfig, **kw) -> TileConfig:
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def test_default_tile_configs():
    cfg = default_tile_config(make_graph("softmax"), 2, 32)
    assert cfg.parallel_axes == 1 and cfg.vector_width == 8 and cfg.inner_tile == 0
    assert set(cfg.compute_at) == {1, 4, 5}  # max, exp (read twice), sum
    cfg = default_tile_config(make_graph("layernorm"), 2, 64)
    assert cfg.parallel_axes == 2 and cfg.vector_width == 16
    cfg = default_tile_config(make_graph("gelu_erf"), 2, 32)
    assert cfg.parallel_axes == 2 and cfg.inner_tile > 0 and cfg.compute_at == ()
    cfg = default_tile_config(make_graph("instance_norm"), 2, 32)
    assert cfg.parallel_axes == 2


def test_explicit_tile_config_and_fallback():
    g = make_graph("softmax")
    be = TvmBackend()
    cfg = dataclass_replace(default_tile_config(g, THREADS), vectorize_reductions=False, vector_width=4)
    check(g, be.build(g, {}, THREADS, tile_config=cfg))
    # an impossible config (compute a reduction at a loop that mixes rows) still yields a valid kernel
    bad = dataclass_replace(default_tile_config(g, THREADS), parallel_axes=2, inner_tile=64)
    check(g, be.build(g, {}, THREADS, tile_config=bad))


def test_misaligned_and_strided_inputs(built):
    graph, kernel = built["add"]
    ins = random_inputs(graph)
    raw = np.empty(8 * 40 + 1, F)[1:].reshape(8, 40)  # 4 bytes off alignment
    raw[...] = ins["in0"]
    strided = np.asfortranarray(ins["in1"])
    got = kernel([raw, strided])[0]
    np.testing.assert_allclose(got, ins["in0"] + ins["in1"], rtol=RTOL, atol=ATOL)
    a = aligned_empty((8, 40), F)
    assert a.ctypes.data % 64 == 0


def test_outputs_are_fresh_arrays(built):
    graph, kernel = built["exp"]
    x = random_inputs(graph)["in0"]
    first = kernel([x])[0]
    keep = first.copy()
    kernel([x + 1])
    np.testing.assert_array_equal(first, keep)


def test_save_load_roundtrip(built, tmp_path):
    be = TvmBackend()
    for name in ("softmax", "gather_table"):
        graph, kernel = built[name]
        meta = kernel.save(tmp_path, name)
        again = be.load(meta, tmp_path, THREADS)
        ins = random_inputs(graph, seed=3)
        args = [ins[n] for n in graph.inputs]
        for a, b_ in zip(kernel(args), again(args)):
            np.testing.assert_array_equal(a, b_)


def test_supports():
    be = TvmBackend()
    b = GraphBuilder()
    x = b.input("in0", (4, 4), F)
    b.output("out0", b.add(Op.MATMUL, [x, x]))
    assert not be.supports(b.graph)
    assert be.supports(make_graph("softmax"))
    assert be.version().startswith("tvm-")


def test_math_accuracy():
    """The vectorisable float32 exp/erf/tanh/sigmoid against float64 references."""
    b = GraphBuilder()
    x = b.input("in0", (4096,), F)
    for j, op in enumerate((Op.EXP, Op.ERF, Op.TANH, Op.SIGMOID)):
        b.output(f"out{j}", b.add(op, [x]))
    g = b.graph
    k = TvmBackend().build(g, {}, THREADS)
    v = np.concatenate([np.linspace(-80, 88, 2048), np.random.default_rng(1).standard_normal(2048) * 3]).astype(F)
    got = k([v])
    v64 = v.astype(np.float64)
    erf = np.vectorize(math.erf)(v64)
    refs = [np.exp(v64), erf, np.tanh(v64), 1 / (1 + np.exp(-v64))]
    np.testing.assert_allclose(got[0], refs[0], rtol=3e-7, atol=0)
    for got_j, ref in zip(got[1:], refs[1:]):
        np.testing.assert_allclose(got_j, ref, rtol=0, atol=1e-6)
    special = k([np.array([np.inf, -np.inf, 0.0, 100.0] * 1024, F)])
    assert special[0][0] == np.inf and special[0][1] == 0 and special[0][3] == np.inf
    assert special[1][0] == 1 and special[1][1] == -1


def _layernorm_tail_with_stored_broadcast(b):
    """Segformer's LayerNorm tail: the variance of in2, and gamma broadcast over the rows
    (an output, so stored, and copied to its output block) times the normalised row,
    plus a residual."""
    gamma = b.input("in0", (1, 1, 32), F)
    res = b.input("in1", (1, 256, 32), F)
    diff = b.input("in2", (1, 256, 32), F)
    var = b.binary(Op.DIV, b.reduce(Op.REDUCE_SUM, b.binary(Op.MUL, diff, diff), [2]), b.scalar(32.0, diff))
    rstd = b.unary(Op.RECIPROCAL, b.unary(Op.SQRT, b.binary(Op.ADD, var, b.scalar(1e-5, diff))))
    g = b.broadcast_to(gamma, (1, 256, 32))
    y = b.binary(Op.MUL, b.binary(Op.MUL, diff, b.broadcast_to(rstd, (1, 256, 32))), g)
    return [g, b.binary(Op.ADD, y, res)]


def test_row_reduction_with_a_copied_output_is_computed_before_its_consumer():
    # regression: merging the output copy's loop into the row loop made TVM place the
    # variance after the block that reads it, so a fresh kernel's first call was wrong
    b = GraphBuilder()
    for j, out in enumerate(_layernorm_tail_with_stored_broadcast(b)):
        b.output(f"out{j}", out)
    g = b.graph
    cfg = default_tile_config(g, THREADS)
    assert cfg.parallel_axes == 2 and cfg.compute_at  # the fused schedule's case
    for seed in range(2):  # a fresh kernel each time: its first call must be right
        check(g, TvmBackend().build(g, {}, THREADS, tile_config=cfg), seed)


def _root_statements(func) -> int:
    body = func.body.block.body
    return len(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else 1


@pytest.mark.parametrize("name", list(CASES))
def test_root_nests_predicts_the_scheduled_nests(name):
    # the tiling model charges a fork-join per parallel nest from this count, made
    # without scheduling; the scheduler's own result is the truth
    g = make_graph(name)
    for cfg in (default_tile_config(g, THREADS, 32), model_tile_config(g, THREADS, 32)[0]):
        for c in (cfg, dataclass_replace(cfg, parallel_axes=0, compute_at=())):
            assert root_nests(g, c) == _root_statements(prepare(g, THREADS, c).func), c


def test_sppf_chain_runs_as_several_nests_and_the_model_keeps_it_on_one_core():
    g = make_graph("sppf")
    cfg = default_tile_config(g, THREADS, 32)
    # each pool is an output read by the next pool: its copy pins it to the root
    assert root_nests(g, cfg) > 1
    from korch.tiling.target import get_target

    slow_fork = get_target("cpu").replace(cores=THREADS, fork_join=1e6)  # 1 ms per fork-join
    cfg, sol = model_tile_config(g, THREADS, 32, target=slow_fork)
    assert not cfg.parallel and sol.cores == 1


def test_a_reduction_anchor_gets_the_fused_schedule():
    # a kernel whose largest output is a row reduction: the row loop is the reduction's
    # own, its rfactor partial sums under it (before: a vectorize error, then the
    # simple schedule with two parallel nests)
    g = make_graph("reduce_sum_last")
    cfg = dataclass_replace(default_tile_config(g, THREADS, 32), vector_width=8, parallel=True)
    prep = prepare(g, THREADS, cfg)
    assert prep.report.mode == "fused", prep.report
    assert _root_statements(prep.func) == 1
    script = prep.func.script()
    assert "T.vectorized" in script and 'T.sblock("n1_rf' in script
    check(g, TvmBackend().build(g, {}, THREADS, tile_config=cfg))


def test_window_reductions_are_not_vectorised_by_hand():
    # Note [Window reductions stay scalar]: the max over a pooling window is a plain
    # nest (LLVM vectorises it better than a split across output columns)
    g = make_graph("sppf")
    script = prepare(g, THREADS, default_tile_config(g, THREADS, 32)).func.script()
    lines = script.splitlines()
    for i, ln in enumerate(lines):
        m = re.search(r'T\.sblock\("(n\d+)"\)', ln)
        if not m or g.nodes[int(m.group(1)[1:])].op is not Op.REDUCE_MAX:
            continue
        indent = len(ln) - len(ln.lstrip())
        for prev in reversed(lines[:i]):
            pind = len(prev) - len(prev.lstrip())
            if pind < indent and prev.strip().startswith("for "):
                assert "T.vectorized" not in prev, prev
                indent = pind


@pytest.mark.parametrize("hw", [7, 14])
def test_ragged_rows_get_full_vectors(hw):
    # Note [Ragged rows]: a per-channel scale over 7x7 (49 a row) or 14x14 (196) pixels;
    # 49 had no vectors at all (LLVM then gathered across rows), 196 vectors of 4
    b = GraphBuilder()
    x = b.input("in0", (1, 96, hw, hw), F)
    s = b.input("in1", (1, 96, 1, 1), F)
    b.output("out", b.binary(Op.MUL, x, s))
    g = b.graph
    cfg = dataclass_replace(default_tile_config(g, THREADS, 64), vector_width=16)
    prep = prepare(g, THREADS, cfg)
    assert prep.report.mode == "fused", prep.report
    script = prep.func.script()
    assert "T.vectorized(16)" in script, script
    main = (hw * hw) // 16 * 16
    assert f"range({main}, {hw * hw})" in script, script  # the scalar tail
    check(g, TvmBackend().build(g, {}, THREADS, tile_config=cfg))
