"""End to end: every built-in test model optimizes and matches onnxruntime.

Numbers: max normwise relative error <= 1e-4 (float32) against onnxruntime.
Structure: fewer kernels than primitives (fusion happened), every chosen kernel's
inputs are available when it runs (valid order), the outputs are produced, and a
second optimization measures nothing new.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest

import korch
from korch.config import Settings
from korch.ir import GroupOp, Op
from korch.models import NAMES, build

TOL = 1e-4


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    db = tmp_path_factory.mktemp("db") / "results.db"
    # the rewrite search stops by patience, not by the clock, so that a second optimize on
    # a loaded machine rewrites the same way (test_second_optimize_measures_nothing)
    return Settings(
        db_path=str(db),
        progress=False,
        warmup=1,
        repeat=5,
        min_repeat_ms=0.5,
        num_threads=2,
        rewrite_time_limit_s=120.0,
        # no library regions and no end-to-end plan check here: on these small models an
        # onnxruntime region (or the whole graph as one) often wins, by measurement, and
        # the tests below check korch's own kernels (generated kernels, their fusion and
        # memory plan); test_library_regions_and_plan_check turns both on
        library_regions=0,
        region_bias=(),
    )


@pytest.fixture(scope="module")
def compiled(settings, tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            cache[name] = (korch.optimize(build(name), output_dir=out, settings=settings), out)
        return cache[name]

    return get


def _check_order(model):
    exe = model.executable
    available = {s.node for s in exe.inputs.values()} | set(exe.consts)
    for step in exe.steps:
        missing = [n for n in step.inputs if n not in available]
        assert not missing, f"{step.name} reads {missing} before they are produced"
        available |= set(step.outputs)
    for name, spec in exe.outputs.items():
        assert spec.node in available, f"output {name} never produced"


@pytest.mark.parametrize("name", NAMES)
def test_model_matches_onnxruntime(name, compiled):
    model, _ = compiled(name)
    r = model.report
    assert r["max_rel_error"] <= TOL, r
    assert r["skipped"] == [], r["skipped"]  # no optimization raised (issue 26)
    _check_order(model)
    g = model.graph
    assert r["kernels_chosen"] < r["primitives"]
    assert r["primitives"] == len(g.compute_ids())
    # every chosen kernel was measured (finite cost) and has a backend
    assert all(s.backend for s in model.executable.steps)


def _conv_concat_conv() -> onnx.ModelProto:
    """Two convolutions of one input (3x3 and 1x1: not merged), concatenated on channels
    at batch 1, read by a third: nothing can fuse the concat, so it is a kernel alone."""
    from korch.models.zoo import _Net

    n = _Net("conv_concat_conv", 0)
    x = n.input("x", (1, 16, 16, 16))
    a = n.op("Relu", [n.conv(x, 16, 16, 3, pad=1)])
    b = n.conv(x, 16, 16, 1)
    n.output(n.conv(n.op("Concat", [a, b], axis=1), 32, 16, 1), (1, 16, 16, 16))
    return n.model()


def test_a_concat_runs_as_a_view_in_a_segment(settings, tmp_path):
    """Note [Views in a segment]: the concat costs the BLP VIEW_US and runs nothing in
    its segment (its inputs' convolutions write into its blocks); the model matches
    onnxruntime."""
    from korch.executable.views import VIEW_US

    model = korch.optimize(_conv_concat_conv(), output_dir=tmp_path, settings=settings)
    g = model.graph
    assert model.report["max_rel_error"] <= TOL
    views = {n for s in model.executable.steps if s.backend == "native-segment" for n in s.kernel.meta["views"]}
    concats = [s for s in model.executable.kernel_steps() if Op.CONCAT in [g.nodes[n].op for n in s.nodes]]
    assert len(concats) == 1 and len(concats[0].nodes) == 1
    assert concats[0].cost_us == VIEW_US and concats[0].name in views


def test_attention_softmax_is_fused(compiled):
    model, _ = compiled("attention")
    g = model.graph
    soft = [i for i, n in enumerate(g.nodes) if n.op in (Op.REDUCE_MAX, Op.EXP)]
    assert soft, "attention model has a softmax"
    steps = model.executable.kernel_steps()  # a native segment's kernels one by one
    # the max-reduction, the exponent and the row sum of a softmax share kernels:
    # fewer kernels touch them than there are softmax primitives
    sm_prims = [i for i, n in enumerate(g.nodes) if n.op in (Op.REDUCE_MAX, Op.EXP, Op.REDUCE_SUM)]
    touching = [s for s in steps if set(s.nodes) & set(sm_prims)]
    assert len(touching) < len(sm_prims)
    memory_prims = [i for i in g.compute_ids() if g.nodes[i].op in GroupOp.MEMORY_BOUND]
    memory_kernels = [s for s in steps if s.backend == "tvm"]
    assert len(memory_kernels) < len(memory_prims)


def test_attention_rewrites_end_to_end(compiled):
    # rewrites are on by default: the softmax . V row sum (or the Q/K/V merge) went
    # through every later stage and the executable still matches onnxruntime
    model, _ = compiled("attention")
    r = model.report
    applied = r["rewrites_applied"]
    assert applied.get("softmax_matmul_rowsum", 0) + applied.get("merge_matmul_shared_lhs", 0) >= 1, r
    assert r["rewrite_cost_after"] <= r["rewrite_cost_before"]
    assert r["max_rel_error"] <= TOL


def test_second_optimize_measures_nothing(compiled, settings):
    import sqlite3

    compiled("mlp")
    with sqlite3.connect(settings.db_path) as conn:
        before = conn.execute("SELECT MAX(id) FROM measurements").fetchone()[0]
    again = korch.optimize(build("mlp"), settings=settings, measure=False)
    with sqlite3.connect(settings.db_path) as conn:
        new = conn.execute(
            "SELECT m.backend, m.status, w.kind, w.n_primitives, m.config, w.hash FROM measurements m"
            " JOIN workloads w ON w.hash = m.workload WHERE m.id > ?",
            (before,),
        ).fetchall()
    assert again.report["candidates_measured"] == 0, (again.report["rewrites_applied"], new)
    assert again.report["measurements_cached"] == again.report["measurements_requested"] > 0


def test_opaque_operator_runs_through_fallback(compiled):
    """The example's opaque TopK runs in onnxruntime (the fallback for any opaque
    operator) or, on the cpu target with native segments, in korch's runtime (Note
    [Native TopK]); either way a step computes it."""
    model, _ = compiled("opaque")
    opaque = {nid for nid, n in enumerate(model.graph.nodes) if n.op is Op.OPAQUE}
    assert opaque
    steps = model.executable.kernel_steps()
    runs = [s.backend for s in steps if opaque & set(s.nodes)]
    assert runs and set(runs) <= {"ort", "native"}


def test_save_load_and_cli_run(compiled, tmp_path):
    model, out = compiled("candy_block")
    loaded = korch.load(out)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal(s.shape).astype(s.dtype) for n, s in loaded.executable.inputs.items()}
    want = model(feeds)
    got = loaded(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    np.savez(tmp_path / "in.npz", **feeds)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "korch",
            "run",
            str(out),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--save",
            str(tmp_path / "out.npz"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    with np.load(tmp_path / "out.npz") as z:
        for k in want:
            np.testing.assert_allclose(z[k], want[k], rtol=1e-6)
    with pytest.raises(korch.InputError, match="shape"):
        loaded({k: v[..., :1] for k, v in feeds.items()})


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    proc = subprocess.run(
        [sys.executable, "-m", "korch", "optimize", str(bad), "-o", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("korch: error:")
    assert "Traceback" not in proc.stderr


def test_runtime_threads_chosen_saved_and_followed(compiled):
    """Note [Runtime threads]: the faster of 2 and 1 threads end to end is kept and saved;
    switching every kernel's thread count leaves the outputs as they were."""
    import json

    from korch.profile.e2e import max_rel_error

    model, out = compiled("mlp")
    r = model.report
    assert r["runtime_threads"] in (1, 2)
    native_only = all(st.backend == "native-segment" for st in model.executable.steps)
    if native_only:  # one pool: all threads, untimed
        assert r["runtime_threads"] == 2 and r["threads_check"] == "skipped: native segments only"
        return
    assert set(r["threads_ms"]) == {"1", "2"} and all(v > 0 for v in r["threads_ms"].values())
    # one thread only when it wins by round-relative time (Note [Timing in blocks]), by
    # median and in most rounds (korch.selection.beats)
    from korch.selection import beats

    t = {
        k: {"rel": r["threads_rel"][k], "median_ms": r["threads_ms"][k], "round_ms": r["threads_round_ms"][k]}
        for k in ("1", "2")
    }
    assert r["runtime_threads"] == (1 if beats(t["1"], t["2"]) else 2)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["threads"] == r["runtime_threads"]
    exe = korch.load(out).executable
    assert exe.threads == r["runtime_threads"]
    feeds = {n: np.random.default_rng(5).standard_normal(s.shape).astype(s.dtype) for n, s in exe.inputs.items()}
    want = exe(feeds)
    for n in (2, 1, 2):
        exe.set_threads(n)
        # a different thread count splits reductions differently: same numbers up to rounding
        assert max_rel_error(exe(feeds), want) <= 1e-5


