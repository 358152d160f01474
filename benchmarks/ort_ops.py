"""Where onnxruntime spends its time on a model, and on korch's primitive export of it.

    python benchmarks/ort_ops.py MODEL.onnx [--threads 1] [--runs 30]
    python benchmarks/ort_ops.py MODEL.onnx --graph     # operator counts only, no timing

Prints onnxruntime's per-operator-type time (its own profiler, median run) for the
model as given, for korch's fissioned graph exported back with ``to_onnx`` (what a
library region runs, Note [Library regions]) and for the fissioned and rewritten
graph. This is how the raising of Note [Raising] was found: a pattern onnxruntime
does not recognise shows up as Gather, ReorderInput/ReorderOutput or elementwise
time that the original model does not have. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort

from korch import pipeline as P
from korch.config import Settings
from korch.ir.subgraph import extract, kernel_consts, make_kernel
from korch.kernels.ort.export import to_onnx


def primitive_export(model: str, rewrite: bool) -> bytes:
    ctx = P.Context(Settings(rewrite=rewrite, progress=False), model, None)
    for _, fn in P.STEPS[:3]:  # load, fission, rewrite
        fn(ctx)
    g = ctx.graph
    k = make_kernel(g, g.users(), g.compute_ids())
    return to_onnx(extract(g, k), const_inputs=kernel_consts(g, k)).SerializeToString()


def profile(model: bytes, threads: int, runs: int) -> tuple[float, list[tuple[str, float, int]]]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    opts.log_severity_level = 3
    opts.profile_file_prefix = os.path.join(tempfile.gettempdir(), "korch_ort_ops")
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.standard_normal(i.shape).astype(np.float32)
        if "float" in i.type
        else rng.integers(0, 4, i.shape).astype(np.int64)
        for i in sess.get_inputs()
    }
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    total: dict[str, float] = collections.Counter()
    count: dict[str, int] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            total[e["args"]["op_name"]] += e["dur"] / runs
            count[e["args"]["op_name"]] += 1
    rows = sorted(((op, us, count[op] // runs) for op, us in total.items()), key=lambda r: -r[1])
    return sum(total.values()), rows


def optimized_ops(model: bytes) -> collections.Counter:
    """Operator counts of the graph onnxruntime runs after its own fusions."""
    import onnx

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory() as d:
        opts.optimized_model_filepath = os.path.join(d, "optimized.onnx")
        ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        graph = onnx.load(opts.optimized_model_filepath, load_external_data=False).graph
    return collections.Counter(n.op_type for n in graph.node)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--top", type=int, default=12)
    p.add_argument(
        "--graph",
        action="store_true",
        help="no timing: operator counts that differ between onnxruntime's optimized graphs of the model and of "
        "korch's primitive export (what Note [Raising] has not raised yet)",
    )
    args = p.parse_args()
    if args.graph:
        a = optimized_ops(open(args.model, "rb").read())
        b = optimized_ops(primitive_export(args.model, rewrite=False))
        for op in sorted(set(a) | set(b)):
            if a[op] != b[op]:
                print(f"    {op:28s} model {a[op]:4d}   korch export {b[op]:4d}")
        print(f"operators after onnxruntime's fusions: model {sum(a.values())}, korch export {sum(b.values())}")
        return
    variants = {
        "original": open(args.model, "rb").read(),
        "primitives": primitive_export(args.model, rewrite=False),
        "primitives, rewritten": primitive_export(args.model, rewrite=True),
    }
    for name, model in variants.items():
        total, rows = profile(model, args.threads, args.runs)
        print(f"{name}: {total / 1e3:.2f} ms of operator time per run")
        for op, us, n in rows[: args.top]:
            print(f"    {op:18s} {us / 1e3:7.3f} ms  x{n}")


if __name__ == "__main__":
    main()
