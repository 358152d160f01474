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
    monkeypatch.setenv("KORCH_CHAOS", "1")


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