@pytest.mark.parametrize("name", ["attention", "candy_block"])
def test_static_memory_plan(name, settings, tmp_path):
    # Note [Static memory plan]: generated kernels write into one arena; no two tensors
    # live at once overlap in it, a second call does not change the first call's
    # outputs, and the results equal the kernels' own (allocating) calls. Without native
    # segments, which keep their tensors in arenas of their own (Note [Native segment]).
    from korch.executable import ARENA_ALIGN

    no_native = dataclasses.replace(settings, native=False)
    exe = korch.optimize(build(name), output_dir=tmp_path, settings=no_native).executable
    offs = exe._arena_offsets
    assert offs and exe.buffer_stats["arena_bytes"] >= max(offs.values())
    assert all(o % ARENA_ALIGN == 0 for o in offs.values())
    produced = {n: i for i, st in enumerate(exe.steps) for n in st.outputs}
    last = {}
    for i, st in enumerate(exe.steps):
        for n in st.inputs:
            last[n] = i
    size = {n: int(np.prod(exe._arena_specs[n][0])) * exe._arena_specs[n][1].itemsize for n in offs}
    nodes = sorted(offs)
    for a in nodes:
        for b in nodes:
            if a < b and produced[a] <= last.get(b, produced[b]) and produced[b] <= last.get(a, produced[a]):
                assert offs[a] + size[a] <= offs[b] or offs[b] + size[b] <= offs[a], (a, b)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s.shape).astype(s.dtype) for n, s in exe.inputs.items()}
    first = exe(feeds)
    kept = {k: v.copy() for k, v in first.items()}
    exe({n: rng.standard_normal(s.shape).astype(s.dtype) for n, s in exe.inputs.items()})
    for k in kept:
        np.testing.assert_array_equal(first[k], kept[k])
    # the same kernels through their own calls (no plan)
    env = dict(exe.check_inputs(feeds))
    env.update(exe.consts)
    for st in exe.steps:
        env.update(zip(st.outputs, st.kernel([env[i] for i in st.inputs])))
    for k, spec in exe.outputs.items():
        np.testing.assert_allclose(first[k], env[spec.node], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["candy_block", "yolo_block"])
