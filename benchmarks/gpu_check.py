"""The cuda target on a GPU: optimize, check against onnxruntime-CPU, time korch vs its peers.

Run through ``benchmarks/gpu_check.sh`` (the lent H200; see that script). Each model runs
in its own process with a time limit, so a failing or slow model costs only itself, and
reports every phase it finished:

1. optimize the model for ``target="cuda"`` (Triton kernels, torch_cuda linear kernels,
   onnxruntime for opaque primitives; profiling with CUDA events; the pipeline's CUDA
   graph choice, Note [CUDA graph choice]),
2. check every output against onnxruntime-CPU (max relative error <= ``TOL``),
3. time, with CUDA events on device-resident inputs (medians of several samples):
   korch's step loop, the same plan replayed as one CUDA graph, PyTorch eager,
   torch.compile (default and max-autotune) on the same network (the suite's torch
   module when ``benchmarks/export_suite.py`` can build it, else the ONNX graph executed
   op by op with torch: ``OnnxTorch``), onnxruntime's CUDA and TensorRT providers where
   the installed onnxruntime has them (IOBinding), and onnxruntime-CPU for reference;
   every peer's outputs are checked against onnxruntime-CPU too,
4. the generated memory-bound kernels' bandwidth (Note [Memory-bound bandwidth]).

The table is printed last and written to ``$OUT/gpu_check.md`` (rows also as JSON).
``--tiny`` with ``TRITON_INTERPRET=1`` runs the same path on the CPU under Triton's
interpreter (the dry run in tests/benchmarks/test_gpu_check.py; its times mean nothing,
and the CUDA graph, torch.compile and onnxruntime-GPU columns are skipped).
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
# in the order they run: a few test and suite models that fit one device call (gpu_check.sh)
MODELS = ["mlp", "attention", "segformer_block", "vit_tiny:1", "candy_block", "segformer:1", "opaque", "candy:1"]


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


# Note [Memory-bound bandwidth]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A generated kernel is memory-bound: its worth is the share of the device's memory
# bandwidth it reaches. Each Triton kernel of the plan is timed alone, and the bytes it
# moves are taken from its tensors' sizes (inputs, outputs, gather tables, each once);
# the row gives all of them together (bytes over time) and the best one. The peak is the
# spec sheet's, by device name (GB/s, below); a device-to-device copy is measured too
# (an H200's moved about 4.3 TB/s here, /work/.library/device/KINDS.md), and is the
# reference where the name is not listed.
PEAK_GBPS = {
    "H200": 4800.0,
    "H100 80GB HBM3": 3350.0,
    "H100 PCIe": 2000.0,
    "A100-SXM4-80GB": 2039.0,
    "A100-SXM4-40GB": 1555.0,
    "A100-PCIE-40GB": 1555.0,
    "L4": 300.0,
}
TOL = 1e-4  # every engine's outputs against onnxruntime-CPU, normwise relative


def peak_gbps(name: str) -> float | None:
    for key, v in sorted(PEAK_GBPS.items(), key=lambda kv: -len(kv[0])):
        if key in name:
            return v
    return None


def copy_gbps(cuda: bool, mbytes: int) -> float:
    """Bytes read plus written per second by a tensor copy on the device (GB/s)."""
    import torch

    dev = "cuda" if cuda else "cpu"
    x = torch.empty(mbytes * 2**18, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    ms = time_fn(lambda: y.copy_(x), cuda, warmup=2, samples=5, min_ms=10.0)
    return 2 * x.numel() * 4 / ms / 1e6


def kernel_bandwidth(exe, runner, dev_feeds, cuda: bool) -> list[dict]:
    """Note [Memory-bound bandwidth]: each generated (Triton) kernel timed alone on the
    tensors the step loop gives it; bytes moved are its inputs', outputs' and gather
    tables' sizes (each counted once: a lower bound when a kernel rereads an input)."""

    env = dict(runner.consts)
    env.update({spec.node: dev_feeds[name] for name, spec in exe.inputs.items()})
    rows = []
    for step in exe.steps:
        k = step.kernel
        args = [env[i] for i in step.inputs]
        outs = runner.run_step(step, args)
        env.update(zip(step.outputs, outs))
        if step.backend != "triton":
            continue
        nbytes = sum(t.numel() * t.element_size() for t in (*args, *outs, *k.hidden))
        ms = time_fn(lambda k=k, args=args: k.run_device(args), cuda, warmup=2, samples=5 if cuda else 1, min_ms=2.0)
        rows.append({"step": step.name, "bytes": nbytes, "us": ms * 1e3, "gbps": nbytes / ms / 1e6})
    return rows


