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
"""

from __future__ import annotations

from collections.abc import Mapping
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

    def run_eager(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run every step on device tensors keyed by input name; outputs stay on the device."""
        env: dict[int, Any] = dict(self.consts)
        for name, spec in self.exe.inputs.items():
            env[spec.node] = feeds[name]
        for step, free in zip(self.exe.steps, self.exe.free_after):
            k = step.kernel
            args = [env[i] for i in step.inputs]
            if is_device_kernel(k):
                outs = k.run_device(args)
            else:
                outs = [D.to_device(o, self.device) for o in k([D.to_host(a) for a in args])]
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
