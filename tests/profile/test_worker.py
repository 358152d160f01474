"""Measurement isolation: crashes, hangs, exceptions and wrong results are recorded, the run goes on."""

import numpy as np
import pytest

from korch.ir import GraphBuilder, Op
from korch.profile.db import Measurement, ResultsDB
from korch.profile.worker import Job, WorkerPool


def _kgraph(op: Op):
    b = GraphBuilder()
    x = b.input("in0", (4, 8), "float32")
    y = b.unary(op, b.unary(Op.ABS, x))
    b.output("out0", y)
    return b.graph


@pytest.fixture
def chaos(monkeypatch):
    """The chaos backend in the spawned workers (a plugin: KORCH_BACKENDS) and in this process."""
    import os

    from chaos_backend import ChaosBackend

    from korch.kernels import base

    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("KORCH_BACKENDS", "chaos_backend")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setitem(base._REGISTRY, "chaos", ChaosBackend())


def test_faults_are_isolated_and_recorded(chaos):
    ops = [Op.TANH, Op.NEG, Op.SIGMOID, Op.EXP, Op.LOG, Op.SQRT, Op.FLOOR, Op.CEIL]
    jobs = [Job((op.value, "chaos"), "chaos", _kgraph(op), {}) for op in ops]
    results = {}
    pool = WorkerPool(num_threads=1, timing=(1, 3, 0.1), timeout_s=3.0)
    try:
        pool.run(jobs, lambda r: results.__setitem__(r.key[0], r))
    finally:
        pool.close()
    status = {k: r.status for k, r in results.items()}
    assert status == {
        "tanh": "ok",
        "neg": "crash",
        "sigmoid": "ok",
        "exp": "timeout",
        "log": "failed",
        "sqrt": "wrong",
        "floor": "crash",
        "ceil": "ok",
    }
    assert results["tanh"].median_us > 0 and len(results["tanh"].times_us) == 3
    assert "chaos: log kernels raise" in results["log"].error


def test_db_roundtrip_and_resume(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    m = Measurement("h1", "cpu", "tvm", "default", "v1", "ok", 12.5, (12.0, 13.0))
    db.add_workload("h1", "memory", 3, "%0 = ...")
    db.record(m)
    db.close()
    db2 = ResultsDB(tmp_path / "r.db")
    assert db2.lookup("h1", "cpu", "tvm", "default", "v1") == m
    assert db2.lookup("h1", "cpu", "tvm", "default", "v2") is None
    assert db2.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert np.isclose(db2.count("ok"), 1)


def test_runaway_memory_is_killed_and_recorded_as_oom(chaos, tmp_path):
    """The parent watches the worker's resident memory; over the limit it is killed."""
    from korch.profile import Workload, profile
    from korch.profile.worker import MEMORY_POLL_S

    assert MEMORY_POLL_S <= 0.1
    ops = [Op.TANH, Op.RECIPROCAL, Op.CEIL]
    jobs = [Job((op.value, "chaos"), "chaos", _kgraph(op), {}) for op in ops]
    results = {}
    pool = WorkerPool(num_threads=1, timing=(1, 3, 0.1), timeout_s=60.0, memory_mb=1500)
    try:
        pool.run(jobs, lambda r: results.__setitem__(r.key[0], r))
    finally:
        pool.close()
    assert {k: r.status for k, r in results.items()} == {"tanh": "ok", "reciprocal": "oom", "ceil": "ok"}
    assert "memory limit (1500 MiB" in results["reciprocal"].error
    assert 1500 < pool.peak_rss_mb < 4000

    # through profile(): the status lands in the database and the run goes on
    from korch.config import Settings

    db = ResultsDB(tmp_path / "r.db")
    s = Settings(db_path=str(tmp_path / "r.db"), warmup=1, repeat=3, min_repeat_ms=0.1, kernel_memory_mb=1500)
    ws = [Workload(op.value, "memory", _kgraph(op), {}, ("chaos",)) for op in (Op.RECIPROCAL, Op.TANH)]
    res, stats = profile(ws, db, "cpu", s, progress=False)
    assert stats.measured == 2 and stats.failed == 1
    assert db.count("oom") == 1 and db.count("ok") == 1
    assert db.failures()[0][2] == "oom"


def test_db_migrates_schema_1(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '1');
        CREATE TABLE workloads (hash TEXT PRIMARY KEY, kind TEXT NOT NULL, n_primitives INTEGER NOT NULL,
            text TEXT NOT NULL);
        CREATE TABLE measurements (id INTEGER PRIMARY KEY AUTOINCREMENT, workload TEXT NOT NULL, target TEXT NOT NULL,
            backend TEXT NOT NULL, config TEXT NOT NULL, versions TEXT NOT NULL, status TEXT NOT NULL,
            median_us REAL, times_us TEXT, error TEXT, created REAL NOT NULL,
            UNIQUE (workload, target, backend, config, versions));
        INSERT INTO measurements (workload, target, backend, config, versions, status, median_us, times_us, error,
            created) VALUES ('h', 'cpu', 'tvm', 'default', 'v', 'ok', 3.0, '[3.0]', '', 1.0);
        """
    )
    conn.commit()
    conn.close()
    db = ResultsDB(path)
    assert db.lookup("h", "cpu", "tvm", "default", "v") == Measurement(
        "h", "cpu", "tvm", "default", "v", "ok", 3.0, (3.0,)
    )
    db.record(Measurement("h2", "cpu", "tvm", "default", "v", "ok", 1.0, (1.0,), host="rpc:10.0.0.2:9090"))
    assert db.lookup("h2", "cpu", "tvm", "default", "v").host == "rpc:10.0.0.2:9090"
    assert db.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "2"


def test_default_memory_limit_is_half_the_machine_at_least_4_gib():
    import psutil

    from korch.config import Settings

    want = max(4096.0, psutil.virtual_memory().total / 2**21)
    assert Settings().kernel_memory_mb == pytest.approx(want)


def test_slow_kernels_stop_sampling_early_fast_ones_take_every_repeat():
    import time

    from korch.profile.timing import MAX_SAMPLING_MS, MIN_SAMPLES, time_kernel

    def slow(args):
        time.sleep(MAX_SAMPLING_MS / 1e3 / 3)  # three samples already pass the cap

    assert len(time_kernel(slow, [], warmup=1, repeat=15, min_sample_ms=0.1)) == MIN_SAMPLES
    assert len(time_kernel(lambda args: None, [], warmup=1, repeat=15, min_sample_ms=0.1)) == 15


def test_a_kernel_over_slow_call_ms_is_warm_after_one_call_and_takes_fewer_samples():
    import time

    from korch.profile.timing import MAX_SAMPLING_MS, MIN_SLOW_SAMPLES, SLOW_CALL_MS, time_kernel

    calls = []

    def slower(args):
        calls.append(1)
        time.sleep(max(SLOW_CALL_MS, MAX_SAMPLING_MS / 2) / 1e3 * 1.1)

    times = time_kernel(slower, [], warmup=3, repeat=15, min_sample_ms=0.1)
    assert len(times) == MIN_SLOW_SAMPLES and len(calls) == 2 + MIN_SLOW_SAMPLES  # a warm-up, a probe
