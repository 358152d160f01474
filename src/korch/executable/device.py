"""Running an executable whose kernels are device kernels (the ``cuda`` target).

Note [Device executable]
~~~~~~~~~~~~~~~~~~~~~~~~
Tensors stay on the device between kernels: the environment maps node ids to torch
tensors, constants are moved to the device once (on first use), inputs are copied
in once per call and outputs copied out once. A step whose kernel is a host kernel
(onnxruntime, for opaque primitives) gets its inputs copied to the host and its
outputs copied back. With ``cuda_graph`` (Settings.cuda_graph) and every kernel on a
CUDA device, the whole sequence is captured once into a CUDA graph over static input
buffers and replayed; its outputs are the graph's static buffers, so ``run_device``
callers must read them before the next call (``__call__`` copies them to the host).
Without a GPU the same code runs on CPU torch tensors (Triton's interpreter).

Note [CUDA graph choice]
~~~~~~~~~~~~~~~~~~~~~~~~
On a GPU the cost fusion saves is mostly per launch (a few microseconds of host work
and launch latency per kernel), and a CUDA graph removes most of what is left: the
replay launches the whole plan at once. So ``Settings.cuda_graph`` is on by default,
and after build (pipeline step ``cuda_graph``) the replay is measured against the
step loop on the same device inputs (CUDA events, rounds alternating the two); the
graph is kept unless it is slower or its outputs differ from the loop's. It applies
only where every kernel is a device kernel on a CUDA device: a host kernel
(onnxruntime, for opaque primitives) cannot be captured, and under Triton's
interpreter there is no device (the choice is skipped and the report says so).
``--no-cuda-graph`` turns it off.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from korch.kernels import device as D


def is_device_kernel(kernel: Any) -> bool:
    return bool(getattr(kernel, "device_kernel", False))


class DeviceRunner:
    def __init__(self, exe, cuda_graph: bool = False):
        self.exe = exe
        devices = {k.device for k in (s.kernel for s in exe.steps) if is_device_kernel(k)}
        self.device = "cuda" if any(d.startswith("cuda") for d in devices) else (devices.pop() if devices else "cpu")
        self.all_device = all(is_device_kernel(s.kernel) for s in exe.steps)
        self.use_graph = cuda_graph and self.device == "cuda" and self.all_device
        self._consts: dict[int, Any] | None = None
        self._graph = None
        self._static_in: dict[str, Any] = {}
        self._static_out: dict[str, Any] = {}

    @property
    def consts(self) -> dict[int, Any]:
        if self._consts is None:
            self._consts = {nid: D.to_device(v, self.device) for nid, v in self.exe.consts.items()}
        return self._consts

    def inputs_to_device(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        env = self.exe.check_inputs(feeds)
        return {name: D.to_device(env[spec.node], self.device) for name, spec in self.exe.inputs.items()}

    def run_step(self, step, args: list) -> list:
        """One step on device tensors: a device kernel in place, a host kernel through copies."""
        k = step.kernel
        if is_device_kernel(k):
            return k.run_device(args)
        return [D.to_device(o, self.device) for o in k([D.to_host(a) for a in args])]

    def run_eager(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run every step on device tensors keyed by input name; outputs stay on the device."""
        env: dict[int, Any] = dict(self.consts)
        for name, spec in self.exe.inputs.items():
            env[spec.node] = feeds[name]
        for step, free in zip(self.exe.steps, self.exe.free_after):
            outs = self.run_step(step, [env[i] for i in step.inputs])
            for nid, val in zip(step.outputs, outs):
                env[nid] = val
            for nid in free:
                env.pop(nid, None)
        return {name: env[spec.node] for name, spec in self.exe.outputs.items()}

    def run_device(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        if not self.use_graph:
            return self.run_eager(feeds)
        torch = D.torch()
        if self._graph is None:
            self._static_in = {k: v.clone() for k, v in feeds.items()}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # compile and autotune outside the capture
                    self.run_eager(self._static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._static_out = self.run_eager(self._static_in)
            self._graph = graph
        for k, v in feeds.items():
            if v is not self._static_in[k]:
                self._static_in[k].copy_(v)
        self._graph.replay()
        return self._static_out

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.run_device(self.inputs_to_device(feeds))
        return {k: D.to_host(v).copy() if self.use_graph else D.to_host(v) for k, v in out.items()}


def time_device_ms(fns: dict[str, Callable[[], Any]], rounds: int = 7, min_ms: float = 5.0) -> dict[str, float]:
    """Median milliseconds per call of each function, alternated round by round; each
    round's block lasts about ``min_ms``. CUDA events, launches queued back to back."""
    torch = D.torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    inner: dict[str, int] = {}
    for name, fn in fns.items():
        for _ in range(2):
            fn()
        start.record()
        fn()
        end.record()
        end.synchronize()
        inner[name] = max(1, min(1000, int(min_ms / max(start.elapsed_time(end), 1e-3))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start.record()
            for _ in range(inner[name]):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / inner[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max|want| (korch.profile.e2e.max_rel_error's measure, one output)."""
    if got.shape != want.shape:
        return float("inf")
    g, w = np.nan_to_num(got.astype(np.float64)), np.nan_to_num(want.astype(np.float64))
    return float(np.max(np.abs(g - w), initial=0.0) / (np.max(np.abs(w), initial=0.0) or 1.0))


GRAPH_TOLERANCE = 1e-5  # replay against the step loop: the same kernels, so the same numbers


def choose_cuda_graph(exe, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Note [CUDA graph choice]: keep ``exe.cuda_graph`` only where the replay is at least
    as fast as the step loop; returns what the report records. Precondition: ``exe`` was
    built for the cuda target (device kernels)."""
    if not exe.cuda_graph:
        return {"cuda_graph": "off"}
    loop = DeviceRunner(exe, cuda_graph=False)
    if loop.device != "cuda":
        return {"cuda_graph": "skipped: no CUDA device (Triton interpreter)"}
    if not loop.all_device:
        exe.cuda_graph = False
        exe._device_runner = None
        return {"cuda_graph": "off: a host kernel in the plan cannot be captured"}
    graph = DeviceRunner(exe, cuda_graph=True)
    xs = loop.inputs_to_device(feeds)
    try:
        want = {k: D.to_host(v) for k, v in loop.run_device(xs).items()}
        got = {k: D.to_host(v) for k, v in graph.run_device(xs).items()}
    except Exception as e:  # noqa: BLE001 - a capture that fails leaves the step loop
        exe.cuda_graph = False
        exe._device_runner = None
        return {"cuda_graph": f"off: capture failed ({type(e).__name__}: {str(e)[:120]})"}
    err = max((_rel_err(got[k], w) for k, w in want.items()), default=0.0)
    ms = time_device_ms({"graph": lambda: graph.run_device(xs), "loop": lambda: loop.run_device(xs)})
    keep = err <= GRAPH_TOLERANCE and ms["graph"] <= ms["loop"]
    exe.cuda_graph = keep
    exe._device_runner = graph if keep else None
    info = {"cuda_graph": "on" if keep else "off: the step loop was faster or differed"}
    return {**info, "cuda_graph_ms": round(ms["graph"], 4), "step_loop_ms": round(ms["loop"], 4), "graph_rel_err": err}
