"""Note [Views in a segment]: a concat of whole blocks, a slice of one block and a
reshape run nothing in a native segment; their producers write, and their readers
read, the blocks of one slot. Results match numpy to 1e-5 (TVM's exp and tanh)."""

from __future__ import annotations

import numpy as np
import pytest

from korch.executable import Step
from korch.executable.native import fuse_native
from korch.executable.views import view_of
from korch.ir import GraphBuilder, Op, verify
from korch.ir.subgraph import extract, kernel_consts, make_kernel
from korch.kernels.base import aligned_copy
from korch.kernels.registry import get_backend
from korch.rewrite.rules.common import slice_axis

rng = np.random.default_rng(3)
C, H, W = 16, 8, 8


def singletons(graph, names=None):
    """One TVM step per compute primitive, in order, with its view (as build_executable
    sets it)."""
    verify(graph)
    users = graph.users()
    steps = []
    for nid in graph.compute_ids():
        kernel = make_kernel(graph, users, [nid])
        built = get_backend("tvm").build(extract(graph, kernel), kernel_consts(graph, kernel), 2)
        st = Step(f"k{nid}", "tvm", f"w{nid}", kernel.nodes, kernel.inputs, kernel.outputs, built, cost_us=1.0)
        view = view_of(graph, kernel.nodes)
        if view is not None:
            st.meta["view"] = view
        steps.append(st)
    return steps


def yolo_like():
    """exp(x) and tanh(x) concatenated on channels; a slice of the concat and of x; a
    reshape; readers of every piece."""
    b = GraphBuilder()
    x = b.input("x", (1, C, H, W), "float32")
    e = b.unary(Op.EXP, x)
    t = b.unary(Op.TANH, x)
    c = b.add(Op.CONCAT, [e, t], axis=1)
    s = slice_axis(b, c, 1, 8, 16)  # half of e, half of t
    r = b.add(Op.RESHAPE, [b.unary(Op.SIGMOID, s)], shape=(1, 16, H * W))
    b.output("y", b.unary(Op.NEG, r))
    b.output("z", b.unary(Op.ABS, c))
    xs = slice_axis(b, x, 1, 0, 4)  # a block of the segment's input
    b.output("w", b.unary(Op.NEG, xs))
    b.output("e2", b.unary(Op.EXP, e))  # e is read after the concat
    return b.graph


def reference(x):
    e, t = np.exp(x), np.tanh(x)
    c = np.concatenate([e, t], axis=1)
    s = c[:, 8:24]
    y = -(1 / (1 + np.exp(-s))).reshape(1, 16, H * W)
    return y, np.abs(c), -x[:, :4], np.exp(e)


@pytest.fixture(scope="module")
def graph_and_steps():
    g = yolo_like()
    return g, singletons(g)


def test_which_steps_are_views(graph_and_steps):
    g, steps = graph_and_steps
    kinds = {g.nodes[st.nodes[0]].op: st.meta.get("view") for st in steps}
    assert kinds[Op.CONCAT][0] == "concat"
    assert [off for _, off in kinds[Op.CONCAT][1]] == [0, C * H * W * 4]
    assert kinds[Op.RESHAPE] == ("block", 0)
    assert kinds[Op.EXP] is None
    offsets = sorted(st.meta["view"][1] for st in steps if g.nodes[st.nodes[0]].op is Op.SLICE)
    assert offsets == [0, 8 * H * W * 4]


def test_views_run_nothing_and_match_numpy(graph_and_steps):
    g, steps = graph_and_steps
    outs = [g.outputs[k] for k in ("y", "z", "w", "e2")]
    fused = fuse_native(steps, set(outs), lambda n: None, 2)
    assert [s.backend for s in fused] == ["native-segment"]
    seg = fused[0]
    views = {g.nodes[int(name[1:])].op for name in seg.kernel.meta["views"]}
    assert views == {Op.CONCAT, Op.SLICE, Op.RESHAPE}
    assert len(seg.kernel.meta["views"]) == 4
    x = aligned_copy(rng.standard_normal((1, C, H, W)).astype("float32"))
    got = dict(zip(seg.outputs, seg.kernel([x])))
    for nid, want in zip(outs, reference(x)):
        np.testing.assert_allclose(got[nid], want, rtol=1e-5, atol=1e-6)
    # the concat's output lives in the arena with its inputs inside it: no room for copies
    assert seg.kernel.meta["arena_bytes"] < 4 * C * H * W * 4


