"""Saved executables of one model side by side with onnxruntime, alternated in one process.

    python benchmarks/exe_ab.py MODEL.onnx OUTDIR[@THREADS] [...] [--rounds 30] [--threads 2]

This VM's timings move by up to 1.5x from process to process, so two optimizations of
one model (say with and without library regions, Note [Library regions]) are compared
here, call by call, not across `korch optimize` runs. Prints median ms and the ratio
to onnxruntime for each; checks every output against onnxruntime. onnxruntime runs
with --threads; an executable with its own thread count when given as OUTDIR@N. A benchmark, not a
test.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from korch.executable import Executable
from korch.kernels.ort.backend import make_session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("outdirs", nargs="+")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    sess = make_session(open(args.model, "rb").read(), args.threads)
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.standard_normal([int(d) for d in i.shape]).astype(np.float32)
        if "float" in i.type
        else rng.integers(0, 4, [int(d) for d in i.shape]).astype(np.int64)
        for i in sess.get_inputs()
    }
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, feeds)))
    runs = {"onnxruntime": lambda: sess.run(names, feeds)}
    for d in args.outdirs:
        path, _, n = d.partition("@")  # OUTDIR@1: that executable at 1 thread
        exe = Executable.load(path, num_threads=int(n) if n else args.threads)
        out = exe(feeds)
        for k, want in ref.items():
            np.testing.assert_allclose(out[k], want, rtol=1e-3, atol=1e-4, err_msg=f"{d}: {k}")
        runs[d] = lambda exe=exe: exe(feeds)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds + 3):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            if r >= 3:
                times[k].append(time.perf_counter() - t0)
    base = float(np.median(times["onnxruntime"]))
    for k, ts in times.items():
        med = float(np.median(ts))
        print(f"{k:40s} {med * 1e3:9.3f} ms   ort/this {base / med:5.2f}x")


if __name__ == "__main__":
    main()
