"""benchmarks/zoo_bench.py: a model korch fails on is a row with its error, not the end of the run."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _zoo_bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import zoo_bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    return zoo_bench


def test_internal_error_and_mismatch_are_rows(monkeypatch, tmp_path):
    import korch.bench.suite as S

    zb = _zoo_bench()
    entry = {"name": "m", "file": "m.onnx", "family": "cnn", "batch": 1, "ort_ok": True}

    def broken(*a, **k):
        raise RuntimeError("fission: no rule for Foo\nmore detail")

    monkeypatch.setattr(S, "bench_model", broken)
    row = zb.bench_one(entry, tmp_path, tmp_path / "out", None, ["ort"], 2, 1, False)
    assert row["error"] == "RuntimeError: fission: no rule for Foo" and "Traceback" in row["traceback"]

    def off(*a, **k):
        return {"ms": {"korch": 2.0, "ort": 3.0, "ov": 4.0}, "max_rel_err_korch": 1e-2, "skipped": {"compile": "x"}}

    monkeypatch.setattr(S, "bench_model", off)
    row2 = zb.bench_one(entry, tmp_path, tmp_path / "out", None, ["ort", "ov"], 2, 1, False)
    assert row2["speedup_vs_ort_ov"] == 1.5 and "differs from onnxruntime" in row2["error"]
    unexported = zb.bench_one(
        {"name": "u", "error": "UnsupportedOperatorError"}, tmp_path, tmp_path, None, [], 2, 1, False
    )
    assert unexported["error"].startswith("not exported")
    table = zb.format_zoo_table([row, row2, unexported])
    assert "RuntimeError: fission" in table and "1.50x" in table and "skip" in table
    assert len(table.splitlines()) == 2 + 3