def test_library_regions_and_plan_check(name, settings, tmp_path):
    """Conv chains get library regions (Note [Library regions]); the plan check times
    the BLP's plan, the region-biased ones, the BLP on in-place costs and the whole
    graph as one onnxruntime kernel, and keeps the fastest (Note [End-to-end plan
    check]); whichever it keeps
    matches onnxruntime."""
    model = korch.optimize(
        build(name), output_dir=tmp_path, settings=settings.replace(library_regions=3, region_bias=(0.7, 0.4))
    )
    r = model.report
    assert r["region_candidates"] >= 1
    pc = r["plan_check"]
    assert "blp" in pc["ms"] and "one region" in pc["ms"] and pc["kept"] in pc["ms"]
    # kept by round-relative time (Note [Timing in blocks])
    # (or the one-kernel baseline: Note [Keeping a plan over the baseline])
    assert set(pc["rel"]) == set(pc["ms"])
    # (or the model as one kernel: Note [The model as a plan])
    from korch.selection import MODEL_PLAN

    assert MODEL_PLAN in pc["ms"]
    assert (
        pc["rel"][pc["kept"]] == min(pc["rel"].values())
        or pc["kept"].startswith("one region")
        or (pc["kept"] == MODEL_PLAN)
    )
    # the BLP plan's kernels were timed in place: a ratio per kernel kind it used, a
    # library's kernels between native segments apart (Note [A step outside the segments])
    assert pc["in_place_scale"] and all(v > 0 for v in pc["in_place_scale"].values())
    kinds = {"memory", "linear", "opaque", "region"}
    assert set(pc["in_place_scale"]) <= kinds | {f"{k}/library" for k in kinds}
    if pc["kept"] == "one region":
        assert len(model.executable.steps) == 1 and model.executable.steps[0].backend == "ort"
    assert r["max_rel_error"] <= TOL
    _check_order(model)


