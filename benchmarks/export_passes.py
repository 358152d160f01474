"""An export pass measured: korch's graph exported with and without it, and the model.

    python benchmarks/export_passes.py MODEL.onnx [--pass rows] [--rewrite] [--rounds 15]

Exports korch's fissioned graph (``--rewrite``: after the search's rewrites) as one
onnxruntime model the way ``korch.kernels.ort.export`` does, once with every export pass and
once with ``--pass`` (``rows``: Note [Row islands]; ``subpixel``: Note [Sub-pixel
convolution]) left out, and times both and the model itself in one process,
onnxruntime with 2 threads, in shuffled order round by round (medians; ``rel``: the
median over rounds of each time over the full export's). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
from unittest import mock

import numpy as np
import onnxruntime as ort
from ort_ops import primitive_export

from korch.profile.e2e import time_shuffled

PASSES = {"rows": "korch.kernels.ort.export.flatten_rows", "subpixel": "korch.kernels.ort.export.subpixel_convs"}


def _session(model: bytes | str, threads: int):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--pass", dest="which", default="rows", choices=sorted(PASSES))
    p.add_argument("--rewrite", action="store_true")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    full = primitive_export(args.model, args.rewrite)
    with mock.patch(PASSES[args.which], side_effect=lambda m: m):
        without = primitive_export(args.model, args.rewrite)
    sessions = {
        "export": _session(full, args.threads),
        f"export without {args.which}": _session(without, args.threads),
        "the model": _session(args.model, args.threads),
    }
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sessions["the model"].get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        floating = "float" in i.type
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32) if floating else rng.integers(0, 4, shape)
    values = list(feeds.values())  # the exports' inputs are in the model's order (in0, in1 ...)
    runs = {}
    for name, s in sessions.items():
        f = {i.name: (v if "float" in i.type else v.astype(np.int64)) for i, v in zip(s.get_inputs(), values)}
        runs[name] = lambda s=s, f=f: s.run(None, f)
    want = runs["the model"]()
    for name, run in runs.items():
        err = max(float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)) for g, w in zip(run(), want))
        print(f"{name}: max relative error {err:.1e}")
    per_round = {k: [t * 1e3 for t in v] for k, v in time_shuffled(runs, args.rounds, args.calls).items()}
    base = per_round["export"]
    for name, v in per_round.items():
        rel = statistics.median(x / b for x, b in zip(v, base))
        print(f"{name:24s} {statistics.median(v):9.3f} ms  rel {rel:.3f}")


if __name__ == "__main__":
    main()
