"""Native segments (Note [Native segment]): consecutive TVM and native linear kernels
run as one call, match numpy, save and load, profile per kernel, and a segment that
fails to build leaves its steps as they were, recorded."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from korch.diagnostics import collecting
from korch.executable import Executable, Step, TensorSpec
from korch.executable.native import fuse_native
from korch.ir import GraphBuilder, Op, verify
from korch.ir.subgraph import extract, make_kernel
from korch.kernels.base import aligned_copy
from korch.kernels.registry import get_backend

rng = np.random.default_rng(1)


def one_kernel(graph):
    verify(graph)
    kernel = make_kernel(graph, graph.users(), graph.compute_ids())
    kg = extract(graph, kernel)
    consts = {f"in{i}_c": graph.const_value(s) for i, s in enumerate(kernel.inputs) if graph.nodes[s].op is Op.CONST}
    return kg, consts


def unary_kernel(op, shape):
    b = GraphBuilder()
    b.output("y", b.unary(op, b.input("x", shape, "float32")))
    kg, consts = one_kernel(b.graph)
    return get_backend("tvm").build(kg, consts, 2)


def linear_kernel(m, k, n):
    b = GraphBuilder()
    w = rng.standard_normal((k, n)).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    y = b.add(Op.MATMUL, [b.input("a", (m, k), "float32"), b.const(w, name="w")])
    y = b.binary(Op.ADD, y, b.const(bias, name="bias"))
    y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    kg, consts = one_kernel(b.graph)
    return get_backend("native").build(kg, consts, 2), w, bias


@pytest.fixture(scope="module")
def chain():
    """exp (tvm) -> matmul + bias + relu (native) -> tanh (tvm); node ids: x 0, e 1,
    w 2, bias 3, y 4, t 5."""
    m, k, n = 256, 384, 96
    lin, w, bias = linear_kernel(m, k, n)
    steps = [
        Step("k0", "tvm", "w0", (1,), (0,), (1,), unary_kernel(Op.EXP, (m, k)), cost_us=10.0),
        Step("k1", "native", "w1", (4,), (1, 2, 3), (4,), lin, cost_us=20.0),
        Step("k2", "tvm", "w2", (5,), (4,), (5,), unary_kernel(Op.TANH, (m, n)), cost_us=5.0),
    ]
    consts = {2: w, 3: bias}
    x = aligned_copy(rng.standard_normal((m, k)).astype("float32") * 0.1)
    want = np.tanh(np.maximum(np.exp(x) @ w + bias, 0))
    return steps, consts, x, want


def test_one_segment_matches_numpy(chain):
    steps, consts, x, want = chain
    fused = fuse_native(steps, {5}, consts.get, 2)
    assert [s.backend for s in fused] == ["native-segment"]
    seg = fused[0]
    assert seg.inputs == (0,) and seg.outputs == (5,)  # the weights are bound at load, e and y live inside
    assert seg.cost_us == 35.0
    assert seg.kernel.meta["arena_bytes"] >= 256 * 384 * 4  # e (and y) in the segment's arena
    (got,) = seg.kernel([x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # per-kernel clocks inside the segment
    seg.kernel.profile(True)
    seg.kernel([x])
    ns = seg.kernel.profile_ns()
    seg.kernel.profile(False)
    assert len(ns) == 3 and all(v > 0 for v in ns)


def test_intermediate_read_later_is_an_output(chain):
    steps, consts, x, want = chain
    fused = fuse_native(steps[:2], {4}, consts.get, 2)  # y is read after the segment
    assert fused[0].outputs == (4,)
    (y,) = fused[0].kernel([x])
    np.testing.assert_allclose(np.tanh(y), want, rtol=1e-4, atol=1e-4)


def test_non_native_step_splits_segments(chain):
    steps, consts, x, want = chain
    from korch.kernels.library.numpy_blas import NumpyBackend  # noqa: F401 - registers numpy

    b = GraphBuilder()
    w = consts[2]
    y = b.add(Op.MATMUL, [b.input("a", (256, 384), "float32"), b.const(w, name="w")])
    y = b.binary(Op.ADD, y, b.const(consts[3], name="bias"))
    y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    kg, kc = one_kernel(b.graph)
    numpy_step = Step("k1", "numpy", "w1", (4,), (1, 2, 3), (4,), get_backend("numpy").build(kg, kc, 2))
    fused = fuse_native([steps[0], numpy_step, steps[2]], {5}, consts.get, 2)
    assert [s.backend for s in fused] == ["native-segment", "numpy", "native-segment"]
    exe = Executable(
        {"x": TensorSpec(0, (256, 384), "float32")}, {"t": TensorSpec(5, (256, 96), "float32")}, consts, fused
    )
    np.testing.assert_allclose(exe({"x": x})["t"], want, rtol=1e-4, atol=1e-4)
    assert [s.name for s in exe.kernel_steps()] == ["k0", "k1", "k2"]
    assert [s.meta.get("segment") for s in exe.kernel_steps()] == [fused[0].name, None, fused[2].name]


def test_save_and_load(chain, tmp_path):
    steps, consts, x, want = chain
    fused = fuse_native(steps, {5}, consts.get, 2)
    exe = Executable({"x": TensorSpec(0, x.shape, "float32")}, {"t": TensorSpec(5, want.shape, "float32")}, {}, fused)
    exe.save(tmp_path)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [s["backend"] for s in plan["steps"]] == ["native-segment"]
    loaded = Executable.load(tmp_path, 2)
    np.testing.assert_allclose(loaded({"x": x})["t"], want, rtol=1e-4, atol=1e-4)
    assert [s.backend for s in loaded.kernel_steps()] == ["tvm", "native", "tvm"]


def test_failed_build_is_skipped_and_recorded(chain, monkeypatch):
    steps, consts, x, want = chain
    import korch.kernels.native.toolchain as tc

    def broken(*a, **k):
        raise tc.NativeBuildError("native segment: g++ failed: injected")

    monkeypatch.setattr(tc, "link_shared", broken)
    with collecting() as c:
        fused = fuse_native(steps, {5}, consts.get, 2)
    assert fused == steps  # the steps run from Python, as before
    (rec,) = c.records()
    assert rec["stage"] == "native" and "injected" in rec["message"]


def test_segments_share_the_one_runtime_and_pool(chain):
    """Note [One pool, awake for a segment]: every segment binds the one loaded
    libkorch_rt.so (its pool and error state), not a copy of its own."""
    import ctypes

    from korch.kernels.native.toolchain import load_runtime

    steps, consts, x, want = chain
    a = fuse_native(steps, {5}, consts.get, 2)[0].kernel
    b = fuse_native(steps[:2], {4}, consts.get, 2)[0].kernel
    rt = load_runtime()
    addr = lambda lib: ctypes.cast(lib.korch_pool_hold, ctypes.c_void_p).value  # noqa: E731
    assert addr(a._lib) == addr(b._lib) == addr(rt)


def test_segments_called_from_two_threads_at_once(chain):
    """Two callers launch on one pool: the second runs its job on its own thread
    (the launcher is busy) and both results are right."""
    import threading

    steps, consts, x, want = chain
    seg = fuse_native(steps, {5}, consts.get, 2)[0].kernel
    other = fuse_native(steps, {5}, consts.get, 2)[0].kernel  # its own statics: callable beside seg
    errors: list[str] = []

    def call(k):
        for _ in range(30):
            (got,) = k([x])
            if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                errors.append("mismatch")

    threads = [threading.Thread(target=call, args=(k,)) for k in (seg, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_call_holds_the_pool_through_short_steps_between_segments(chain):
    """Note [Holding the pool through a call]: held from the start when the first step
    is a segment, through a short step of another library between segments, let go
    around a long one; no hold is left after a call, nor after one that raised."""
    from korch.kernels.library.numpy_blas import NumpyBackend  # noqa: F401 - registers numpy
    from korch.kernels.native.toolchain import load_runtime

    steps, consts, x, want = chain
    b = GraphBuilder()
    y = b.add(Op.MATMUL, [b.input("a", (256, 384), "float32"), b.const(consts[2], name="w")])
    y = b.binary(Op.ADD, y, b.const(consts[3], name="bias"))
    y = b.add(Op.MAX, [y, b.scalar(0.0, y)])
    b.output("y", y)
    kg, kc = one_kernel(b.graph)
    rt = load_runtime()
    for cost, pattern in ((10.0, [0, 0, 0]), (500.0, [0, -1, 1])):
        numpy_step = Step(
            "k1", "numpy", "w1", (4,), (1, 2, 3), (4,), get_backend("numpy").build(kg, kc, 2), cost_us=cost
        )
        fused = fuse_native([steps[0], numpy_step, steps[2]], {5}, consts.get, 2)
        exe = Executable(
            {"x": TensorSpec(0, (256, 384), "float32")}, {"t": TensorSpec(5, (256, 96), "float32")}, consts, fused
        )
        assert exe._held_first and exe._hold_steps == pattern
        np.testing.assert_allclose(exe({"x": x})["t"], want, rtol=1e-4, atol=1e-4)
        assert rt.korch_pool_holds() == 0
    from korch.errors import InputError

    with pytest.raises(InputError):
        exe({"x": x[:, :10].copy()})  # a wrong shape: the input check raises while held
    assert rt.korch_pool_holds() == 0


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts 4 bytes past a 64-byte boundary."""
    raw = np.empty(a.size + 32, dtype=a.dtype)
    start = (-raw.ctypes.data % 64) // a.itemsize + 1
    out = raw[start : start + a.size].reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % 64 == 4
    return out


