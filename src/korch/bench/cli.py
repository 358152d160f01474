"""The ``bench`` and ``explain`` sub-commands, added to korch's parser by ``add_parsers``."""

from __future__ import annotations

import json
from pathlib import Path

from korch.errors import KorchError


def cmd_bench(args) -> int:
    from korch.bench.suite import ALL_PEERS, run_bench
    from korch.cli import settings_from_args

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in ALL_PEERS]
    if bad:
        raise KorchError(f"unknown peer(s) {bad}; choose from {', '.join(ALL_PEERS)}")
    for m in args.models:
        if not Path(m).exists():
            raise KorchError(f"{m}: no such file")
    out = Path(args.output)
    run_bench(
        args.models,
        out,
        settings_from_args(args),
        peers=peers,
        rounds=args.rounds,
        tvm_runs=args.tvm_runs,
        reoptimize=args.reoptimize,
        json_path=args.json or out / "bench.json",
        plot_path=None if args.no_plot else (args.plot or out / "bench.png"),
        isolate=not args.in_process,
        processes=args.processes,
    )
    return 0


def cmd_explain(args) -> int:
    from korch.bench.explain import explain, explain_json, format_explain, render

    if not (Path(args.outdir) / "plan.json").exists():
        raise KorchError(f"{args.outdir} is not a korch output folder (no plan.json); run `korch optimize` first")
    info = explain(args.outdir, runs=args.runs, top=args.top, num_threads=args.threads)
    print(format_explain(info))
    if args.json:
        Path(args.json).write_text(json.dumps(explain_json(info), indent=1, default=str))
        print(f"wrote {args.json}")
    if not args.no_picture:
        stem = Path(args.picture) if args.picture else Path(args.outdir) / "kernels"
        for p in render(info, stem.with_suffix(""), args.renderer):
            print(f"wrote {p}")
    return 0


def add_parsers(sub, common) -> None:
    b = sub.add_parser("bench", help="time korch against onnxruntime, OpenVINO, PyTorch and TVM on ONNX models")
    b.add_argument("models", nargs="+", metavar="MODEL.onnx")
    b.add_argument("-o", "--output", default="korch-bench", help="folder of per-model executables, JSON and plot")
    b.add_argument(
        "--peers",
        default="ort,ov,eager,compile,tvm",
        help="comma list of ort, ov (OpenVINO, fp32), eager, compile, tvm",
    )
    b.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds (capped at about a minute)")
    b.add_argument(
        "--processes",
        type=int,
        default=3,
        help="fresh processes per engine, one set after another; the median over them is reported",
    )
    b.add_argument("--tvm-runs", type=int, default=3, help="timed runs of the (slow) untuned TVM build")
    b.add_argument("--reoptimize", action="store_true", help="optimize even if the output folder has an executable")
    b.add_argument("--json", help="results JSON (default OUTPUT/bench.json)")
    b.add_argument("--plot", help="speedup plot PNG (default OUTPUT/bench.png; needs matplotlib)")
    b.add_argument("--no-plot", action="store_true")
    b.add_argument(
        "--in-process", action="store_true", help="time every engine in this process, not each in its own process"
    )
    common(b)
    b.set_defaults(fn=cmd_bench)

    e = sub.add_parser("explain", help="per-kernel time breakdown and a picture of an optimized model")
    e.add_argument("outdir")
    e.add_argument("--runs", type=int, default=20)
    e.add_argument("--top", type=int, default=15, help="how many of the slowest kernels to list")
    e.add_argument("--threads", type=int, help="threads per kernel (default: all cores)")
    e.add_argument("--json", help="write the breakdown as JSON")
    e.add_argument("--picture", help="picture path stem (default OUTDIR/kernels.{dot,svg,png})")
    e.add_argument("--renderer", choices=["auto", "dot", "python"], default="auto")
    e.add_argument("--no-picture", action="store_true")
    e.set_defaults(fn=cmd_explain)
