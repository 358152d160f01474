"""Saved executables with korch's workers lingering after a call or sleeping at once
(Note [Lingering workers]), each setting in fresh processes of its own, alternated.

    python benchmarks/pool_linger.py OUTDIR [...] [--linger-us 0 1000] [--processes 4] [--calls 200]

Each process loads one executable (``korch.load``), calls it on random inputs back to
back and reports the median of blocks of calls; the table gives, per executable and
setting, the median over processes (and their range), and each setting over the first.
A benchmark, not a test: it never fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, statistics, sys, time
import korch
from korch.profile.e2e import random_feeds
m = korch.load(sys.argv[1])
calls = int(sys.argv[2])
feeds = random_feeds(m.executable.inputs)
for _ in range(max(5, calls // 10)):
    m(feeds)
blocks = []
for _ in range(10):
    t0 = time.perf_counter()
    for _ in range(max(1, calls // 10)):
        m(feeds)
    blocks.append((time.perf_counter() - t0) / max(1, calls // 10) * 1e3)
print(json.dumps(statistics.median(blocks)))
"""


def one(outdir: str, linger_us: float, calls: int) -> float:
    env = {**os.environ, "KORCH_POOL_LINGER_US": str(linger_us)}
    out = subprocess.run([sys.executable, "-c", CHILD, outdir, str(calls)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdirs", nargs="+")
    p.add_argument("--linger-us", type=float, nargs="+", default=[0.0, 1000.0])
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    print("| executable | " + " | ".join(f"linger {u:g} us: ms (range)" for u in args.linger_us) + " | ratio |")
    print("|---|" + "---|" * (len(args.linger_us) + 1))
    for d in args.outdirs:
        ms: dict[float, list[float]] = {u: [] for u in args.linger_us}
        for _ in range(args.processes):  # settings alternated, one fresh process each
            for u in args.linger_us:
                ms[u].append(one(d, u, args.calls))
                time.sleep(0.2)
        med = {u: statistics.median(v) for u, v in ms.items()}
        cells = [f"{med[u]:.3f} ({min(v):.3f}-{max(v):.3f})" for u, v in ms.items()]
        base = med[args.linger_us[0]]
        ratios = ", ".join(f"{base / med[u]:.2f}x" for u in args.linger_us[1:])
        print(f"| {os.path.basename(os.path.normpath(d))} | " + " | ".join(cells) + f" | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