def _peer_err(res, want: dict) -> float:
    from korch.profile.e2e import max_rel_error

    res = res if isinstance(res, (tuple, list)) else (res,)
    if hasattr(res[0], "last_hidden_state"):
        res = (res[0].last_hidden_state,)
    got = {
        n: r.detach().float().cpu().numpy() if r.dtype.is_floating_point else r.cpu().numpy() for n, r in zip(want, res)
    }
    if len(got) != len(want):
        return float("inf")
    return max_rel_error(got, want)


def _ort_device_peer(proto, feeds: dict, want: dict, provider: str, row: dict, key: str) -> None:
    """onnxruntime on the GPU (CUDA or TensorRT provider) with device-resident inputs
    and outputs (IOBinding), where the installed onnxruntime has that provider."""
    import numpy as np
    import onnxruntime as ort
    import torch

    if provider not in ort.get_available_providers():
        return
    try:
        t0 = time.perf_counter()
        sess = ort.InferenceSession(proto.SerializeToString(), providers=[provider, "CPUExecutionProvider"])
        xs = {n: torch.from_numpy(np.ascontiguousarray(v)).cuda() for n, v in feeds.items()}
        binding = sess.io_binding()
        for n, x in xs.items():
            binding.bind_input(n, "cuda", 0, feeds[n].dtype, tuple(x.shape), x.data_ptr())
        for o in sess.get_outputs():
            binding.bind_output(o.name, "cuda")
        sess.run_with_iobinding(binding)
        row[f"{key}_s"] = round(time.perf_counter() - t0, 1)
        got = dict(zip([o.name for o in sess.get_outputs()], binding.copy_outputs_to_cpu()))
        from korch.profile.e2e import max_rel_error

        row[f"{key}_rel_err"] = max_rel_error({k: got[k] for k in want}, want)
        row[f"{key}_ms"] = time_fn(lambda: sess.run_with_iobinding(binding), True)
    except Exception as e:  # noqa: BLE001 - reported in the row
        row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"


