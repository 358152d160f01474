"""What fission alone is worth (Korch paper, Fig. 7): onnxruntime on the primitive graph.

For each model, the original ONNX model, its fissioned primitive graph and the
fissioned+rewritten primitive graph (both exported with ``korch.kernels.ort.export``) run in
onnxruntime with the same thread count, all graph optimizations and no spinning thread
pools (three sessions alternate, and an idle session's spinning pool would steal the
cores from the running one: Note [No spinning thread pools]); the engines alternate
round by round and we report medians (other processes share the machine).
Outputs are checked against the original model (normwise relative error).

    .venv/bin/python benchmarks/fission_only.py [MODEL.onnx ...] [--shape NAME=d0,d1] [--threads 2]

Without model paths it runs the built-in test models (``korch.models.NAMES``).
"""

from __future__ import annotations

import argparse
import os
import time

import onnx

from korch.config import Settings
from korch.fission import fission
from korch.frontend import load_model, parse_shape_arg
from korch.kernels.ort.export import to_onnx
from korch.models import NAMES, build
from korch.profile.e2e import max_rel_error, random_feeds, time_alternating
from korch.rewrite import optimize_graph


def ort_session(model: onnx.ModelProto, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


class _Spec:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def study(name: str, model: onnx.ModelProto, shapes, threads: int, rounds: int, rewrite_s: float) -> dict:
    loaded = load_model(model, shapes)
    graph = fission(loaded)
    t0 = time.perf_counter()
    d = Settings()  # the pipeline's search limits
    rewritten, stats = optimize_graph(
        graph, budget=d.rewrite_budget, patience=d.rewrite_patience, time_limit_s=rewrite_s
    )
    rewrite_seconds = time.perf_counter() - t0
    feeds = random_feeds({n: _Spec(graph.nodes[i].shape, graph.nodes[i].dtype) for n, i in graph.inputs.items()})
    sessions = {
        "original": ort_session(loaded, threads),
        "primitive": ort_session(to_onnx(graph), threads),
        "rewritten": ort_session(to_onnx(rewritten), threads),
    }
    outs = {}
    for k, sess in sessions.items():
        names = [o.name for o in sess.get_outputs()]
        outs[k] = dict(zip(names, sess.run(None, feeds)))
    timing = time_alternating({k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()}, rounds=rounds)
    med = {k: v["median_ms"] for k, v in timing.items()}
    p10 = {f"{k}_p10": v["p10_ms"] for k, v in timing.items()}
    return {
        "model": name,
        "primitives": len(graph.compute_ids()),
        "rewritten_primitives": len(rewritten.compute_ids()),
        "rewrites": sum(stats.applied.values()),
        "rewrite_s": rewrite_seconds,
        **{f"{k}_ms": v for k, v in med.items()},
        **p10,
        "err_primitive": max_rel_error(outs["primitive"], outs["original"]),
        "err_rewritten": max_rel_error(outs["rewritten"], outs["original"]),
    }


def table(rows: list[dict], threads: int, load: tuple[float, float, float]) -> str:
    head = (
        f"onnxruntime {ort_version()}, {threads} threads, ORT_ENABLE_ALL, no spinning; "
        f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) on {os.cpu_count()} cores\n\n"
        "| model | primitives (rewritten) | rewrites | original ms | primitive ms | rewritten ms "
        "| primitive / original (p10) | rewritten / original (p10) | max rel err (prim / rw) |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['primitives']} ({r['rewritten_primitives']}) | {r['rewrites']} "
            f"| {r['original_ms']:.3f} | {r['primitive_ms']:.3f} | {r['rewritten_ms']:.3f} "
            f"| {r['primitive_ms'] / r['original_ms']:.2f}x ({r['primitive_p10'] / r['original_p10']:.2f}x) "
            f"| {r['rewritten_ms'] / r['original_ms']:.2f}x ({r['rewritten_p10'] / r['original_p10']:.2f}x) "
            f"| {r['err_primitive']:.1e} / {r['err_rewritten']:.1e} |"
        )
    return "\n".join(lines)


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help="ONNX files (default: the built-in test models)")
    p.add_argument("--shape", action="append", metavar="NAME=d0,d1,...", help="bind a symbolic input shape")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument(
        "--rewrite-time", type=float, default=Settings().rewrite_time_limit_s, help="rewrite search time limit (s)"
    )
    args = p.parse_args()
    shapes = dict(parse_shape_arg(s) for s in args.shape) if args.shape else None
    load = os.getloadavg()
    rows = []
    for name in NAMES if not args.models else args.models:
        model = build(name) if not args.models else onnx.load(name)
        label = name if not args.models else os.path.basename(name)
        r = study(label, model, shapes, args.threads, args.rounds, args.rewrite_time)
        print(f"{label}: {r['original_ms']:.3f} / {r['primitive_ms']:.3f} / {r['rewritten_ms']:.3f} ms", flush=True)
        rows.append(r)
    print()
    print(table(rows, args.threads, load))


if __name__ == "__main__":
    main()
