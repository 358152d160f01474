"""The static memory plan on and off (Note [Static memory plan]) on saved executables.

    python benchmarks/arena_ab.py OUTDIR [OUTDIR ...] [--rounds 300]

Each executable runs alternately with its arena plan and with every kernel's own
allocating call, in one process; outputs are checked equal; prints medians (ms).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from korch.executable import Executable


def ab(directory: str, rounds: int) -> dict:
    exe = Executable.load(directory)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s.shape).astype(s.dtype) for n, s in exe.inputs.items()}
    planned, own = exe._fast, [None] * len(exe._fast)
    ref = exe(feeds)
    times: dict[str, list[float]] = {"arena": [], "no arena": []}
    for _ in range(rounds):
        for mode, fast in (("arena", planned), ("no arena", own)):
            exe._fast = fast
            t0 = time.perf_counter()
            out = exe(feeds)
            times[mode].append(time.perf_counter() - t0)
            for k in ref:
                np.testing.assert_allclose(out[k], ref[k], rtol=1e-5, atol=1e-5)
    exe._fast = planned
    return {
        "executable": directory,
        **{k: round(float(np.median(v)) * 1e3, 3) for k, v in times.items()},
        "arena_mb": round(exe.buffer_stats["arena_bytes"] / 2**20, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("outdirs", nargs="+")
    p.add_argument("--rounds", type=int, default=300)
    args = p.parse_args()
    for d in args.outdirs:
        print(json.dumps(ab(d, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