def test_unrewritten_plan_runs_the_original_graph(settings, tmp_path):
    """The plan check's "one region, unrewritten" plan: the graph before rewrites as one
    onnxruntime kernel, wired to the rewritten graph's inputs and outputs by name; it
    matches onnxruntime and survives save/load."""
    from korch.executable import Executable
    from korch.pipeline import plan_inputs, run_pipeline
    from korch.selection import _model_plan, _unrewritten_plan

    ctx = run_pipeline(build("attention"), settings, measure=False)
    assert ctx.report["rewrites_applied"] and ctx.fissioned is not ctx.graph

    plan = _unrewritten_plan(plan_inputs(ctx))
    chosen, exe = plan.chosen, plan.executable
    assert plan.family == "baseline" and len(chosen) == 1 and len(exe.steps) == 1 and exe.steps[0].backend == "ort"
    assert set(exe.steps[0].nodes) == set(ctx.graph.compute_ids())
    # Note [The model as a plan]: the model as loaded, one kernel, wired by name
    as_model = _model_plan(plan_inputs(ctx)).executable
    assert len(as_model.steps) == 1 and as_model.steps[0].kernel._model_bytes == ctx.model.SerializeToString()
    model = build("attention")
    feeds = korch.models.random_inputs(model)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    exe.save(tmp_path)
    as_model.save(tmp_path / "m")
    for e in (exe, Executable.load(tmp_path), as_model, Executable.load(tmp_path / "m")):
        got = e(feeds)
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_a_partition_whose_candidates_all_failed_runs_on_onnxruntime(settings, tmp_path, monkeypatch):
    """Note [Unmeasurable partitions]: every candidate writing the first MatMul's output
    'failed' its measurement; the optimization still completes, onnxruntime runs that
    part at the penalty cost, the report names the partition, and the result matches."""
    import onnxruntime as ort

    import korch.pipeline as P

    real = dict(P.STEPS)["profile"]

    def failing_profile(ctx):
        real(ctx)
        g = ctx.graph
        mm = next(n for n in g.compute_ids() if g.nodes[n].op is Op.MATMUL)
        for c in ctx.candidates:
            if mm in c.kernel.nodes:
                c.cost_us, c.backend = float("inf"), ""

    monkeypatch.setattr(P, "STEPS", [(n, failing_profile if n == "profile" else f) for n, f in P.STEPS])
    model = build("mlp")
    compiled = korch.optimize(model, output_dir=tmp_path, settings=settings.replace(library_regions=1))
    r = compiled.report
    assert r["unmeasured_partitions"]
    assert any(s.backend == "ort" for s in compiled.executable.steps)
    feeds = korch.models.random_inputs(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = compiled(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_plan_check_builds_no_more_plans_once_memory_is_full(settings, tmp_path, monkeypatch):
    """With the process over PLAN_MEMORY_SHARE of the machine's memory (forced to 0
    here), the plan check builds nothing beyond the BLP's plan, counts the skipped
    plans and keeps the BLP's plan; the result matches."""
    import korch.selection

    monkeypatch.setattr(korch.selection, "PLAN_MEMORY_SHARE", 0.0)
    compiled = korch.optimize(
        build("mlp"), output_dir=tmp_path, settings=settings.replace(library_regions=3, region_bias=(0.7,))
    )
    r = compiled.report
    assert r["plans_skipped_for_memory"] >= 1 and r["plan_check"] == {"plans": 1}
    assert r["max_rel_error"] <= TOL


def test_lean_plan_check_builds_times_and_frees_one_plan_at_a_time(settings, tmp_path, monkeypatch):
    """Note [Lean plan check]: with the BLP's plan over LEAN_SHARE of memory (forced to
    0 here) every plan is built, timed alone and freed, and the winner is built again:
    at most one plan is alive at any time, and the kept plan matches onnxruntime."""
    import gc

    import korch.pipeline
    import korch.selection

    monkeypatch.setattr(korch.selection, "LEAN_SHARE", 0.0)

    def alive() -> int:
        return sum(1 for o in gc.get_objects() if type(o).__name__ == "Executable")

    gc.collect()
    before, most = alive(), [0]  # other tests' executables may still be alive
    build_step = korch.pipeline._build

    def counting_build(ctx, chosen):
        exe = build_step(ctx, chosen)
        most[0] = max(most[0], alive() - before)
        return exe

    monkeypatch.setattr(korch.pipeline, "_build", counting_build)
    compiled = korch.optimize(
        build("mlp"), output_dir=tmp_path, settings=settings.replace(library_regions=3, region_bias=(0.7,))
    )
    pc = compiled.report["plan_check"]
    assert pc["lean"] is True
    assert {"blp", "one region"} <= set(pc["ms"]) and pc["kept"] in pc["ms"]
    assert all(v > 0 for v in pc["ms"].values())
    assert most[0] <= 2  # the plan just built, and at most one the collector has not reached
    assert compiled.report["max_rel_error"] <= TOL


def _matmul_relu() -> onnx.ModelProto:
    """x -> MatMul -> Relu: its input is read by a linear kernel only."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "matmul_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("name", ["matmul_relu", "chain6"])
def test_inputs_are_copied_to_alignment_only_for_generated_kernels(name, settings, tmp_path):
    """check_inputs makes the one aligned copy of a graph input only when a generated
    (fast-path) kernel reads it; an input only library kernels read is passed as is
    (numpy arrays are 16-byte aligned, so the copy was made on every call)."""
    from korch.kernels.base import ALIGN

    model = _matmul_relu() if name == "matmul_relu" else build(name)
    if name == "matmul_relu":  # its MatMul from a library: the native one, now faster, reads aligned inputs
        settings = dataclasses.replace(settings, native=False)
    exe = korch.optimize(model, output_dir=tmp_path, settings=settings).executable
    fast_reads = {i for st, f in zip(exe.steps, exe._fast) if f is not None for i in st.inputs}
    rng = np.random.default_rng(0)
    feeds = {}
    for n, s in exe.inputs.items():
        buf = np.empty(int(np.prod(s.shape)) + 16, s.dtype)
        off = next(k for k in range(16) if (buf.ctypes.data + 4 * k) % ALIGN != 0)  # misaligned on purpose
        feeds[n] = buf[off : off + int(np.prod(s.shape))].reshape(s.shape)
        feeds[n][...] = rng.standard_normal(s.shape)
    env = exe.check_inputs(feeds)
    for n, s in exe.inputs.items():
        if s.node in fast_reads:
            assert env[s.node] is not feeds[n] and env[s.node].ctypes.data % ALIGN == 0
        else:
            assert env[s.node] is feeds[n]
    # the copy goes into the thread's staging slot, the same memory on every call (Note [Input staging])
    again = exe.check_inputs(feeds)
    for s in exe.inputs.values():
        if s.node in fast_reads:
            assert again[s.node].ctypes.data == env[s.node].ctypes.data
    # chain6's first kernel is generated; matmul_relu's input goes to a library MatMul
    assert bool(exe._align_inputs) == (name == "chain6")
    want = exe({n: np.ascontiguousarray(v) for n, v in feeds.items()})
    for k, v in exe(feeds).items():
        np.testing.assert_array_equal(v, want[k])


def test_a_plan_replaces_the_one_kernel_baseline_only_when_faster_by_every_measure():
    """Note [Keeping a plan over the baseline]."""
    from korch.selection import _keep

    def t(rel, median, rounds):
        return {"rel": rel, "median_ms": median, "round_ms": rounds}

    base = [10.0] * 10
    # first by relative time but slower by median (bert2_b1's case): the baseline stays
    assert _keep({"x": t(0.94, 16.3, [9.0] * 10), "one region, unrewritten": t(0.99, 13.7, base)}) == (
        "one region, unrewritten"
    )
    # faster by both, but in only 6 of 10 rounds: the baseline stays
    assert _keep({"x": t(0.95, 9.5, [9.0] * 6 + [11.0] * 4), "one region": t(1.0, 10.0, base)}) == "one region"
    # faster by both and in 8 of 10 rounds: kept
    assert _keep({"x": t(0.95, 9.5, [9.0] * 8 + [11.0] * 2), "one region": t(1.0, 10.0, base)}) == "x"
    # the unrewritten graph is the baseline when both one-kernel plans exist
    both = {
        "x": t(0.9, 9.0, [9.0] * 10),
        "one region": t(0.95, 9.5, base),
        "one region, unrewritten": t(1.0, 9.9, base),
    }
    assert _keep(both) == "x"
    assert _keep({"x": t(0.95, 9.0, [9.0] * 10)}) == "x"  # no baseline: the best by relative time
    # the model as one onnxruntime kernel comes first (Note [The model as a plan]): a
    # one-region plan faster in only half the rounds does not replace it
    from korch.selection import MODEL_PLAN

    half = [9.0] * 5 + [11.0] * 5
    assert _keep({"one region": t(0.95, 9.5, half), MODEL_PLAN: t(1.0, 10.0, base)}) == MODEL_PLAN
    assert _keep({"one region": t(0.95, 9.5, [9.0] * 10), MODEL_PLAN: t(1.0, 10.0, base)}) == "one region"


class _FakeExecutable:
    """What step_threads needs of an executable; ``calls`` records each call's thread count."""

    def __init__(self, steps=None):
        from korch.executable import TensorSpec

        self.inputs = {"x": TensorSpec(0, (2,), "float32")}
        if steps is not None:
            self.steps = steps
        self.threads = 0
        self.calls: list[int] = []

    def set_threads(self, n):
        self.threads = n

    def __call__(self, feeds):
        self.calls.append(self.threads)
        return {}


def test_thread_check_is_skipped_for_long_calls(monkeypatch):
    """Note [Runtime threads]: an executable whose call takes longer than
    THREADS_CHECK_MAX_MS keeps num_threads untimed."""
    import types

    import korch.pipeline as P

    slow = _FakeExecutable()
    calls = slow.calls
    monkeypatch.setattr(P, "THREADS_CHECK_MAX_MS", -1.0)  # every call counts as long
    ctx = types.SimpleNamespace(executable=slow, settings=Settings(num_threads=2), report={})
    P.step_threads(ctx)
    assert ctx.report["runtime_threads"] == 2 and ctx.report["threads_check"].startswith("skipped")
    assert calls == [2] and ctx.executable.threads == 2


def test_threads_not_timed_for_native_segments_only():
    # Note [Runtime threads]: korch's one pool runs everything; the check is skipped
    import types

    import korch.pipeline as P

    native_only = _FakeExecutable(steps=[types.SimpleNamespace(backend="native-segment")] * 2)
    calls = native_only.calls
    ctx = types.SimpleNamespace(executable=native_only, settings=Settings(num_threads=2), report={})
    P.step_threads(ctx)
    assert ctx.report == {"runtime_threads": 2, "threads_check": "skipped: native segments only"}
    assert calls == [] and ctx.executable.threads == 2
    # a step outside the segments: timed as before
    ctx.executable.steps = [types.SimpleNamespace(backend="native-segment"), types.SimpleNamespace(backend="ort")]
    P.step_threads(ctx)
    assert "threads_ms" in ctx.report and calls


def test_lean_check_keeps_a_one_kernel_plan_unless_clearly_beaten():
    # Note [Lean plan check]: plans timed apart; a plan of many kernels needs LEAN_MARGIN
    from korch.selection import LEAN_MARGIN, _lean_keep

    close = {"one region": 1075.0, "regions x0.4": 1031.0, "the model": 1852.0}
    assert _lean_keep(close) == "one region"
    clear = {"one region": 1075.0, "regions x0.4": 1075.0 * (1 - 2 * LEAN_MARGIN), "the model": 1852.0}
    assert _lean_keep(clear) == "regions x0.4"
    assert _lean_keep({"blp": 5.0, "regions x0.7": 4.0}) == "regions x0.7"  # no one-kernel plan
    assert _lean_keep({"the model": 3.0, "one region": 2.0}) == "one region"


def test_near_tie_plan_makes_only_kernels_outside_the_plan_cheaper():
    """Note [End-to-end plan check], near ties: the kernels of the BLP's plan keep their
    cost, every other one is ``confirm_margin`` cheaper (an unmeasured one stays
    infinite); with no margin there is no near-tie plan. The fewer-kernels plan charges
    every kernel FEWER_KERNELS_US more."""
    import types

    from korch.selection import FEWER_KERNELS_US, _near_tie_costs

    cands = [
        types.SimpleNamespace(partition=0, kernel=types.SimpleNamespace(nodes=(1, 2)), cost_us=10.0),
        types.SimpleNamespace(partition=0, kernel=types.SimpleNamespace(nodes=(1,)), cost_us=8.0),
        types.SimpleNamespace(partition=1, kernel=types.SimpleNamespace(nodes=(1, 2)), cost_us=4.0),
        types.SimpleNamespace(partition=1, kernel=types.SimpleNamespace(nodes=(3,)), cost_us=math.inf),
    ]
    ctx = types.SimpleNamespace(settings=Settings(confirm_margin=0.25))
    [(name, cost), (name2, cost2)] = _near_tie_costs(ctx, [cands[0]])
    assert (name, name2) == ("near ties", "fewer kernels")
    assert [cost(c) for c in cands] == [10.0, 6.0, 3.0, math.inf]
    f = FEWER_KERNELS_US
    assert [cost2(c) for c in cands] == [10.0 + f, 8.0 + f, 4.0 + f, math.inf]
    [(name, _)] = _near_tie_costs(types.SimpleNamespace(settings=Settings(confirm_margin=0.0)), [cands[0]])
    assert name == "fewer kernels"


def test_plan_check_without_whole_graph_plans_races_composed_plans(settings, tmp_path):
    """``Settings.whole_plans`` False: the plan check times no plan of one onnxruntime
    kernel over the whole graph, only the plans korch composed (the BLP's, region-biased,
    near ties, fewer kernels, in place), keeps the fastest by round-relative time, and it matches."""
    from korch.selection import WHOLE_PLANS

    compiled = korch.optimize(
        build("yolo_block"),
        output_dir=tmp_path,
        settings=settings.replace(library_regions=3, region_bias=(0.7, 0.4), whole_plans=False),
    )
    pc = compiled.report["plan_check"]
    assert "blp" in pc["ms"] and not set(WHOLE_PLANS) & set(pc["ms"])
    assert pc["rel"][pc["kept"]] == min(pc["rel"].values())
    raced = {"blp", "regions x0.7", "regions x0.4", "near ties", "fewer kernels", "in place 1", "in place 2"}
    raced |= {"composed", "composed, in place 1", "composed, in place 2"}  # Note [The composed plan]
    assert set(pc["ms"]) <= raced
    assert compiled.report["max_rel_error"] <= TOL
    _check_order(compiled)


@pytest.mark.parametrize("name", ["candy_block", "yolo_block"])
def test_composed_pass_measures_the_plan_without_regions(name, settings, tmp_path, monkeypatch):
    """Note [Composed pass]: with library regions among the candidates, the guided
    rounds run again without them, so the BLP with regions left out (Note [The composed
    plan]) chooses measured kernels only; and the plan check races that plan. Regions
    here measure a hundred times faster than they run, so the first rounds settle on
    them and measure little else (candy_b1's rounds did so at their real cost)."""
    import types

    import korch.profile
    from korch.ir.subgraph import KernelKind
    from korch.orchestrate.choose import UNMEASURED_PENALTY_US
    from korch.pipeline import STEPS, Context, _solve_all
    from korch.selection import COMPOSED_PLAN, _alternative_costs, _composed_cost

    real = korch.profile.profile

    def fast_regions(workloads, *args, **kw):
        results, stats = real(workloads, *args, **kw)
        regions = {w.hash for w in workloads if w.kind is KernelKind.REGION}
        for key, m in results.items():
            if key[0] in regions and m.ok:
                results[key] = dataclasses.replace(m, median_us=m.median_us / 100)
        return results, stats

    monkeypatch.setattr(korch.profile, "profile", fast_regions)
    s = settings.replace(library_regions=3, region_bias=(0.7,), db_path=str(tmp_path / "db"))
    ctx = Context(s, build(name), None)
    for step, fn in STEPS:
        fn(ctx)
        if step == "profile":
            break
    assert ctx.report["profiling_composed_rounds"] >= 1
    assert any(c.kind is KernelKind.REGION for c in ctx.candidates)
    chosen = _solve_all(ctx, _composed_cost)
    assert chosen and all(c.kind is not KernelKind.REGION for c in chosen)
    assert all(math.isfinite(c.cost_us) and c.cost_us < UNMEASURED_PENALTY_US for c in chosen)
    inp = types.SimpleNamespace(candidates=ctx.candidates, settings=s)
    assert COMPOSED_PLAN in [n for n, _ in _alternative_costs(inp, chosen)]
