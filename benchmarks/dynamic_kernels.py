"""Generated kernels compiled once with a dynamic dimension, against static compiles.

    python benchmarks/dynamic_kernels.py [--max-per-model N] [--threads 2] [--rounds 5]

For every memory-bound kernel of ``benchmarks/tiling_quality.py``'s set (the example
suite and up to N kernels per test model) and its first dynamic axis (Note [Dynamic
kernels] in ``korch/kernels/tvm/dynamic.py``), compiles one ``DynamicKernel`` and runs
it at several extents around the build one. At each extent it checks the outputs
against the reference interpreter and times, alternating in rounds (medians):

* ``dynamic``: the dynamic kernel's call (extent from the inputs, the tiling function,
  memoised after the first call, the key's launch, output allocation);
* ``same``: a static compile at that extent with the same loop structure and key (what
  the symbolic extent costs the generated code);
* ``model``: a static compile at that extent with the tiling model's config for that
  extent (what fixing the loop structure at the build extent costs).

It also prints the tiling function's first call at a new extent (a solve) and the
build times. The last line is one JSON object. A benchmark: it never fails on a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tiling_quality import model_kernels  # noqa: E402

from korch.ir.interp import evaluate  # noqa: E402
from korch.kernels.tvm.backend import TvmBackend, vector_bytes  # noqa: E402
from korch.kernels.tvm.dynamic import DynamicKernel, dynamic_axes, graph_at  # noqa: E402
from korch.kernels.tvm.tiling import tile_config_from_solution  # noqa: E402
from korch.profile.timing import random_inputs, time_kernel  # noqa: E402
from korch.tiling import examples  # noqa: E402
from korch.tiling.describe import describe  # noqa: E402
from korch.tiling.solvers import solve  # noqa: E402


def _time(fn, args) -> float:
    return statistics.median(time_kernel(fn, args, warmup=1, repeat=3, min_sample_ms=1.0))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-per-model", type=int, default=6)
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="", help="kernels whose name contains this")
    args = p.parse_args(argv)

    kernels = [(name, build()) for name, build in examples.suite()]
    if not args.no_models:
        kernels += model_kernels(args.max_per_model)[0]
    backend = TvmBackend()
    rows, refused, builds, first_calls = [], {}, [], []
    for name, g in kernels:
        if args.only not in name:
            continue
        try:
            axes = dynamic_axes(g)
        except Exception:  # noqa: BLE001 - not describable: not a tiling-model kernel
            continue
        kernel = None
        for axis in axes:
            try:
                kernel = DynamicKernel(g, axis, args.threads)
                break
            except ValueError as e:
                refused[f"{name}:{axis}"] = str(e)[:120]
        if kernel is None:
            continue
        builds.append(kernel.build_seconds)
        ext = kernel.extent
        for n in sorted({max(1, ext // 4), ext, ext + 1, 2 * ext + 3}):
            ga = graph_at(g, kernel.dims, n)
            feeds = random_inputs(ga, {}, seed=n)
            t0 = time.perf_counter()
            kernel.tiling.solve(n)
            first_calls.append(time.perf_counter() - t0)
            got = kernel(feeds)
            want = evaluate(ga, dict(zip(ga.inputs, feeds)))
            # relative to the output's largest magnitude, as the profiler's check is
            err = max(
                (
                    float(np.max(np.abs(a.astype(np.float64) - w)) / max(1.0, float(np.max(np.abs(w)))))
                    if a.size
                    else 0.0
                )
                for a, w in zip(got, want.values())
            )
            same = backend.build(ga, {}, args.threads, tile_config=kernel.static_config(n))
            desc = describe(ga)
            sol = solve(desc, "cpu")
            model = backend.build(
                ga, {}, args.threads, tile_config=tile_config_from_solution(ga, sol, args.threads, vector_bytes(), desc)
            )
            times: dict[str, list[float]] = {"dynamic": [], "same": [], "model": []}
            fns = {"dynamic": kernel, "same": same, "model": model}
            for _ in range(args.rounds):
                for key, fn in fns.items():
                    times[key].append(_time(fn, feeds))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append(
                {
                    "kernel": name,
                    "axis": kernel.axis,
                    "n": n,
                    "build_n": ext,
                    "key": kernel.key(n),
                    "max_rel_err": err,
                    **{f"{k}_us": v for k, v in med.items()},
                    "vs_same": med["dynamic"] / med["same"],
                    "vs_model": med["dynamic"] / med["model"],
                }
            )
            r = rows[-1]
            print(
                f"{name[:32]:32s} ax{kernel.axis} n={n:<6d} (built {ext:<5d}) {r['key']:8s} "
                f"dyn {r['dynamic_us']:9.1f} us  same {r['same_us']:9.1f}  model {r['model_us']:9.1f}  "
                f"x{r['vs_same']:.3f} / x{r['vs_model']:.3f}  err {err:.1e}",
                flush=True,
            )

    def q(vals, pct):
        return float(np.percentile(vals, pct)) if vals else None

    vs_same = [r["vs_same"] for r in rows]
    vs_model = [r["vs_model"] for r in rows]
    small = [r["dynamic_us"] - r["same_us"] for r in rows if r["same_us"] < 20]
    summary = {
        "kernels": len({r["kernel"] for r in rows}),
        "calls": len(rows),
        "refused_axes": len(refused),
        "max_rel_err": max((r["max_rel_err"] for r in rows), default=None),
        "build_s_p50": q(builds, 50),
        "tiling_solve_us_p50": q([c * 1e6 for c in first_calls], 50),
        "tiling_solve_us_p99": q([c * 1e6 for c in first_calls], 99),
        "dynamic_vs_same_p50": q(vs_same, 50),
        "dynamic_vs_same_p90": q(vs_same, 90),
        "dynamic_vs_model_p50": q(vs_model, 50),
        "dynamic_vs_model_p90": q(vs_model, 90),
        "within_10pct_of_model": sum(v <= 1.1 for v in vs_model) / max(1, len(vs_model)),
        "overhead_us_small_kernels_p50": q(small, 50),
    }
    print(f"refused axes: {len(refused)}")
    for k, why in list(refused.items())[:10]:
        print(f"  {k}: {why}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
