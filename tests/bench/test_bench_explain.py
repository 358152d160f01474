"""`korch bench` and `korch explain` on a tiny built-in model (fast: no profiling, no torch).

The executable is built by the real pipeline with the profiling step replaced by a
deterministic cost (fewer, larger kernels are cheaper), so the test needs no
measurements: only the few chosen kernels are compiled.
"""

from __future__ import annotations

import json
import re

import pytest

import korch.pipeline as P
from korch.config import Settings
from korch.models import save


def _fake_profile(ctx) -> None:
    for c in ctx.candidates:
        c.backend = c.backends[0]
        c.cost_us = 10.0 + len(c.kernel.nodes)


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    model = save("mlp", root / "mlp.onnx")
    steps = [(name, _fake_profile if name == "profile" else fn) for name, fn in P.STEPS]
    mp = pytest.MonkeyPatch()
    mp.setattr(P, "STEPS", steps)
    try:
        from korch.api import optimize

        settings = Settings(db_path=str(root / "r.db"), progress=False, num_threads=2, max_kernel_size=8)
        optimize(model, output_dir=root / "out" / "mlp", settings=settings, measure=False)
    finally:
        mp.undo()
    return root, model


def test_bench_ort_only_prints_table_and_writes_json(optimized, capsys):
    from korch.cli import main

    root, model = optimized
    rc = main(
        ["bench", str(model), "-o", str(root / "out"), "--peers", "ort", "--rounds", "5", "--no-plot", "--threads", "2"]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "| model" in out and "korch ms" in out and "| mlp" in out
    rows = json.loads((root / "out" / "bench.json").read_text())["rows"]
    (row,) = rows
    assert row["model"] == "mlp" and row["korch_from"] == "loaded"
    assert set(row["ms"]) == {"korch", "ort"}
    assert row["max_rel_err_korch"] <= 1e-4
    assert row["best_peer"] == "ort" and row["speedup_vs_best"] > 0
    assert row["load_before"] and row["load_after"]


def test_bench_rejects_unknown_peer(optimized, capsys):
    from korch.cli import main

    _, model = optimized
    assert main(["bench", str(model), "--peers", "ort,nope"]) == 2
    assert "unknown peer" in capsys.readouterr().err


def test_explain_breakdown_and_svg(optimized, capsys, tmp_path):
    from korch.api import load
    from korch.cli import main

    root, _ = optimized
    outdir = root / "out" / "mlp"
    pic = tmp_path / "pic"
    js = tmp_path / "explain.json"
    rc = main(["explain", str(outdir), "--runs", "5", "--renderer", "python", "--picture", str(pic), "--json", str(js)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "dispatch overhead" in out and "top" in out and "us dispatch per kernel" in out
    assert "plan shipped: " in out and "% of end-to-end time in korch-generated kernels" in out
    info = json.loads(js.read_text())
    # each kernel's predicted cost is the profiler's (here the fake 10 us + 1 a
    # primitive), plus the hand-off of a library step between native segments (Note [A
    # step outside the segments]); a baseline plan's one kernel has none
    from korch.orchestrate.plan import FOREIGN_STEP_US, SEGMENT_BACKENDS

    for k in info["kernels"]:
        if k["predicted_us"] is not None:
            extra = k["predicted_us"] - (10.0 + k["primitives"])
            assert extra == 0.0 if k["backend"] in SEGMENT_BACKENDS else extra in (0.0, FOREIGN_STEP_US), k
    assert info["report"]["plan_family"] in ("composed", "baseline")
    assert (info["report"]["plan_family"] == "baseline") == all(k["predicted_us"] is None for k in info["kernels"])
    assert 0.0 <= info["generated_share"] <= 1.0 and info["dispatch_us_per_kernel"] >= 0
    kernel_sum = sum(k["us"] for k in info["kernels"])
    assert kernel_sum <= info["end_to_end_us"] + 1e-9
    assert info["dispatch_us"] >= 0
    # Note [Segment overhead]: kernels, dispatch and the kernels' skew above their medians
    # account for the call (up to the clamps at zero)
    assert info["spread_us"] >= 0
    assert kernel_sum + info["dispatch_us"] + info["spread_us"] == pytest.approx(
        info["end_to_end_us"], rel=0.05, abs=50
    )
    steps = load(outdir).executable.kernel_steps()  # a native segment's kernels one by one
    assert len(info["kernels"]) == len(steps)
    svg = (tmp_path / "pic.svg").read_text()
    assert svg.startswith("<svg")
    for st in steps:
        assert re.search(rf'id="{re.escape(st.name)}"', svg), st.name
    dot = (tmp_path / "pic.dot").read_text()
    assert all(st.name in dot for st in steps)


def test_explain_marks_redundant_primitives():
    from korch.bench.explain import to_dot, to_svg

    class St:
        def __init__(self, name, nodes, inputs, outputs):
            self.name, self.backend, self.nodes, self.inputs, self.outputs = name, "tvm", nodes, inputs, outputs

    g = {
        "nodes": [
            {"op": "input", "class": "source", "inputs": [], "shape": [4], "dtype": "float32"},
            {"op": "exp", "class": "elementwise", "inputs": [0], "shape": [4], "dtype": "float32"},
            {"op": "neg", "class": "elementwise", "inputs": [1], "shape": [4], "dtype": "float32"},
            {"op": "abs", "class": "elementwise", "inputs": [1], "shape": [4], "dtype": "float32"},
        ],
        "inputs": {"x": 0},
        "outputs": {"a": 2, "b": 3},
    }
    steps = [St("k0", (1, 2), (0,), (2,)), St("k1", (1, 3), (0,), (3,))]
    kernels = [{"name": s.name, "us": 1.0, "ops": "exp+x", "class": "memory"} for s in steps]
    info = {"graph": g, "steps": steps, "kernels": kernels, "outdir": "t", "end_to_end_us": 3.0}
    dot = to_dot(info)
    assert dot.count("peripheries=2") == 2  # exp is computed by both kernels
    svg = to_svg(info)
    assert svg.count('stroke="#d7191c"') == 2


def test_bench_reports_a_torch_peer_that_cannot_be_rebuilt(optimized, capsys, tmp_path):
    # the sidecar's builder raising (segformer's transformers import did) must not end
    # the run: the torch peers are reported as skipped and the rest is measured
    pytest.importorskip("torch")
    from korch.bench.peers import sidecar_path
    from korch.cli import main

    root, model = optimized
    script = tmp_path / "bad_builder.py"
    script.write_text("def build(name, batch, seed):\n    raise RuntimeError('cannot import the model class')\n")
    sidecar = sidecar_path(model)
    sidecar.write_text(json.dumps({"script": str(script), "builder": "mlp"}))
    try:
        rc = main(
            ["bench", str(model), "-o", str(root / "out"), "--peers", "ort,eager,compile", "--rounds", "3"]
            + ["--no-plot", "--threads", "2"]
        )
    finally:
        sidecar.unlink()
    assert rc == 0
    (row,) = json.loads((root / "out" / "bench.json").read_text())["rows"]
    assert set(row["ms"]) == {"korch", "ort"}
    assert "RuntimeError" in row["skipped"]["eager"] and row["skipped"]["compile"] == row["skipped"]["eager"]


def test_bench_in_process_flag_keeps_every_engine_here(optimized):
    import importlib.util

    from korch.cli import main

    root, model = optimized
    peers = ["ort", "ov"] if importlib.util.find_spec("openvino") else ["ort"]
    rc = main(
        ["bench", str(model), "-o", str(root / "out"), "--peers", ",".join(peers), "--rounds", "3", "--no-plot"]
        + ["--threads", "2", "--in-process", "--json", str(root / "inproc.json")]
    )
    assert rc == 0
    (row,) = json.loads((root / "inproc.json").read_text())["rows"]
    assert row["isolated"] is False and set(row["ms"]) == {"korch", *peers} and row["processes"] == 1
    assert all(err <= 1e-4 for err in row["rel_err"].values())
    assert row["max_rel_err_korch"] <= 1e-4


def test_engine_process_runs_and_times_an_engine_in_its_own_process(optimized):
    # Note [Engines in their own processes]: outputs and self-timed blocks come back
    import os

    import numpy as np

    from korch.api import load
    from korch.bench.isolate import EngineProcess
    from korch.bench.suite import bench_feeds
    from korch.errors import KorchError
    from korch.profile.e2e import ort_session, time_alternating

    root, model = optimized
    feeds = bench_feeds(load(root / "out" / "mlp").executable.inputs)
    sess = ort_session(open(model, "rb").read(), 1)
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    ort = EngineProcess("ort", model, feeds, names, 1)
    kor = EngineProcess("korch", root / "out" / "mlp", feeds, names, 1)
    try:
        assert ort._proc.pid != os.getpid() and kor._proc.pid != ort._proc.pid
        for e in (ort, kor):
            got = e.outputs()
            for n in names:
                np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-5)
        times = ort.block(4)
        assert len(times) == 4 and all(t > 0 for t in times)
        out = time_alternating({"ort": ort, "korch": kor}, rounds=3, block=3)
        assert out["ort"]["runs"] == out["korch"]["runs"] == 3 * 2
    finally:
        ort.close()
        kor.close()
    with pytest.raises(KorchError, match="korch engine failed during start"):
        EngineProcess("korch", root / "no-such-folder", feeds, names, 1)


def test_bench_optimizes_in_a_process_of_its_own(tmp_path):
    """With engines isolated, `korch bench` optimizes in a child process, so the memory
    the optimization held is gone before the engines start; the executable it wrote is
    the one loaded, and it runs."""
    from pathlib import Path

    import numpy as np

    from korch.bench.suite import _korch_executable, bench_feeds

    model = Path(save("mlp", tmp_path / "mlp.onnx"))
    settings = Settings(db_path=str(tmp_path / "r.db"), progress=False, num_threads=2, max_kernel_size=8)
    out = tmp_path / "out" / "mlp"
    compiled, opt_s, how = _korch_executable(model, out, settings, reoptimize=True, in_child=True)
    assert how == "optimized now" and (out / "plan.json").exists()
    assert opt_s == json.loads((out / "report.json").read_text())["optimize_seconds"]
    got = compiled(bench_feeds(compiled.executable.inputs))
    assert all(np.isfinite(v).all() for v in got.values())


def test_bench_openvino_peer_at_fp32_over_two_process_sets(optimized):
    # the ov peer compiles at f32 and matches onnxruntime; each engine is timed in two
    # fresh processes and the row's median is over them (Note [Medians over processes]);
    # openvino is in the test extra, so this runs wherever the tests do
    from korch.cli import main

    root, model = optimized
    rc = main(
        ["bench", str(model), "-o", str(root / "out"), "--peers", "ort,ov", "--rounds", "4", "--processes", "2"]
        + ["--no-plot", "--threads", "2", "--json", str(root / "ov.json")]
    )
    assert rc == 0
    (row,) = json.loads((root / "ov.json").read_text())["rows"]
    assert set(row["ms"]) == {"korch", "ort", "ov"} and row["processes"] == 2
    assert row["openvino"]["precision"] == "f32" and row["rel_err"]["ov"] <= 1e-4
    for engine in ("korch", "ort", "ov"):
        t = row["timing"][engine]
        assert t["processes"] == 2 and len(t["process_ms"]) == 2
        lo, hi = sorted(t["process_ms"])
        assert lo - 5e-5 <= t["median_ms"] <= hi + 5e-5  # the median is rounded to 4 decimals
