"""Tiling solver quality and speed over memory-bound kernels on all three targets.

    python benchmarks/tiling_quality.py [--max-per-model N] [--all] [--no-models]

Kernels: the representative suite of ``korch.tiling.examples`` plus the memory-bound
candidate kernels of the test models (fission -> partition -> identify), de-duplicated
by canonical hash and, unless ``--all``, sampled evenly to ``--max-per-model`` per
model. For every target and solver it prints the median and p99 solve time (models
built beforehand, as GE builds them at compile time) and the share of kernels where
the solver's tiling is within 95% of the exhaustive optimum of the model (optimum /
solver's predicted time >= 0.95). The last line is one JSON object with the figures.
A benchmark, not a test: it never fails on a number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from korch.tiling import examples
from korch.tiling.describe import describe
from korch.tiling.solvers import SOLVERS, models_for, timed_solve
from korch.tiling.target import TARGETS, get_target


def model_kernels(max_per_model: int | None) -> tuple[list[tuple[str, object]], dict]:
    info: dict = {}
    try:
        from korch import models
        from korch.fission import fission
        from korch.frontend import load_model
        from korch.identify import candidates
        from korch.ir.subgraph import canonical_hash, extract, kernel_class
        from korch.partition import partition
    except ImportError as e:  # the other stages are optional here
        return [], {"skipped": str(e)}
    out = []
    for name in models.NAMES:
        try:
            graph = fission(load_model(models.build(name)))  # shapes inferred, as the pipeline loads it
        except Exception as e:  # noqa: BLE001 - a model fission cannot handle yet
            info[name] = f"skipped: {type(e).__name__}: {str(e)[:80]}"
            continue
        seen: dict[str, object] = {}
        for part in partition(graph, 400):
            for k in candidates(graph, part, 24):
                if kernel_class(graph, k) == "memory":
                    seen.setdefault(canonical_hash(graph, k), (graph, k))
        keys = sorted(seen)
        if max_per_model and len(keys) > max_per_model:
            keys = [keys[int(i)] for i in np.linspace(0, len(keys) - 1, max_per_model)]
        info[name] = {"memory_candidates": len(seen), "used": len(keys)}
        for h in keys:
            g, k = seen[h]
            out.append((f"{name}:{h[:8]}", extract(g, k)))
    return out, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-per-model", type=int, default=25)
    p.add_argument("--all", action="store_true", help="every memory-bound candidate (slow)")
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--targets", default=",".join(TARGETS))
    args = p.parse_args(argv)

    kernels = [(name, build()) for name, build in examples.suite()]
    info: dict = {}
    if not args.no_models:
        extra, info = model_kernels(None if args.all else args.max_per_model)
        kernels += extra
    descs = []
    for name, g in kernels:
        try:
            descs.append((name, describe(g)))
        except ValueError as e:
            print(f"skip {name}: {e}", file=sys.stderr)
    print(f"{len(descs)} kernels ({len(examples.suite())} hand-built); models: {json.dumps(info)}")
    print(f"load average: {os.getloadavg() if hasattr(os, 'getloadavg') else 'n/a'}")

    results: dict = {}
    for tname in args.targets.split(","):
        target = get_target(tname)
        times: dict[str, list[float]] = {s: [] for s in SOLVERS}
        quality: dict[str, list[float]] = {s: [] for s in SOLVERS if s != "exhaustive"}
        build_s: list[float] = []
        infeasible = 0
        t_target = time.perf_counter()
        for _name, desc in descs:
            t0 = time.perf_counter()
            models_for(desc, target)
            build_s.append(time.perf_counter() - t0)
            sols = {}
            for s in SOLVERS:
                sol, dt = timed_solve(desc, target, s)
                times[s].append(dt)
                sols[s] = sol
            best = sols["exhaustive"]
            if best is None:
                infeasible += 1
                continue
            for s in quality:
                sol = sols[s]
                quality[s].append(0.0 if sol is None else best.time_us / sol.time_us)
        row: dict = {
            "kernels": len(descs),
            "no_feasible_tiling": infeasible,
            "model_build_ms_median": round(1e3 * float(np.median(build_s)), 2),
            "wall_s": round(time.perf_counter() - t_target, 1),
            "solvers": {},
        }
        print(
            f"\n== {tname} ({target.source}): {len(descs)} kernels, model build median "
            f"{row['model_build_ms_median']} ms, wall {row['wall_s']} s"
        )
        print(f"{'solver':<12}{'median ms':>11}{'p99 ms':>10}{'>=95% opt':>11}{'mean opt/t':>12}{'min opt/t':>11}")
        for s in SOLVERS:
            ts = np.array(times[s]) * 1e3
            entry = {"median_ms": round(float(np.median(ts)), 3), "p99_ms": round(float(np.percentile(ts, 99)), 3)}
            q = np.array(quality.get(s, []))
            if s in quality and len(q):
                entry.update(
                    share_95=round(float(np.mean(q >= 0.95)), 3),
                    mean_quality=round(float(q.mean()), 3),
                    min_quality=round(float(q.min()), 3),
                )
            row["solvers"][s] = entry
            print(
                f"{s:<12}{entry['median_ms']:>11.3f}{entry['p99_ms']:>10.3f}"
                f"{entry.get('share_95', 1.0):>11.3f}{entry.get('mean_quality', 1.0):>12.3f}{entry.get('min_quality', 1.0):>11.3f}"
            )
        results[tname] = row
    print(json.dumps({"benchmark": "tiling_quality", "kernels": len(descs), "models": info, "targets": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
