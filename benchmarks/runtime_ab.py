"""Saved executables timed under two source trees of korch, processes alternated.

    python benchmarks/runtime_ab.py --trees /tmp/before/src src --rounds 3 OUTDIR [...]

A saved native segment binds whatever ``libkorch_rt.so`` its process loads, so the same
executable (the same plan and kernels) runs under the runtime each tree builds: an A/B
of a runtime change with the plan held fixed. Each process loads every OUTDIR, calls
each one 5 times to warm up and ``--calls`` times timed, and prints its median; the
trees alternate process by process, each going first in every other round (``git
worktree add /tmp/before COMMIT`` makes the other tree). Random inputs (floats normal,
integers in [0, 4)). A benchmark: prints, never fails on a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys, time, numpy as np
from korch.executable import Executable
out = {}
for d in sys.argv[2:]:
    e = Executable.load(d, num_threads=2)
    rng = np.random.default_rng(0)
    spec = json.loads(open(d + "/plan.json").read())["inputs"]
    feeds = {k: rng.standard_normal(v["shape"]).astype(np.float32) if "float" in v["dtype"]
             else rng.integers(0, 4, v["shape"]).astype(v["dtype"]) for k, v in spec.items()}
    for _ in range(5):
        e(feeds)
    ts = []
    for _ in range(int(sys.argv[1])):
        t = time.perf_counter(); e(feeds); ts.append(time.perf_counter() - t)
    out[d] = float(np.median(ts)) * 1e3
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdirs", nargs="+")
    p.add_argument("--trees", nargs=2, required=True, help="two korch source trees (the src folders)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=100)
    args = p.parse_args()
    dirs = [str(Path(d).resolve()) for d in args.outdirs]
    for r in range(args.rounds):
        # the trees take turns going first: the first process of a pair ran faster here
        # (bert_mini's saved plan under two trees with the same kernels: in 6 of 8 rounds,
        # four with each tree first)
        for tree in args.trees if r % 2 == 0 else args.trees[::-1]:
            env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
            res = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.calls), *dirs], env=env, capture_output=True, text=True
            )
            if res.returncode != 0:
                print(f"round {r} {tree}: failed\n{res.stderr[-2000:]}")
                continue
            ms = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"round {r} {tree:30s} " + "  ".join(f"{Path(d).name} {v:.3f} ms" for d, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