def test_an_input_only_korch_kernels_read_is_not_staged(chain, tmp_path):
    """Note [Unaligned segment inputs]: the segment's input read by its MatMul alone is
    passed as it is, unaligned (structure: nothing staged), with the same numbers; one a
    TVM member reads is still staged, and so is every input of a segment saved without
    the record."""
    steps, consts, x, want = chain
    fused = fuse_native(steps[1:], {5}, consts.get, 2)  # matmul (native) -> tanh (tvm)
    assert fused[0].kernel.meta["aligned_inputs"] == [False]
    spec_in, spec_out = {"e": TensorSpec(1, x.shape, "float32")}, {"t": TensorSpec(5, want.shape, "float32")}
    exe = Executable(spec_in, spec_out, {}, fused)
    assert exe._align_inputs == set()
    e = _misaligned(np.exp(x))
    np.testing.assert_allclose(exe({"e": e})["t"], want, rtol=1e-4, atol=1e-4)
    exe.save(tmp_path)
    np.testing.assert_allclose(Executable.load(tmp_path, 2)({"e": e})["t"], want, rtol=1e-4, atol=1e-4)
    # exp (tvm) reads the graph input: it is staged
    staged = Executable({"x": TensorSpec(0, x.shape, "float32")}, spec_out, {}, fuse_native(steps, {5}, consts.get, 2))
    assert staged._align_inputs == {0}
    np.testing.assert_allclose(staged({"x": _misaligned(x)})["t"], want, rtol=1e-4, atol=1e-4)
    # a segment saved before the record: every input staged
    del fused[0].kernel.meta["aligned_inputs"]
    assert Executable(spec_in, spec_out, {}, fused)._align_inputs == {1}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")
def test_a_hold_pins_the_holding_thread_and_gives_its_mask_back():
    """Note [Pinned threads]: while a thread holds the pool (two threads) it runs on
    the first CPU the process may use; its own mask is back once the last hold goes;
    with one thread nothing is pinned."""
    from korch.kernels.native.toolchain import load_runtime

    rt = load_runtime()
    mask = os.sched_getaffinity(0)
    rt.korch_set_threads(2)
    try:
        rt.korch_pool_hold(1)
        rt.korch_pool_hold(1)  # nested: still pinned
        assert os.sched_getaffinity(0) == {min(mask)}
        rt.korch_pool_hold(0)
        assert os.sched_getaffinity(0) == {min(mask)}
        rt.korch_pool_hold(0)
        assert os.sched_getaffinity(0) == mask and rt.korch_pool_holds() == 0
        rt.korch_set_threads(1)
        rt.korch_pool_hold(1)
        assert os.sched_getaffinity(0) == mask
        rt.korch_pool_hold(0)
    finally:
        rt.korch_set_threads(0)