def run_one(spec: str, args, emit=lambda row: None) -> dict:
    """One model's row; ``emit`` gets the row after each phase, so a model killed at its
    time limit still reports what it finished."""
    os.environ.setdefault("KORCH_CACHE_DIR", str(Path(args.work) / "cache"))
    import numpy as np
    import onnx
    import torch

    import korch
    from korch.executable.device import DeviceRunner
    from korch.kernels import device as D
    from korch.profile.e2e import max_rel_error, ort_session, random_feeds

    cuda = D.device_name() == "cuda"
    dev = "cuda" if cuda else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if cuda else "cpu (triton interpreter)"
    row: dict = {"model": spec, "device": name, "peak_gbps": peak_gbps(name) if cuda else None}
    row["copy_gbps"] = copy_gbps(cuda, 256 if cuda else 16)
    model, module = _model(spec, args.tiny, Path(args.work) / "suite")
    proto = onnx.load(model) if isinstance(model, str) else model
    t0 = time.perf_counter()
    cm = korch.optimize(
        model,
        kernel_memory_mb=16384.0,  # CUDA context + torch
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
    row["cuda_graph"] = cm.report.get("cuda_graph")  # the pipeline's choice (Note [CUDA graph choice])
    feeds = random_feeds(cm.executable.inputs, 1)
    sess = ort_session(proto, min(8, os.cpu_count() or 1))
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    got = cm(feeds)
    row["rel_err"] = max_rel_error({k: got[k] for k in want}, want)
    row["ok"] = bool(row["rel_err"] <= TOL)
    emit(row)

    # korch: the step loop, and the same plan replayed as one CUDA graph
    exe = cm.executable
    loop = DeviceRunner(exe, cuda_graph=False)
    dev_feeds = loop.inputs_to_device(feeds)
    row["korch_ms"] = time_fn(lambda: loop.run_device(dev_feeds), cuda)
    if cuda:
        graph_runner = DeviceRunner(exe, cuda_graph=True)
        if not graph_runner.use_graph:
            row["korch_graph_error"] = "a host kernel in the plan"
        try:
            out = graph_runner.run_device(dev_feeds)
            err = max_rel_error({k: D.to_host(v) for k, v in out.items() if k in want}, want)
            row["graph_rel_err"] = err
            row["korch_graph_ms"] = time_fn(lambda: graph_runner.run_device(dev_feeds), cuda) if err <= TOL else None
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["korch_graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    else:
        row["korch_graph_error"] = "skipped: no CUDA device (interpreter)"
    bw = kernel_bandwidth(exe, loop, dev_feeds, cuda)
    if bw:
        row["membound_kernels"] = len(bw)
        row["membound_gbps"] = sum(r["bytes"] for r in bw) / sum(r["us"] for r in bw) / 1e3
        row["membound_best_gbps"] = max(r["gbps"] for r in bw)
        row["membound_top"] = sorted(bw, key=lambda r: -r["bytes"])[:5]
    row["ort_cpu_ms"] = time_fn(lambda: sess.run(None, feeds), False, samples=3)
    emit(row)

    # peers: the torch module (suite) or the ONNX graph executed op by op with torch
    if module is None:
        peer = OnnxTorch(proto, dev)
        order = peer.inputs
    else:
        peer = module.to(dev).eval()
        order = list(exe.inputs)
    xs = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(dev) for n in order]
    with torch.no_grad():
        try:
            row["eager_rel_err"] = _peer_err(peer(*xs), want)
            row["eager_ms"] = time_fn(lambda: peer(*xs), cuda)
        except Exception as e:  # noqa: BLE001
            row["eager_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        emit(row)
        if cuda:
            _ort_device_peer(proto, feeds, want, "CUDAExecutionProvider", row, "ort_gpu")
            _ort_device_peer(proto, feeds, want, "TensorrtExecutionProvider", row, "trt")
            emit(row)
        modes = [("compile", "default"), ("autotune", "max-autotune")] if cuda and not args.no_compile else []
        if not cuda:  # inductor's CPU code says nothing about the GPU
            row["compile_error"] = row["autotune_error"] = "skipped: no CUDA device (interpreter)"
        for key, mode in modes:
            try:
                torch._dynamo.reset()
                t0 = time.perf_counter()
                fn = peer if isinstance(peer, torch.nn.Module) else peer.__call__
                compiled = torch.compile(fn, mode=mode)
                res = compiled(*xs)
                torch.cuda.synchronize()
                row[f"{key}_s"] = round(time.perf_counter() - t0, 1)
                row[f"{key}_rel_err"] = _peer_err(res, want)
                row[f"{key}_ms"] = time_fn(lambda compiled=compiled: compiled(*xs), cuda)
            except Exception as e:  # noqa: BLE001
                row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            emit(row)
    return row


# --- the driver ---------------------------------------------------------------------------------
def _fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}" if not math.isnan(x) else "nan"
    return str(x)


def _cell(r: dict, key: str) -> str:
    """``ms (error)`` for one engine, or why it has none."""
    ms, err = r.get(f"{key}_ms"), r.get(f"{key}_rel_err")
    if ms is None:
        reason = r.get(f"{key}_error")
        return "n/a" if reason is None else ("skipped" if str(reason).startswith("skipped") else "error")
    return f"{_fmt(ms)} ({err:.0e})" if isinstance(err, float) else _fmt(ms)


PEERS = [("eager", "torch eager"), ("compile", "torch.compile"), ("autotune", "max-autotune")]
PEERS += [("ort_gpu", "ort-gpu"), ("trt", "TensorRT")]


def table(rows: list[dict]) -> str:
    """One row per model: korch (step loop, CUDA graph), each peer as ``ms (rel err vs
    onnxruntime-CPU)``, korch's best time against each peer, and the generated
    memory-bound kernels' bandwidth (Note [Memory-bound bandwidth])."""
    head = ["model", "ok", "rel err", "kernels", "graph", "korch ms", "korch+graph ms"]
    head += [f"{label} ms (err)" for _, label in PEERS] + ["ort-cpu ms"]
    head += [f"vs {label}" for key, label in PEERS[:3]] + ["mem-bound GB/s", "% of peak"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        best = min([v for v in (r.get("korch_ms"), r.get("korch_graph_ms")) if v], default=None)
        kern = ",".join(f"{k}:{v}" for k, v in sorted((r.get("kernels") or {}).items()))
        ok = "yes" if r.get("ok") else ("ERROR" if r.get("error") else "NO")
        graph = str(r.get("cuda_graph") or "-").split(":")[0]
        peak = r.get("peak_gbps") or r.get("copy_gbps")
        gbps = r.get("membound_gbps")
        cells = [r["model"], ok, _fmt(r.get("rel_err"), 2), kern or "-", graph]
        cells += [_fmt(r.get("korch_ms")), _fmt(r.get("korch_graph_ms"))]
        cells += [_cell(r, key) for key, _ in PEERS] + [_fmt(r.get("ort_cpu_ms"))]
        for key, _ in PEERS[:3]:
            peer = r.get(f"{key}_ms")
            cells.append(f"{peer / best:.2f}x" if best and peer else "-")
        cells += [_fmt(gbps), f"{100 * gbps / peak:.1f}" if gbps and peak else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_table(rows: list[dict], path: Path) -> None:
    dev = next((r.get("device") for r in rows if r.get("device")), "?")
    peak = next((r.get("peak_gbps") for r in rows if r.get("peak_gbps")), None)
    copy = max((r.get("copy_gbps") or 0.0 for r in rows), default=0.0)
    header = (
        f"korch cuda target, {time.strftime('%Y-%m-%d')}, device: {dev}; peak memory bandwidth "
        f"{_fmt(peak) + ' GB/s' if peak else 'not in the table'}, a device copy reached {_fmt(copy)} GB/s "
        f"(% of peak against {'the peak' if peak else 'the copy'})\n"
        f"ms: medians per call with device-resident inputs; (err): max relative error against "
        f"onnxruntime-CPU, tolerance {TOL:g}; vs X: X's time over korch's best\n\n"
    )
    errors = []
    for r in rows:
        for key in ["error", "korch_graph_error"] + [f"{k}_error" for k, _ in PEERS]:
            if r.get(key):
                errors.append(f"- {r['model']} {key.removesuffix('_error') or 'run'}: {r[key]}")
    path.write_text(header + table(rows) + ("\n\nNotes and errors:\n" + "\n".join(errors) if errors else "") + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="zoo names, or suite NAME:BATCH (default: zoo, then suite)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/korch_gpu_check"))
    p.add_argument("--work", default="/tmp/korch_gpu_work")
    p.add_argument("--budget-s", type=float, default=480.0, help="stop starting models after this")
    p.add_argument("--per-model-s", type=float, default=150.0, help="a model past this reports what it finished")
    p.add_argument("--max-kernel-size", type=int, default=8)
    p.add_argument("--tiny", action="store_true", help="tiny zoo shapes (the interpreter dry run)")
    p.add_argument("--no-suite", action="store_true")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.one:
        emit = lambda row: print("ROW " + json.dumps(row, default=str), flush=True)  # noqa: E731
        partial: dict = {"model": args.one}
        try:
            row = run_one(args.one, args, lambda r: (partial.update(r), emit(r)))
        except Exception as e:  # noqa: BLE001 - the row says what broke
            traceback.print_exc()
            row = {**partial, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        emit(row)
        return 0

    models = args.models or [m for m in MODELS if not (args.no_suite and ":" in m)]
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
            found = [ln for ln in log.splitlines() if ln.startswith("ROW ")]
            row = json.loads(found[-1][4:]) if found else {"model": spec}  # what it finished
            row.setdefault("ok", False)
            row["error"] = f"timeout after {limit:.0f} s"
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