def test_a_concat_read_after_the_segment_is_written_in_place(graph_and_steps):
    g, steps = graph_and_steps
    c = next(st.outputs[0] for st in steps if g.nodes[st.nodes[0]].op is Op.CONCAT)
    outs = {g.outputs[k] for k in ("y", "z", "w", "e2")} | {c}
    seg = fuse_native(steps, outs, lambda n: None, 2)[0]
    assert any(g.nodes[int(n[1:])].op is Op.CONCAT for n in seg.kernel.meta["views"])
    x = aligned_copy(rng.standard_normal((1, C, H, W)).astype("float32"))
    got = dict(zip(seg.outputs, seg.kernel([x])))
    np.testing.assert_allclose(got[c], np.concatenate([np.exp(x), np.tanh(x)], axis=1), rtol=1e-5)


def test_an_input_read_after_the_segment_keeps_its_concat_a_copy(graph_and_steps):
    g, steps = graph_and_steps
    e = next(st.outputs[0] for st in steps if g.nodes[st.nodes[0]].op is Op.EXP and st.inputs == (g.inputs["x"],))
    outs = {g.outputs[k] for k in ("y", "z", "w", "e2")} | {e}
    seg = fuse_native(steps, outs, lambda n: None, 2)[0]
    assert not any(g.nodes[int(n[1:])].op is Op.CONCAT for n in seg.kernel.meta["views"])
    x = aligned_copy(rng.standard_normal((1, C, H, W)).astype("float32"))
    got = dict(zip(seg.outputs, seg.kernel([x])))
    np.testing.assert_allclose(got[e], np.exp(x), rtol=1e-5)
    np.testing.assert_allclose(got[g.outputs["z"]], np.abs(np.concatenate([np.exp(x), np.tanh(x)], 1)), rtol=1e-5)


def test_blocks_that_are_not_contiguous_or_aligned_are_not_views():
    b = GraphBuilder()
    x = b.input("x", (2, C, H, W), "float32")  # batch 2: a channel concat is not one block
    c = b.add(Op.CONCAT, [x, b.unary(Op.NEG, x)], axis=1)
    s = slice_axis(b, x, 2, 0, 4)  # rows of every channel: not one block
    odd = slice_axis(b, x, 0, 1, 1)
    y = b.input("y", (1, 3, 5), "float32")
    u = slice_axis(b, y, 1, 1, 2)  # one block, 20 bytes in: not ALIGN-aligned
    g = b.graph
    assert view_of(g, (c,)) is None
    assert view_of(g, (s,)) is None
    assert view_of(g, (odd,)) == ("block", C * H * W * 4)
    assert view_of(g, (u,)) is None


def test_a_sliced_part_is_copied_into_its_block():
    """yolo's C3: concat(m(a), b) with b a slice of the merged convolution's output. The
    slice cannot be a view of both tensors, so its kernel writes the part into the
    concat's block, and the concat runs nothing."""
    b = GraphBuilder()
    x = b.input("x", (1, C, H, W), "float32")
    t = b.unary(Op.TANH, x)
    part = slice_axis(b, t, 1, 8, 8)
    c = b.add(Op.CONCAT, [b.unary(Op.EXP, slice_axis(b, t, 1, 0, 8)), part], axis=1)
    b.output("y", b.unary(Op.NEG, c))
    g = b.graph
    steps = singletons(g)
    seg = fuse_native(steps, {g.outputs["y"]}, lambda n: None, 2)[0]
    ops = [g.nodes[int(n[1:])].op for n in seg.kernel.meta["views"]]
    assert sorted(o.value for o in ops) == ["concat", "slice"]  # the concat, and the slice exp reads
    x = aligned_copy(rng.standard_normal((1, C, H, W)).astype("float32"))
    (got,) = seg.kernel([x])
    t = np.tanh(x)
    np.testing.assert_allclose(got, -np.concatenate([np.exp(t[:, :8]), t[:, 8:]], axis=1), rtol=1e-5)
