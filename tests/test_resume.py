"""Crash-safe, resumable results database (issue 6, item 2).

``korch optimize`` is SIGKILLed midway through profiling and restarted — as two
processes at once sharing the database — : nothing measured before the kill is
measured again, both finish, and the result equals an uninterrupted run's.

What "equals an uninterrupted run" means under timing noise: two runs that *measure*
get different timings, and a near tie between two kernel sets can go either way, so
comparing the chosen kernels of two independently measured runs would be flaky. We
check the two things that are not noise:
* the resumed run's choice is the one an uninterrupted run makes from the same
  measurements (a fresh optimize over a copy of the final database measures nothing
  and chooses exactly the same kernels, in the same order, with the same outputs);
* every run's outputs match onnxruntime, and the resumed runs measured exactly the
  (kernel, backend) pairs that were missing, each once per process.
Tile configs come from the tiling model, which may calibrate itself from the
database, so a *fresh*-database run can key its measurements with other configs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import korch
from korch.models import save

ENV = {**os.environ, "KORCH_CHAOS": "0", "OMP_NUM_THREADS": "1"}


def tiny_model(path: Path) -> Path:
    return save("chain6", path)


def _optimize_cmd(model: Path, out: Path, db: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "korch",
        "optimize",
        str(model),
        "-o",
        str(out),
        "--db",
        str(db),
        "--threads",
        "1",
        "--exhaustive-profiling",
        "--no-rewrite",
        "--no-plan-check",  # the choice compared below is the BLP's, not a timing's
        "--kernel-timeout",
        "600",  # wall-clock: a loaded CI machine must not turn slow builds into timeouts
        "-q",
    ]


def _rows(db: Path) -> dict[tuple, tuple]:
    """(workload, backend, config, versions) -> (id, created, status) of every measurement."""
    if not db.exists():
        return {}
    conn = sqlite3.connect(db, timeout=60)
    try:
        rows = conn.execute("SELECT workload, backend, config, versions, id, created, status FROM measurements")
        return {r[:4]: r[4:] for r in rows}
    except sqlite3.OperationalError:  # the schema is not there yet
        return {}
    finally:
        conn.close()


def _plan(out: Path) -> list[tuple[str, str]]:
    plan = json.loads((out / "plan.json").read_text())
    return [(s["workload"], s["backend"]) for s in plan["steps"]]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume")
    return d, tiny_model(d / "tiny.onnx")


@pytest.fixture(scope="module")
def resumed(work):
    """Run once, SIGKILL midway through profiling, run again to the end."""
    d, model = work
    db = d / "r.db"
    proc = subprocess.Popen(
        _optimize_cmd(model, d / "killed", db),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 900
    before: dict = {}
    while time.monotonic() < deadline and proc.poll() is None and not before:
        before = _rows(db)
        time.sleep(0.05)
    assert proc.poll() is None, "optimize finished before it could be killed: " + proc.stderr.read().decode()[-500:]
    assert before, "nothing was measured in 900 s"
    os.kill(proc.pid, signal.SIGKILL)  # only korch itself: its worker notices and exits
    proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # and whatever the worker had not yet noticed
    except ProcessLookupError:
        pass
    before = _rows(db)  # rows committed up to the kill
    # resume: two processes at once on the same database (SQLite busy handling)
    procs = [
        subprocess.Popen(
            _optimize_cmd(model, d / f"out{i}", db), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for i in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    reports = [json.loads((d / f"out{i}" / "report.json").read_text()) for i in range(2)]
    return db, before, _rows(db), reports, d / "out0"


def test_kill_and_resume_measures_nothing_twice(resumed):
    db, before, after, reports, _ = resumed
    total = reports[0]["measurements_requested"]
    assert 0 < len(before) < total, (len(before), total)  # the kill came midway
    # one row per kernel, however many processes measured it, and one more per near tie
    # measured a second time (config "...#2", Note [Confirming near ties])
    first = {k: v for k, v in after.items() if not k[2].endswith("#2")}
    assert len(first) == total
    assert all(report["measurements_confirmed"] == len(after) - len(first) for report in reports)
    for key, row in before.items():
        assert after[key] == row, f"{key} was measured again"  # same id, same created time
    for report in reports:  # both resumed processes finished correctly
        assert report["measurements_requested"] == total
        assert report["candidates_measured"] == total - len(before)
        assert report["measurements_cached"] == len(before)
        assert report["max_rel_error"] <= 1e-4


def test_resumed_choice_equals_uninterrupted_run_on_same_measurements(resumed, work, tmp_path):
    db, _, after, reports, out = resumed
    report = reports[0]
    d, model = work
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)  # WAL content is checkpointed into the file when the writer closed
    fresh = korch.optimize(
        model,
        output_dir=tmp_path / "fresh",
        db_path=str(copy),
        progress=False,
        guided_profiling=False,
        rewrite=False,
        region_bias=(),
        num_threads=1,
    )
    assert fresh.report["candidates_measured"] == 0
    assert _plan(tmp_path / "fresh") == _plan(out)
    assert fresh.report["kernels_chosen"] == report["kernels_chosen"]
    assert fresh.report["predicted_latency_us"] == report["predicted_latency_us"]
    loaded = korch.load(out)
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    got, want = loaded({"x": x}), fresh({"x": x})
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_run_rejects_wrong_inputs_with_one_line(resumed, tmp_path):
    *_, out = resumed
    loaded = korch.load(out)
    with pytest.raises(korch.InputError, match="dtype float64, expected float32"):
        loaded({"x": np.zeros((64, 128), np.float64)})
    with pytest.raises(korch.InputError, match="missing input"):
        loaded({"z": np.zeros((64, 128), np.float32)})
    with pytest.raises(korch.InputError, match=r"unknown input\(s\) \['z'\]"):
        loaded({"x": np.zeros((64, 128), np.float32), "z": np.zeros(1, np.float32)})
    # a non-contiguous view is taken (made contiguous for the kernels), not refused
    wide = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    np.testing.assert_array_equal(
        loaded({"x": wide[:, ::2]})[next(iter(loaded.output_names))],
        loaded({"x": np.ascontiguousarray(wide[:, ::2])})[next(iter(loaded.output_names))],
    )
    cases = {"shape": {"x": np.zeros((64, 127), np.float32)}}
    for what, feeds in cases.items():
        np.savez(tmp_path / f"{what}.npz", **feeds)
        proc = subprocess.run(
            [sys.executable, "-m", "korch", "run", str(out), "--inputs", str(tmp_path / f"{what}.npz")],
            capture_output=True,
            text=True,
            timeout=300,
            env=ENV,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("korch: error:") and proc.stderr.count("\n") == 1, proc.stderr
        assert "input 'x': shape [64, 127], expected [64, 128]" in proc.stderr
