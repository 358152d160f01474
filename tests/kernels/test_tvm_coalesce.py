"""Coalesced axes (Note [Coalesced axes] in korch/kernels/tvm/coalesce.py).

Structure: which axes merge (broadcast and keepdims-reduce shapes, the parallel
boundary, unit axes dropped, layout primitives refused), and the generated
function's buffers take the merged shapes while the kernel keeps its own.
Numbers: coalesced kernels (CNN epilogues over 7- and 28-wide rows, a squeeze-excite
mean, two outputs) match ``korch.ir.evaluate`` within rtol 1e-5, atol 1e-5, called
alone and after a save and load.
"""

from __future__ import annotations

import numpy as np
import pytest

from korch.ir import GraphBuilder, Op, evaluate

pytest.importorskip("tvm")

from korch.kernels.tvm.backend import TvmBackend  # noqa: E402
from korch.kernels.tvm.coalesce import coalesce  # noqa: E402
from korch.kernels.tvm.tiling import TileConfig, default_tile_config  # noqa: E402

F = "float32"


def hardswish_bias(shape):
    """x * clip(x + b + 3, 0, 6) / 6 with a per-channel b: a CNN epilogue."""
    b = GraphBuilder()
    x = b.input("in0", shape, F)
    bias = b.input("in1", (1, shape[1], 1, 1), F)
    y = b.binary(Op.ADD, x, bias)
    t = b.add(Op.ADD, [y, b.scalar(3.0, y)])
    t = b.add(Op.MIN, [b.add(Op.MAX, [t, b.scalar(0.0, t)]), b.scalar(6.0, t)])
    b.output("out0", b.add(Op.MUL, [b.add(Op.MUL, [y, t]), b.scalar(1 / 6, y)]))
    return b.graph


def squeeze_excite(shape):
    """x * sigmoid(mean over H, W of x), and the mean as a second output."""
    b = GraphBuilder()
    x = b.input("in0", shape, F)
    s = b.reduce(Op.REDUCE_SUM, x, [2, 3])
    m = b.add(Op.MUL, [s, b.scalar(1 / (shape[2] * shape[3]), s)])
    g = b.unary(Op.SIGMOID, m)
    b.output("out0", b.binary(Op.MUL, x, g))
    b.output("out1", m)
    return b.graph


def scale(shape):
    b = GraphBuilder()
    x = b.input("in0", shape, F)
    b.output("out0", b.add(Op.MUL, [x, b.scalar(1 / 6, x)]))
    return b.graph


def test_which_axes_merge():
    co = coalesce(scale((1, 96, 28, 28)), 4)
    assert co.groups == ((1, 2, 3),) and co.parallel_axes == 1
    assert co.graph.nodes[-1].shape == (96 * 784,)
    co = coalesce(hardswish_bias((1, 96, 28, 28)), 4)
    assert co.groups == ((1,), (2, 3))  # the bias keeps the channel axis apart
    bcast = next(n for n in co.graph.nodes if n.op is Op.BROADCAST)
    assert co.graph.nodes[bcast.inputs[0]].shape == (96, 1) and bcast.attr("shape") == (96, 784)
    # every axis fused: vectors of 8 fit 784-wide rows, but would cross 196-wide ones,
    # so that kernel loops over its rows instead
    co = coalesce(hardswish_bias((1, 96, 28, 28)), 4, 25088, 8)
    assert (co.parallel_axes, co.inner_tile) == (2, 25088)
    co = coalesce(hardswish_bias((1, 240, 14, 14)), 4, 23520, 8)
    assert (co.parallel_axes, co.inner_tile) == (1, 0)
    co = coalesce(squeeze_excite((1, 16, 7, 7)), 4)
    assert co.groups == ((1,), (2, 3))
    red = next(n for n in co.graph.nodes if n.op is Op.REDUCE_SUM)
    assert red.attr("axes") == (1,) and red.shape == (16, 1)
    # the parallel loop's axes are a boundary: [2, 3 | 4, 5] with two parallel axes
    co = coalesce(scale((2, 3, 4, 5)), 2)
    assert co.groups == ((0, 1), (2, 3)) and co.parallel_axes == 1
    assert coalesce(scale((2, 3)), 1) is None  # nothing to merge across the boundary
    assert coalesce(scale((1, 1, 1, 8)), 4) is not None  # unit axes dropped
    b = GraphBuilder()
    b.output("out0", b.transpose(b.input("in0", (4, 6), F), [1, 0]))
    assert coalesce(b.graph, 2) is None  # a layout primitive: left as it is


CASES = {
    "hardswish 96x28x28": (hardswish_bias, (1, 96, 28, 28)),
    "hardswish 288x7x7": (hardswish_bias, (1, 288, 7, 7)),
    "squeeze-excite 72x14x14": (squeeze_excite, (1, 72, 14, 14)),
    "scale 16x112x112": (scale, (1, 16, 112, 112)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_coalesced_kernel_matches_reference(name, tmp_path):
    make, shape = CASES[name]
    g = make(shape)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(g.nodes[i].shape).astype(F) * 3 for n, i in g.inputs.items()}
    want = list(evaluate(g, feeds).values())
    configs = [None]
    cfg = default_tile_config(g, 2, 32)
    if cfg.parallel_axes == len(shape):  # also a row-tiled schedule over the same kernel
        configs.append(TileConfig(**{**cfg.__dict__, "parallel_axes": 2, "inner_tile": 0}))
    for config in configs:
        k = TvmBackend().build(g, {}, 2, config)
        assert k.call_shapes is not None and all(len(s) < len(shape) for s in k.call_shapes)
        assert [s.shape for s in k.outputs] == [g.nodes[i].shape for i in g.outputs.values()]
        got = k(list(feeds.values()))
        for w, x in zip(want, got):
            assert x.shape == w.shape
            np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-5)
    meta = k.save(tmp_path, "k")
    loaded = TvmBackend().load(meta, tmp_path, 2)
    assert loaded.call_shapes == k.call_shapes
    for w, x in zip(want, loaded(list(feeds.values()))):
        np.testing.assert_allclose(x, w, rtol=1e-5, atol=1e-5)
