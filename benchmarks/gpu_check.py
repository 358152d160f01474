"""The cuda target on a GPU: optimize, check against onnxruntime-CPU, time korch vs PyTorch.

Run through ``benchmarks/gpu_check.sh`` (the lent H200; see that script). Each model runs
in its own process with a time limit, so a failing or slow model costs only itself:

1. optimize the model for ``target="cuda"`` (Triton kernels, torch_cuda linear kernels,
   onnxruntime for opaque primitives; profiling with CUDA events),
2. check every output against onnxruntime-CPU (normwise relative error <= 1e-4),
3. time, with CUDA events on device-resident inputs (medians of several samples):
   korch (tensors stay on the GPU), korch replayed as a CUDA graph, PyTorch eager and
   torch.compile on the same network (the suite's torch module when
   ``benchmarks/export_suite.py`` can build it, else the ONNX graph executed op by op
   with torch: ``OnnxTorch``), and onnxruntime-CPU for reference.

The table is printed last and written to ``$OUT/gpu_check.md`` (rows also as JSON).
``--interpret`` runs the same path on the CPU under Triton's interpreter with tiny
models (a dry run; its times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZOO = ["mlp", "attention", "candy_block", "segformer_block", "yolo_block", "opaque"]
SUITE = ["vit_tiny:1", "efficientvit:1", "candy:1", "yolo:1", "segformer:1", "bert2:1"]


# --- an ONNX graph run op by op with torch (the eager peer for the test models) -------------
class OnnxTorch:
    """Runs an ONNX model's nodes with torch ops (the operators of korch's test models)."""

    def __init__(self, model, device: str):
        import torch
        from onnx import numpy_helper

        self.torch = torch
        self.model = model
        self.inits = {
            t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).to(device) for t in model.graph.initializer
        }
        self.consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in self.inits]
        self.outputs = [o.name for o in model.graph.output]

    def __call__(self, *xs):
        import torch.nn.functional as F

        torch = self.torch
        env = dict(self.inits)
        env.update(zip(self.inputs, xs))
        for node in self.model.graph.node:
            a = {at.name: _attr(at) for at in node.attribute}
            ins = [env[n] if n else None for n in node.input]
            op = node.op_type
            if op in ("Add", "Sub", "Mul", "Div"):
                y = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op](ins[0], ins[1])
            elif op == "MatMul":
                y = torch.matmul(ins[0], ins[1])
            elif op in ("Erf", "Relu", "Sigmoid", "Tanh", "Sqrt", "Exp"):
                y = getattr(torch, op.lower())(ins[0])
            elif op == "Softmax":
                y = torch.softmax(ins[0], dim=a.get("axis", -1))
            elif op == "LayerNormalization":
                axis = a.get("axis", -1)
                shape = ins[0].shape[axis:] if axis != -1 else ins[0].shape[-1:]
                y = F.layer_norm(ins[0], shape, ins[1], ins[2] if len(ins) > 2 else None, a.get("epsilon", 1e-5))
            elif op == "Reshape":
                y = ins[0].reshape([int(v) for v in self.consts[node.input[1]]])
            elif op == "Transpose":
                y = ins[0].permute(*a["perm"])
            elif op == "Conv":
                nsp = ins[0].dim() - 2
                pads = a.get("pads", [0] * 2 * nsp)
                x = ins[0]
                if list(pads[:nsp]) != list(pads[nsp:]):
                    x = F.pad(x, [p for i in reversed(range(nsp)) for p in (pads[i], pads[nsp + i])])
                    pads = [0] * 2 * nsp
                y = F.conv2d(
                    x,
                    ins[1],
                    ins[2] if len(ins) > 2 else None,
                    a.get("strides", 1),
                    list(pads[:nsp]),
                    a.get("dilations", 1),
                    a.get("group", 1),
                )
            elif op == "InstanceNormalization":
                y = F.instance_norm(ins[0], weight=ins[1], bias=ins[2], eps=a.get("epsilon", 1e-5))
            elif op == "BatchNormalization":
                y = F.batch_norm(ins[0], ins[3], ins[4], ins[1], ins[2], False, 0.0, a.get("epsilon", 1e-5))
            elif op == "Pad":
                pads = [int(v) for v in self.consts[node.input[1]]]
                n = len(pads) // 2
                tp = [p for i in reversed(range(n)) for p in (pads[i], pads[n + i])]
                while len(tp) > 2 and tp[-1] == 0 and tp[-2] == 0:
                    tp = tp[:-2]
                mode = a.get("mode", "constant")
                y = F.pad(ins[0], tp, mode={"edge": "replicate"}.get(mode, mode))
            elif op == "Concat":
                y = torch.cat(ins, dim=a["axis"])
            elif op == "Split":
                sizes = [int(v) for v in self.consts[node.input[1]]]
                for name, part in zip(node.output, torch.split(ins[0], sizes, dim=a.get("axis", 0))):
                    env[name] = part
                continue
            elif op == "MaxPool":
                k = a["kernel_shape"]
                pads = a.get("pads", [0] * 2 * len(k))
                y = F.max_pool2d(ins[0], k, a.get("strides", k), list(pads[: len(k)]))
            elif op == "Resize":
                scales = [float(v) for v in self.consts[node.input[2]]]
                y = F.interpolate(ins[0], scale_factor=scales[2:], mode="nearest")
            elif op == "TopK":
                k = int(self.consts[node.input[1]].reshape(-1)[0])
                vals, idx = torch.topk(ins[0], k, dim=a.get("axis", -1), largest=bool(a.get("largest", 1)))
                env[node.output[0]] = vals
                if len(node.output) > 1 and node.output[1]:
                    env[node.output[1]] = idx
                continue
            elif op == "ReduceMean":
                y = ins[0].mean(dim=a["axes"], keepdim=bool(a.get("keepdims", 1)))
            else:
                raise NotImplementedError(f"OnnxTorch: {op}")
            env[node.output[0]] = y
        outs = tuple(env[o] for o in self.outputs)
        return outs if len(outs) > 1 else outs[0]


def _attr(at):
    from onnx import helper

    return helper.get_attribute_value(at)


# --- timing -----------------------------------------------------------------------------------
def time_fn(fn, cuda: bool, warmup: int = 3, samples: int = 7, min_ms: float = 20.0) -> float:
    """Median milliseconds per call: CUDA events around back-to-back calls on a GPU."""
    for _ in range(warmup):
        fn()
    if cuda:
        import torch

        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        inner = max(1, min(1000, int(min_ms / max(s.elapsed_time(e), 1e-3))))
        out = []
        for _ in range(samples):
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) / inner)
        return statistics.median(out)
    t0 = time.perf_counter()
    fn()
    inner = max(1, int(min_ms * 1e-3 / max(time.perf_counter() - t0, 1e-6)))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) / inner * 1e3)
    return statistics.median(out)


# --- one model ----------------------------------------------------------------------------------
def _model(spec: str, tiny: bool, suite_dir: Path):
    """(onnx ModelProto or path, torch module or None, torch feeds order) for a model spec."""
    if ":" not in spec:
        from korch.models import build, zoo

        if tiny:
            small = {"mlp": dict(seq=4, dim=8), "attention": dict(seq=4, dim=8, heads=2)}
            model = getattr(zoo, spec)(**small[spec]) if spec in small else build(spec)
        else:
            model = build(spec)
        return model, None
    name, batch = spec.split(":")
    path = suite_dir / f"{name}_b{batch}.onnx"
    local = HERE / "models" / path.name
    sys.path.insert(0, str(HERE))
    import export_suite  # noqa: E402  (benchmarks/export_suite.py: the suite's torch modules)

    if local.exists():
        path = local
    elif not path.exists():
        path = export_suite.export(name, int(batch), suite_dir)
    module, _ = export_suite.build(name, int(batch))
    return str(path), module


def run_one(spec: str, args) -> dict:
    os.environ.setdefault("KORCH_CACHE_DIR", str(Path(args.work) / "cache"))
    import numpy as np
    import onnx
    import torch

    import korch
    from korch.kernels import device as D
    from korch.profile.e2e import max_rel_error, ort_session, random_feeds

    cuda = D.device_name() == "cuda"
    dev = "cuda" if cuda else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    row: dict = {"model": spec, "device": torch.cuda.get_device_name() if cuda else "cpu (triton interpreter)"}
    model, module = _model(spec, args.tiny, Path(args.work) / "suite")
    proto = onnx.load(model) if isinstance(model, str) else model
    from korch.config import Settings

    extra = {"kernel_memory_mb": 16384.0} if hasattr(Settings(), "kernel_memory_mb") else {}  # CUDA context + torch
    t0 = time.perf_counter()
    cm = korch.optimize(
        model,
        **extra,
        target="cuda",
        db_path=str(Path(args.work) / "results.db"),
        measure=False,
        progress=False,
        max_kernel_size=args.max_kernel_size,
        kernel_timeout_s=60.0,
        warmup=2 if cuda else 1,
        repeat=5 if cuda else 1,
        min_repeat_ms=0.5 if cuda else 0.0,
        num_threads=min(8, os.cpu_count() or 1),
    )
    row["optimize_s"] = round(time.perf_counter() - t0, 1)
    row["kernels"] = cm.report.get("kernels_by_backend", {})
    row["candidates"] = cm.report.get("candidates")
    row["failed_measurements"] = cm.report.get("measurements_failed")
    feeds = random_feeds(cm.executable.inputs, 1)
    sess = ort_session(proto, min(8, os.cpu_count() or 1))
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    got = cm(feeds)
    row["rel_err"] = max_rel_error({k: got[k] for k in want}, want)
    row["ok"] = bool(row["rel_err"] <= 1e-4)

    exe = cm.executable
    runner = exe.device_runner()
    dev_feeds = runner.inputs_to_device(feeds)
    row["korch_ms"] = time_fn(lambda: runner.run_device(dev_feeds), cuda)
    if cuda:
        from korch.executable.device import DeviceRunner

        graph_runner = DeviceRunner(exe, cuda_graph=True)
        try:
            out = graph_runner.run_device(dev_feeds)
            err = max_rel_error({k: D.to_host(v) for k, v in out.items() if k in want}, want)
            row["korch_graph_ms"] = time_fn(lambda: graph_runner.run_device(dev_feeds), cuda) if err <= 1e-4 else None
            row["graph_rel_err"] = err
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["korch_graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    row["ort_cpu_ms"] = time_fn(lambda: sess.run(None, feeds), False, samples=3)

    # peers: the torch module (suite) or the ONNX graph executed op by op with torch
    if module is None:
        peer = OnnxTorch(proto, dev)
        order = peer.inputs
    else:
        peer = module.to(dev)
        order = list(exe.inputs)
    xs = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(dev) for n in order]
    with torch.no_grad():
        try:
            res = peer(*xs)
            res = res if isinstance(res, tuple) else (res,)
            if hasattr(res[0], "last_hidden_state"):
                res = (res[0].last_hidden_state,)
            if module is None:
                row["eager_rel_err"] = max_rel_error(
                    {n: r.detach().cpu().numpy() for n, r in zip(peer.outputs, res)}, want
                )
            row["eager_ms"] = time_fn(lambda: peer(*xs), cuda)
        except Exception as e:  # noqa: BLE001
            row["eager_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if cuda and not args.no_compile:
            try:
                t0 = time.perf_counter()
                compiled = torch.compile(peer)
                compiled(*xs)
                torch.cuda.synchronize()
                row["compile_s"] = round(time.perf_counter() - t0, 1)
                row["compile_ms"] = time_fn(lambda: compiled(*xs), cuda)
            except Exception as e:  # noqa: BLE001
                row["compile_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return row


# --- the driver ---------------------------------------------------------------------------------
def _fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}" if not math.isnan(x) else "nan"
    return str(x)


def table(rows: list[dict]) -> str:
    head = [
        "model",
        "ok",
        "rel err",
        "kernels",
        "optimize s",
        "korch ms",
        "korch+graph ms",
        "eager ms",
        "compile ms",
        "ort-cpu ms",
        "vs eager",
        "vs compile",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        best = min([v for v in (r.get("korch_ms"), r.get("korch_graph_ms")) if v], default=None)
        ve = r.get("eager_ms") / best if best and r.get("eager_ms") else None
        vc = r.get("compile_ms") / best if best and r.get("compile_ms") else None
        kern = ",".join(f"{k}:{v}" for k, v in sorted((r.get("kernels") or {}).items()))
        ok = "yes" if r.get("ok") else ("ERROR" if r.get("error") else "NO")
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    ok,
                    _fmt(r.get("rel_err"), 2),
                    kern or "-",
                    _fmt(r.get("optimize_s")),
                    _fmt(r.get("korch_ms")),
                    _fmt(r.get("korch_graph_ms")),
                    _fmt(r.get("eager_ms")),
                    _fmt(r.get("compile_ms")),
                    _fmt(r.get("ort_cpu_ms")),
                    f"{ve:.2f}x" if ve else "-",
                    f"{vc:.2f}x" if vc else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def _write_table(rows: list[dict], path: Path) -> None:
    dev = next((r.get("device") for r in rows if r.get("device")), "?")
    header = f"korch cuda target, {time.strftime('%Y-%m-%d')}, device: {dev}\n\n"
    errors = "\n".join(f"- {r['model']}: {r['error']}" for r in rows if r.get("error"))
    path.write_text(header + table(rows) + ("\n\nErrors:\n" + errors if errors else "") + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="zoo names, or suite NAME:BATCH (default: zoo, then suite)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/korch_gpu_check"))
    p.add_argument("--work", default="/tmp/korch_gpu_work")
    p.add_argument("--budget-s", type=float, default=480.0, help="stop starting models after this")
    p.add_argument("--per-model-s", type=float, default=240.0)
    p.add_argument("--max-kernel-size", type=int, default=8)
    p.add_argument("--tiny", action="store_true", help="tiny zoo shapes (the interpreter dry run)")
    p.add_argument("--no-suite", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.one:
        try:
            row = run_one(args.one, args)
        except Exception as e:  # noqa: BLE001 - the row says what broke
            traceback.print_exc()
            row = {"model": args.one, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print("ROW " + json.dumps(row, default=str), flush=True)
        return 0

    models = args.models or (ZOO + ([] if args.no_suite else SUITE))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    rows: list[dict] = []
    for spec in models:
        left = args.budget_s - (time.monotonic() - t_start)
        if left < 20:
            rows.append({"model": spec, "ok": False, "error": "skipped: time budget spent"})
            continue
        limit = min(args.per_model_s, left)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", spec, "--work", args.work]
        cmd += ["--max-kernel-size", str(args.max_kernel_size)]
        cmd += ["--tiny"] if args.tiny else []
        cmd += ["--no-compile"] if args.no_compile else []
        print(f"== {spec} (limit {limit:.0f} s)", flush=True)
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            log = r.stdout + r.stderr
            found = [ln for ln in r.stdout.splitlines() if ln.startswith("ROW ")]
            row = json.loads(found[-1][4:]) if found else {"model": spec, "ok": False, "error": f"exit {r.returncode}"}
        except subprocess.TimeoutExpired as e:
            log = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            row = {"model": spec, "ok": False, "error": f"timeout after {limit:.0f} s"}
        row["wall_s"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        with open(out / "gpu_check.log", "a") as f:
            f.write(f"== {spec}\n{log[-20000:]}\n")
        print(json.dumps(row, default=str), flush=True)
        (out / "gpu_check.json").write_text(json.dumps(rows, indent=1, default=str))
        _write_table(rows, out / "gpu_check.md")  # after every model: a killed run keeps its rows
    _write_table(rows, out / "gpu_check.md")
    return 0 if all(r.get("ok") for r in rows if not str(r.get("error", "")).startswith("skipped")) else 1


if __name__ == "__main__":
    sys.exit(main())
