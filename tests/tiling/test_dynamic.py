"""Dynamic shapes, GE's way (Note [Dynamic shapes]): a tiling function built once with a
symbolic extent gives, at every concrete extent, the tiling a static compile gives."""

from __future__ import annotations

import pytest

from korch.tiling import examples as E
from korch.tiling.describe import describe
from korch.tiling.dynamic import TilingFunction
from korch.tiling.model import TemplateModel, with_extent
from korch.tiling.solvers import SOLVERS, solve
from korch.tiling.target import TARGETS, get_target


def _dynamic_axes(desc):
    out = []
    for i in range(len(desc.axes)):
        try:
            TilingFunction(desc, i, "cpu")
        except ValueError:
            continue
        out.append(i)
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("solver", [s for s in SOLVERS if s != "exhaustive"])
def test_tiling_function_equals_the_static_solve_at_every_extent(target, solver):
    tgt = get_target(target)
    checked = 0
    for name, build in E.suite(small=True):
        desc = describe(build())
        for axis in _dynamic_axes(desc)[:2]:
            tf = TilingFunction(desc, axis, tgt, solver)
            for n in (2, 3, 17, desc.axes[axis].extent, 4 * desc.axes[axis].extent + 5):
                got, want = tf(n), solve(with_extent(desc, axis, n), tgt, solver)
                assert (got is None) == (want is None), (name, axis, n)
                if got is None:
                    continue
                assert got.tiles == want.tiles and got.cores == want.cores, (name, axis, n, got, want)
                assert got.template == want.template and got.time_us == pytest.approx(want.time_us, rel=1e-9)
                assert got.tiles[axis] <= n
                for (_, used), level in zip(got.buffer_bytes, tgt.local_levels):
                    assert 0 < used <= level.usable
                checked += 1
    assert checked >= 20


def test_the_symbolic_model_matches_the_static_one_point_by_point():
    desc = describe(E.softmax(64, 100))
    tgt = get_target("ascend-a2")
    dyn = TemplateModel(desc, tgt, "multi-pass", "fast", dynamic=0)
    for n in (5, 64, 300):
        bound = dyn.bind(n)
        static = TemplateModel(with_extent(desc, 0, n), tgt, "multi-pass", "fast")
        assert [v.candidates for v in bound.vars] == [v.candidates for v in static.vars]
        for x in ([1, 4, 1], [min(n, 8), 32, 2], [n, 100, 48]):
            assert bound.probe(x) == static.probe(x)
            assert bound.buffer_bytes(x) == static.buffer_bytes(x)


def test_a_call_is_memoised_and_refusals_are_clear():
    desc = describe(E.softmax(64, 100))
    tf = TilingFunction(desc, 0, "cpu")
    assert tf(50) is tf(50)
    with pytest.raises(ValueError, match="out of range"):
        TilingFunction(desc, 7, "cpu")
    with pytest.raises(ValueError, match="extent 0"):
        tf(0)
    static = TemplateModel(desc, get_target("cpu"), "one-pass", "fast")
    with pytest.raises(ValueError, match="dynamic=axis"):
        static.bind(3)
