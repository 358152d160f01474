"""Scale: optimize a >= 2,000-primitive model on 2 cores (issue 6, item 5).

    .venv/bin/python benchmarks/scale.py [--model encoder12] [--threads 2] [--db PATH]

Builds korch.models' ``encoder12`` (12-layer encoder, hidden 256, seq 64, 8 heads run
head by head), optimizes it with a fresh results database (or --db), and prints the
primitive count, partitions, execution states, candidates, workloads (canonical
kernels: equal layers share them, so the database holds one measurement per distinct
kernel), time per stage (report["stage_seconds"]) and peak resident memory of korch
plus its measurement workers, sampled every 50 ms (psutil), overall and per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path


class PeakRSS(threading.Thread):
    """Samples the resident memory of this process and all its children."""

    def __init__(self, period_s: float = 0.05):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.period_s = period_s
        self.peak = 0
        self.stage_peak: dict[str, int] = {}
        self.stage = "start"
        self._done = threading.Event()

    def sample(self) -> int:
        import psutil

        total = 0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def run(self) -> None:
        while not self._done.is_set():
            rss = self.sample()
            self.peak = max(self.peak, rss)
            self.stage_peak[self.stage] = max(self.stage_peak.get(self.stage, 0), rss)
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._done.set()
        self.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="encoder12")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--db", help="results database (default: a fresh one)")
    ap.add_argument("--out", help="output folder (default: a temporary one)")
    ap.add_argument("--exhaustive-profiling", action="store_true")
    args = ap.parse_args()

    import korch
    from korch import pipeline
    from korch.config import Settings
    from korch.models import build

    tmp = tempfile.mkdtemp(prefix="korch-scale-")
    db = args.db or os.path.join(tmp, "results.db")
    out = args.out or os.path.join(tmp, "out")
    mon = PeakRSS()
    mon.start()
    # label samples with the running stage (wrap each step; the list itself is unchanged)
    wrapped = []
    for name, fn in pipeline.STEPS:

        def step(ctx, _name=name, _fn=fn):
            mon.stage = _name
            _fn(ctx)

        wrapped.append((name, step))
    pipeline.STEPS[:] = wrapped
    settings = Settings(
        db_path=db, num_threads=args.threads, progress=False, guided_profiling=not args.exhaustive_profiling
    )
    t0 = time.perf_counter()
    compiled = korch.optimize(build(args.model), output_dir=out, settings=settings)
    total = time.perf_counter() - t0
    mon.stop()
    r = compiled.report
    keys = [
        "primitives",
        "partitions",
        "execution_states",
        "candidates",
        "workloads",
        "measurements_requested",
        "candidates_measured",
        "measurements_cached",
        "kernels_chosen",
        "latency_ms",
        "onnxruntime_ms",
        "max_rel_error",
    ]
    print(f"model {args.model} on {args.threads} threads (cpu count {os.cpu_count()})")
    for k in keys:
        if k in r:
            print(f"  {k:<24} {r[k]}")
    print(f"  {'stage':<12} {'seconds':>9} {'peak RSS (MiB)':>15}")
    for name, secs in r["stage_seconds"].items():
        print(f"  {name:<12} {secs:>9.2f} {mon.stage_peak.get(name, 0) / 2**20:>15.0f}")
    print(f"  {'total':<12} {total:>9.2f} {mon.peak / 2**20:>15.0f}")
    Path(out, "scale.json").write_text(
        json.dumps({"report": r, "peak_rss_mb": mon.peak / 2**20, "stage_peak_rss_mb": mon.stage_peak}, default=str)
    )


if __name__ == "__main__":
    main()
