"""What a kernel costs to dispatch inside a native segment (issue 25: under 1 us).

Builds native segments of chained TVM kernels (``y = x + 1`` on a small tensor, so the
kernel's own work is tens of ns) and times one segment call from Python:

- ``serial``: N kernels too small to be parallel; (t(N) - t(1)) / (N - 1) is the cost
  of one more kernel inside a segment (its C++ call, TVM's argument checks, the work);
- ``parallel``: N kernels of 256 KB (above SERIAL_BYTES) with a parallel outer loop, so each is a
  job on korch's pool: the same difference adds a job's hand-off to the pool's workers,
  which spin while the segment holds the pool (Note [One pool, awake for a segment]);
- the Python step loop for the same kernels run one by one through TVM's runtime, for
  comparison.

A benchmark, not a test: it prints a table and never fails on a timing.

    .venv/bin/python benchmarks/native_dispatch.py [--kernels 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# each configuration runs in a process of its own (an empty value: unset)
POLICIES = {
    "korch's pool, held per segment": {},
}


def _time(fn, seconds: float = 0.3, rounds: int = 7) -> float:
    res = []
    for _ in range(rounds):
        for _ in range(3):
            fn()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds / rounds:
            fn()
            n += 1
        res.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(res)


def worker(n_kernels: int, threads: int) -> dict:
    import numpy as np

    from korch.executable import Step
    from korch.executable.native import fuse_native
    from korch.ir import GraphBuilder, Op
    from korch.ir.subgraph import extract, make_kernel
    from korch.kernels.base import aligned_copy
    from korch.kernels.registry import get_backend

    def kernel(shape):
        b = GraphBuilder()
        x = b.input("x", shape, "float32")
        b.output("y", b.binary(Op.ADD, x, b.scalar(1.0, x)))
        g = b.graph
        k = make_kernel(g, g.users(), g.compute_ids())
        return get_backend("tvm").build(extract(g, k), {}, threads)

    out = {}
    for kind, shape in (("serial", (64,)), ("parallel", (threads * 2, 16384))):
        k = kernel(shape)
        x = aligned_copy(np.zeros(shape, np.float32))
        per = {}
        for n in (1, n_kernels):
            steps = [Step(f"k{i}", "tvm", "w", (i + 1,), (i,), (i + 1,), k) for i in range(n)]
            seg = fuse_native(steps, {n}, lambda nid: None, threads)[0].kernel
            seg.set_threads(threads)
            outs = [aligned_copy(np.zeros(shape, np.float32))]
            per[n] = _time(lambda seg=seg, outs=outs, x=x: seg.run_into([x], outs))
        out[f"{kind}_segment_us_per_kernel"] = (per[n_kernels] - per[1]) / (n_kernels - 1)
        out[f"{kind}_segment_call_us"] = per[1]
        y = aligned_copy(np.zeros(shape, np.float32))
        out[f"{kind}_python_us_per_kernel"] = _time(lambda k=k, y=y, x=x: [k.run_into([x], [y]) for _ in range(8)]) / 8
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.kernels, args.threads)))
        return
    rows = []
    for name, env in POLICIES.items():
        e = {**os.environ, **env}
        for k, v in env.items():
            if not v:
                e.pop(k, None)
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", "--kernels", str(args.kernels), "--threads", str(args.threads)],
            env=e,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            rows.append((name, None, proc.stderr.strip().splitlines()[-1:]))
            continue
        rows.append((name, json.loads(proc.stdout.strip().splitlines()[-1]), None))
    print(f"per-kernel dispatch, {args.kernels} chained kernels, {args.threads} threads, us (median of 7 blocks)\n")
    print(
        "| pool | serial: in a segment | serial: Python loop | parallel: in a segment "
        "| parallel: Python loop (TVM pool) | one segment call |"
    )
    print("|---|---|---|---|---|---|")
    for name, r, err in rows:
        if r is None:
            print(f"| {name} | failed: {err} | | | | |")
            continue
        print(
            f"| {name} | {r['serial_segment_us_per_kernel']:.3f} | {r['serial_python_us_per_kernel']:.2f} "
            f"| {r['parallel_segment_us_per_kernel']:.2f} | {r['parallel_python_us_per_kernel']:.2f} "
            f"| {r['serial_segment_call_us']:.2f} |"
        )


if __name__ == "__main__":
    main()
