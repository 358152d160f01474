"""The torch_topk backend (``cuda`` target): an opaque sorted TopK with a constant K on
the device, through torch.

Note [Device TopK]
~~~~~~~~~~~~~~~~~~
On the cuda target an opaque operator ran in onnxruntime on the host: two copies
between device and host a call, and no CUDA graph for the plan ("a host kernel in the
plan"). On the H200 the opaque test model lost to torch eager for that alone (0.424 ms
against 0.243; benchmarks/RESULTS.md, cuda target). The TopK that korch's CPU runtime
takes (``korch.kernels.native.topk.topk_spec``: default domain, sorted, float32 input,
K constant) runs here as a *stable* descending (or ascending) sort along the axis and
its first K entries: equal values then come lower index first, as in onnxruntime and
the native kernel, where ``torch.topk`` on a GPU promises no order among ties.

Device kernels (Note [Device kernels]): without a GPU they run on CPU torch tensors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.kernels import device as D
from korch.kernels.base import Backend, CompiledKernel, register
from korch.kernels.native.topk import TopKSpec, constant_k, topk_spec

if importlib.util.find_spec("torch") is None:
    raise ImportError("torch is not installed")


class TorchTopKKernel(CompiledKernel):
    backend = "torch_topk"
    device_kernel = True

    def __init__(self, spec: TopKSpec, k: int, input_specs: Sequence[tuple[tuple[int, ...], str]]):
        self.spec, self.k = spec, int(k)
        self.input_specs = [(tuple(int(d) for d in s), str(t)) for s, t in input_specs]
        self.device = D.device_name()
        n = self.input_specs[spec.x_pos][0][spec.axis]
        if not 1 <= self.k <= n:
            raise ValueError(f"TopK: k = {self.k} outside 1..{n}")
        self.torch = D.torch()

    def run_device(self, xs: Sequence[Any]) -> list[Any]:
        s = self.spec
        values, indices = self.torch.sort(xs[s.x_pos], dim=s.axis, descending=s.largest, stable=True)
        picked = {0: values.narrow(s.axis, 0, self.k), 1: indices.narrow(s.axis, 0, self.k)}
        return [picked[w].contiguous() for w in s.which]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return D.run_numpy(self, inputs)

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        s = self.spec
        return {
            "backend": self.backend,
            "x_pos": s.x_pos,
            "axis": s.axis,
            "largest": s.largest,
            "which": s.which,
            "k": self.k,
            "input_specs": [[list(shape), dt] for shape, dt in self.input_specs],
        }


class TorchTopKBackend(Backend):
    name = "torch_topk"
    kinds = frozenset({"opaque"})
    targets = frozenset({"cuda"})

    def supports(self, kgraph: Graph) -> bool:
        return topk_spec(kgraph) is not None

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        spec = topk_spec(kgraph)
        if spec is None:
            raise ValueError("torch_topk backend: not a sorted TopK with a constant K")
        k = constant_k(kgraph, spec, consts)
        specs = [(tuple(kgraph.nodes[nid].shape), kgraph.nodes[nid].dtype) for nid in kgraph.inputs.values()]
        return TorchTopKKernel(spec, k, specs)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        spec = TopKSpec(meta["x_pos"], None, meta["k"], meta["axis"], meta["largest"], meta["which"])
        return TorchTopKKernel(spec, meta["k"], [(tuple(s), t) for s, t in meta["input_specs"]])

    def version(self) -> str:
        return f"torch-{D.torch().__version__}-{D.device_name()}; stable sort"


register(TorchTopKBackend())
