"""Command line: ``korch optimize | run | example``; errors are one line, never a traceback."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from korch.errors import KorchError

SUMMARY_FIELDS = [
    ("primitives", "primitives"),
    ("partitions", "partitions"),
    ("execution_states", "execution states"),
    ("rewrites_applied", "rewrites applied"),
    ("candidates", "candidates"),
    ("candidates_measured", "candidates measured"),
    ("candidates_predicted", "candidates only predicted"),
    ("profiling_rounds", "profiling rounds"),
    ("measurements_cached", "measurements from db"),
    ("blp_seconds", "BLP seconds"),
    ("plan_name", "plan shipped"),
    ("plan_family", "plan family"),
    ("kernels_chosen", "kernels chosen"),
    ("region_kernels", "library regions chosen"),
    ("redundant_primitives", "redundant primitives"),
    ("runtime_threads", "runtime threads"),
    ("cuda_graph", "CUDA graph"),
    ("latency_ms", "end-to-end latency (ms)"),
    ("onnxruntime_ms", "onnxruntime latency (ms)"),
    ("generated_share", "time in korch-generated kernels"),
    ("latency_over_predicted", "latency / sum of kernel costs"),
    ("speedup", "speedup vs onnxruntime"),
    ("max_rel_error", "max relative error"),
    ("optimize_seconds", "optimize seconds"),
    ("skipped", "optimizations skipped"),  # shown when some raised (Note [Skipped optimizations])
]


def format_summary(report: dict) -> str:
    rows = []
    for key, label in SUMMARY_FIELDS:
        if key not in report:
            continue
        v = report[key]
        if key == "skipped":
            if not v:
                continue
            v = sum(r.get("count", 1) for r in v)
        if isinstance(v, dict):
            v = sum(v.values())
        if isinstance(v, float):
            v = f"{v:.3g}" if key == "max_rel_error" else f"{v:.3f}"
        rows.append((label, str(v) if key != "cuda_graph" else v.split(":")[0]))
    width = max(len(r[0]) for r in rows)
    line = "-" * (width + 16)
    out = [line] + [f"{a:<{width}}  {b:>12}" for a, b in rows] + [line]
    return "\n".join(out)


def _parse_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]] | None:
    if not items:
        return None
    from korch.frontend import parse_shape_arg

    return dict(parse_shape_arg(s) for s in items)


def _check_target(target: str) -> None:
    """A one-line error, before any work, where the target cannot run here."""
    if target == "cuda":
        from korch.kernels.device import cuda_target_problem

        problem = cuda_target_problem()
        if problem:
            raise KorchError(problem)


def settings_from_args(args):
    from korch.config import Settings

    _check_target(args.target)
    kw = {"target": args.target, "progress": not args.quiet, "rewrite": args.rewrite}
    if not getattr(args, "cuda_graph", True):
        kw["cuda_graph"] = False
    if not getattr(args, "native", True):
        kw["native"] = False
    if args.target == "cuda":
        from korch.kernels.device import interpret

        if interpret():  # times under Triton's interpreter mean nothing: measure each candidate once
            kw.update(warmup=1, repeat=1, min_repeat_ms=0.0)
    if args.db:
        kw["db_path"] = args.db
    if args.threads:
        kw["num_threads"] = args.threads
    if not getattr(args, "openvino_plans", True):
        kw["openvino_plans"] = False
    if getattr(args, "composed_only", False):
        kw.update(library_regions=0, whole_plans=False)
    if getattr(args, "max_states", None):
        kw["max_states"] = args.max_states
    if getattr(args, "max_kernel_size", None):
        kw["max_kernel_size"] = args.max_kernel_size
    if getattr(args, "kernel_timeout", None):
        kw["kernel_timeout_s"] = args.kernel_timeout
    if getattr(args, "tracker", None):  # docs/distributed.md
        from korch.profile.rpc import check_options

        check_options(args.tracker, args.key or "")
        kw["tracker"], kw["rpc_key"] = args.tracker, args.key or ""
    if getattr(args, "exhaustive_profiling", False):
        kw["guided_profiling"] = False
    if not getattr(args, "plan_check", True):
        kw["region_bias"] = ()
    return Settings(**kw)


def cmd_optimize(args) -> int:
    from korch.api import optimize

    if not Path(args.model).exists():
        raise KorchError(f"{args.model}: no such file")
    compiled = optimize(
        args.model, output_dir=args.output, shapes=_parse_shapes(args.shape), settings=settings_from_args(args)
    )
    print(format_summary(compiled.report))
    print(f"wrote {args.output}/ (plan.json, kernels/, report.json)")
    return 0


def cmd_example(args) -> int:
    from korch.models import NAMES, save

    if args.name not in NAMES:
        raise KorchError(f"unknown example {args.name!r}; choose from {', '.join(NAMES)}")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.onnx"
    save(args.name, str(path))
    print(f"wrote {path}")
    if args.optimize:
        args.model, args.output, args.shape = str(path), str(out / args.name), None
        return cmd_optimize(args)
    return 0


def cmd_run(args) -> int:
    import numpy as np

    from korch.api import load

    exe = load(args.outdir)
    if not Path(args.inputs).exists():
        raise KorchError(f"{args.inputs}: no such file")
    with np.load(args.inputs) as z:
        feeds = {k: z[k] for k in z.files}
    outs = exe(feeds)
    if args.save:
        np.savez(args.save, **outs)
        print(f"wrote {args.save}: {', '.join(outs)}")
    else:
        for k, v in outs.items():
            print(f"{k}: {v.dtype}{list(v.shape)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="korch", description="Optimal kernel orchestration for ONNX models")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument(
            "--target",
            default="cpu",
            choices=["cpu", "cuda"],
            help="cpu: TVM, onnxruntime, numpy, torch kernels; cuda: Triton and cuBLAS/cuDNN kernels on a GPU "
            "(needs torch and triton; TRITON_INTERPRET=1 runs them on the CPU)",
        )
        sp.add_argument(
            "--no-cuda-graph",
            dest="cuda_graph",
            action="store_false",
            help="cuda target: always run the step loop, never a captured CUDA graph",
        )
        sp.add_argument(
            "--no-native",
            dest="native",
            action="store_false",
            help="cpu target: run every kernel from Python, no native segments (Settings native=False)",
        )
        sp.add_argument("--db", help="results database (default ~/.cache/korch/results.db or $KORCH_DB)")
        sp.add_argument("--threads", type=int, help="threads per kernel and for onnxruntime")
        sp.add_argument("--max-states", type=int, help="execution-state cap per partition")
        sp.add_argument("--max-kernel-size", type=int, metavar="N", help="most primitives in one candidate kernel")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
        sp.add_argument(
            "--exhaustive-profiling",
            action="store_true",
            help="measure every candidate kernel (default: model-guided, only what could be chosen)",
        )
        sp.add_argument("--no-rewrite", dest="rewrite", action="store_false", help="skip the primitive-graph rewrites")
        sp.add_argument(
            "--no-plan-check",
            dest="plan_check",
            action="store_false",
            help="keep the BLP's plan without timing alternatives end to end (deterministic choice)",
        )
        sp.add_argument(
            "--no-openvino",
            dest="openvino_plans",
            action="store_false",
            help="race no whole-graph OpenVINO plan (Note [OpenVINO as a library])",
        )
        sp.add_argument(
            "--composed-only",
            action="store_true",
            help="ship a plan korch composed from its own candidates: no library regions, no whole-graph "
            "onnxruntime plan (Settings library_regions=0, whole_plans=False)",
        )

    o = sub.add_parser("optimize", help="optimize an ONNX model into an executable folder")
    o.add_argument("model")
    o.add_argument("-o", "--output", required=True)
    o.add_argument("--shape", action="append", metavar="NAME=d0,d1,...", help="bind a symbolic input shape")
    o.add_argument("--tracker", metavar="HOST:PORT", help="time TVM kernels on this TVM RPC tracker's servers")
    o.add_argument("--key", help="the RPC servers' device key (with --tracker)")
    o.add_argument("--kernel-timeout", type=float, metavar="S", help="time limit per kernel build+measurement")
    common(o)
    o.set_defaults(fn=cmd_optimize)

    e = sub.add_parser("example", help="write a built-in test model (and optimize it)")
    e.add_argument("name", nargs="?", default="attention")
    e.add_argument("-o", "--output", default="korch-out")
    e.add_argument("--no-optimize", dest="optimize", action="store_false")
    common(e)
    e.set_defaults(fn=cmd_example)

    r = sub.add_parser("run", help="run an optimized model on inputs from an .npz file")
    r.add_argument("outdir")
    r.add_argument("--inputs", required=True)
    r.add_argument("--save")
    r.set_defaults(fn=cmd_run)

    # commands of other packages (korch bench and korch explain, from korch.bench): plugins
    # named in the "korch.commands" entry-point group, so the product never imports them
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="korch.commands"), key=lambda ep: ep.name):
        ep.load()(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="korch: %(message)s")
    try:
        return args.fn(args)
    except KorchError as e:
        print(f"korch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("korch: interrupted (finished measurements are kept in the database)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - one line for users; KORCH_DEBUG=1 shows the traceback
        if os.environ.get("KORCH_DEBUG"):
            raise
        print(f"korch: internal error: {type(e).__name__}: {e} (set KORCH_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
