"""Cost per call of dynamic-shape tiling functions (Note [Dynamic shapes]).

    python benchmarks/dynamic_tiling.py [--max-per-model N] [--targets cpu,ascend-a2]

For every memory-bound kernel of ``benchmarks/tiling_quality.py``'s set and its first
axis that can be dynamic (whole tensor dimensions: batch, rows), builds a
``TilingFunction`` once and calls it at several extents around the compiled one. It
prints, per target: the build time (median), the per-call solve time (median, p99),
the memoised call, a static compile at that extent (model build + solve: what a
shape change costs without the function), and the share of calls whose tiling is the one a static compile
at that extent gives (it should be all of them). The last line is one JSON object. A
benchmark, not a test: it never fails on a number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tiling_quality import model_kernels  # noqa: E402

from korch.tiling import examples  # noqa: E402
from korch.tiling.describe import describe  # noqa: E402
from korch.tiling.dynamic import TilingFunction  # noqa: E402
from korch.tiling.model import with_extent  # noqa: E402
from korch.tiling.solvers import solve  # noqa: E402
from korch.tiling.target import TARGETS, get_target  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-per-model", type=int, default=10)
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--solver", default="axis-ge")
    args = p.parse_args(argv)

    kernels = [(name, build()) for name, build in examples.suite()]
    if not args.no_models:
        kernels += model_kernels(args.max_per_model)[0]
    cases = []
    for name, g in kernels:
        try:
            desc = describe(g)
        except Exception:  # noqa: BLE001 - not describable: not a tiling-model kernel
            continue
        for axis, a in enumerate(desc.axes):
            if a.extent < 2:
                continue
            try:
                TilingFunction(desc, axis, "cpu")
            except ValueError:
                continue
            cases.append((name, desc, axis))
            break
    print(f"{len(cases)} kernels with a dynamic axis (of {len(kernels)})")
    summary: dict = {"kernels": len(cases), "solver": args.solver, "targets": {}}
    print(
        f"{'target':10s} {'build ms':>9s} {'call us p50':>12s} {'call us p99':>12s} {'memo us':>8s} {'static us':>10s} {'= static':>9s}"
    )
    for tname in args.targets.split(","):
        tgt = get_target(tname)
        builds, calls, memo, static, same, total = [], [], [], [], 0, 0
        for _, desc, axis in cases:
            tf = TilingFunction(desc, axis, tgt, args.solver)
            builds.append(tf.build_seconds)
            ext = desc.axes[axis].extent
            for n in sorted({2, max(2, ext // 2), ext, ext + 1, 2 * ext, 4 * ext + 3}):
                t0 = time.perf_counter()
                got = tf(n)
                calls.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                tf(n)
                memo.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                want = solve(with_extent(desc, axis, n), tgt, args.solver)  # build + solve at n
                static.append(time.perf_counter() - t0)
                total += 1
                same += (got is None and want is None) or (
                    got is not None and want is not None and (got.tiles, got.cores) == (want.tiles, want.cores)
                )
        row = {
            "build_ms_p50": float(np.median(builds) * 1e3),
            "call_us_p50": float(np.median(calls) * 1e6),
            "call_us_p99": float(np.percentile(calls, 99) * 1e6),
            "memo_us_p50": float(np.median(memo) * 1e6),
            "static_us_p50": float(np.median(static) * 1e6),
            "calls": total,
            "same_as_static": same / max(total, 1),
        }
        summary["targets"][tname] = row
        print(
            f"{tname:10s} {row['build_ms_p50']:9.2f} {row['call_us_p50']:12.1f} {row['call_us_p99']:12.1f} "
            f"{row['memo_us_p50']:8.2f} {row['static_us_p50']:10.1f} {row['same_as_static']:9.3f}"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
