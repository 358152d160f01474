"""Generated kernels compiled once with a dynamic dimension (Note [Dynamic kernels]):
one compile runs at every extent, matching the reference interpreter, with the tiling
key the tiling function's solution picks."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

from tvm import tirx  # noqa: E402

from korch.ir.graph import GraphBuilder  # noqa: E402
from korch.ir.interp import evaluate  # noqa: E402
from korch.ir.ops import Op  # noqa: E402
from korch.kernels.base import aligned_empty  # noqa: E402
from korch.kernels.tvm.dynamic import DynamicKernel, dynamic_axes, graph_at  # noqa: E402
from korch.kernels.tvm.lower import Dynamic, lower  # noqa: E402
from korch.profile.timing import random_inputs  # noqa: E402
from korch.tiling import examples as E  # noqa: E402

CASES = [
    ("softmax", lambda: E.softmax(16, 96), 0),
    ("layernorm", lambda: E.layernorm(24, 64), 0),
    ("instancenorm channels", lambda: E.instancenorm(1, 8, 12, 12), 0),
    ("gelu rows", lambda: E.gelu((32, 256)), 0),
    ("add_relu batch of 3-D", lambda: E.add_relu((4, 20, 48)), 0),
    ("add_relu innermost", lambda: E.add_relu((8, 40)), 1),
    ("transpose batch", lambda: E.transpose((4, 16, 24), (0, 2, 1)), 0),
    ("head split sequence", lambda: E.heads_split(20, 4, 16), 1),
    ("maxpool channels", lambda: E.maxpool(1, 8, 14, 14), 0),
    ("global pool channels", lambda: E.avgpool_global(1, 16, 7, 7), 0),
]


def _check(kernel: DynamicKernel, g, n: int, got=None) -> None:
    ga = graph_at(g, kernel.dims, n)
    feeds = random_inputs(ga, {}, seed=n)
    got = kernel(feeds) if got is None else got(feeds)
    want = evaluate(ga, dict(zip(ga.inputs, feeds)))
    assert len(got) == len(want)
    for a, (name, w) in zip(got, want.items()):
        assert a.shape == w.shape, (name, n)
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5, err_msg=f"{name} at n={n}")


@pytest.mark.parametrize("name,build,axis", CASES, ids=[c[0] for c in CASES])
def test_one_compile_matches_the_reference_at_every_extent(name, build, axis):
    g = build()
    assert axis in dynamic_axes(g)
    kernel = DynamicKernel(g, axis, num_threads=2)
    lib = kernel.lib
    for n in (1, 2, 3, kernel.extent, kernel.extent + 1, 2 * kernel.extent + 3):
        _check(kernel, g, n)
        # the key is the tiling function's solution at n: all cores -> the parallel branch
        sol = kernel.tiling(n)
        assert kernel.key(n) == ("parallel" if sol.cores > 1 or sol.reduce_split > 1 else "serial")
    assert kernel.lib is lib  # compiled once
    assert sum(kernel.calls.values()) == 6
    # every key computes the same values (the key only changes how it is parallelised)
    for key, func in kernel.funcs.items():
        n = kernel.extent + 5
        ga = graph_at(g, kernel.dims, n)
        feeds = random_inputs(ga, {}, seed=1)
        # the generated code assumes ALIGN-byte buffers, as the kernel's call provides
        outs = [aligned_empty(ga.nodes[nid].shape, ga.nodes[nid].dtype) for nid in ga.outputs.values()]
        func(*feeds, *outs, *kernel.hidden)
        want = evaluate(ga, dict(zip(ga.inputs, feeds)))
        for a, w in zip(outs, want.values()):
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5, err_msg=key)


def test_the_rows_are_the_loop_and_their_static_axes_vectorise():
    """A flat loop over every axis (the static rule for an elementwise kernel) would be
    split by a constant over a symbolic extent: no vector loop. The dynamic kernel loops
    over the rows instead, and the schedule is the fused one, not a fallback."""
    g = E.gelu((64, 512))
    kernel = DynamicKernel(g, 0, num_threads=2)
    assert kernel.config.parallel_axes == 1 and kernel.config.inner_tile == 0
    assert {r.mode for r in kernel.reports.values()} == {"fused"}
    n = tirx.Var("n", "int32")
    lw = lower(g, Dynamic(n, kernel.dims))
    from korch.kernels.tvm.schedule import schedule

    func, _ = schedule(lw.func, g, kernel.config, lw.block_of, lw.copies)
    assert "T.vectorized" in func.script()
    assert kernel.graph is g and graph_at(g, kernel.dims, kernel.extent).nodes == g.nodes


def test_both_keys_are_compiled_and_one_thread_compiles_one():
    g = E.add_relu((64, 256))
    assert set(DynamicKernel(g, 0, num_threads=2).funcs) == {"serial", "parallel"}
    single = DynamicKernel(g, 0, num_threads=1)
    assert set(single.funcs) == {"serial"}
    _check(single, g, 100)


def test_axes_that_cannot_be_dynamic_are_refused():
    # a reduced axis
    g = E.softmax(16, 96)
    with pytest.raises(ValueError, match="reduced"):
        DynamicKernel(g, 1, num_threads=2)
    # a dim whose index arithmetic needs the extent: merged by a reshape, padded
    b = GraphBuilder()
    x = b.input("in0", (6, 8), "float32")
    b.output("out0", b.unary(Op.EXP, b.reshape(x, (48,))))
    n = tirx.Var("n", "int32")
    with pytest.raises(ValueError, match="reshape"):
        lower(b.graph, Dynamic(n, {0: (0,), 1: (0,), 2: (0,)}))
    b = GraphBuilder()
    x = b.input("in0", (6, 8), "float32")
    b.output("out0", b.add(Op.PAD, [x], pads=((1, 1), (0, 0)), mode="constant", value=0.0))
    with pytest.raises(ValueError, match="pads it"):
        lower(b.graph, Dynamic(n, {0: (0,), 1: (0,)}))


def test_bad_inputs_say_what_is_wrong():
    g = E.add_relu((8, 32))
    kernel = DynamicKernel(g, 0, num_threads=2)
    a = np.ones((5, 32), np.float32)
    with pytest.raises(ValueError, match="dim 0 is 6 where another input gives n = 5"):
        kernel([a, np.ones((6, 32), np.float32)])
    with pytest.raises(ValueError, match="dim 1 is 31, expected 32"):
        kernel([a, np.ones((5, 31), np.float32)])
    with pytest.raises(ValueError, match="1 inputs, expected 2"):
        kernel([a])
    # a strided or float64 input is staged, not refused
    wide = np.ones((5, 64), np.float64)[:, ::2]
    (out,) = kernel([wide, a])
    np.testing.assert_array_equal(out, np.full((5, 32), 2.0, np.float32))
