"""The OpenVINO backend: a kernel graph exported to ONNX (as for onnxruntime,
``korch.kernels.ort.export``) and compiled by OpenVINO's CPU plugin, always at fp32.

Note [OpenVINO as a library]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Korch ran TensorRT-built kernels beside its own; on a CPU, OpenVINO plays that part
beside onnxruntime: on the suite it ran 1.21x onnxruntime at fp32 (benchmarks/RESULTS.md),
so a whole graph it compiles is one more plan the end-to-end check races (Note [End-to-end
plan check] in korch/selection.py), kept only when it beats onnxruntime's by every
measure. Two facts shape it:
- On CPUs with AMX or AVX-512 bf16 the plugin infers in bf16 unless
  ``INFERENCE_PRECISION_HINT`` is f32, a different accuracy from every other backend;
  the hint is set and read back, and a kernel that did not compile at f32 is refused.
- A call costs far more than onnxruntime's: 93-101 us for a two-op graph through
  bound tensors, 240-250 us through ``infer(list)``, against onnxruntime's 20-30 us on
  the same VM (Dec 4 2026, a slow VM; the dispatch table in RESULTS had OpenVINO at
  18-28 us and onnxruntime at 4-7 us on a faster one). So it takes region kernels only
  (the whole graph, or a library region): a linear kernel alone would pay that call
  every time, and its TBB pool is one more pool beside korch's (Note [One thread pool]).
Inputs are bound as tensors over the caller's arrays (no copy); outputs are copied out
of the request, which overwrites them on the next call.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov  # an ImportError here leaves the backend out (korch.kernels.registry)

from korch.ir.graph import Graph
from korch.kernels.base import Backend, CompiledKernel, register

PRECISION = "f32"


def compile_model(model: bytes, num_threads: int):
    """``model`` (ONNX bytes) compiled for the CPU plugin at fp32 with ``num_threads``
    threads and the latency hint (one stream), as the OpenVINO peer runs."""
    core = ov.Core()
    config = {
        "INFERENCE_PRECISION_HINT": PRECISION,
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": max(1, int(num_threads)),
    }
    compiled = core.compile_model(core.read_model(io.BytesIO(model)), "CPU", config)
    got = compiled.get_property("INFERENCE_PRECISION_HINT")
    if got != ov.Type.f32:
        raise RuntimeError(f"OpenVINO compiled at {got}, not f32 (Note [OpenVINO as a library])")
    return compiled


class OvKernel(CompiledKernel):
    backend = "openvino"

    def __init__(
        self,
        model: bytes,
        feed_names: Sequence[str],
        feed_positions: Sequence[int],
        output_names: Sequence[str],
        num_threads: int,
    ):
        self.model = model
        self.feed_names = list(feed_names)
        self.feed_positions = list(feed_positions)
        self.output_names = list(output_names)
        self._compiled: dict[int, tuple[Any, Any]] = {}
        self.set_threads(num_threads)

    def set_threads(self, num_threads: int) -> None:
        n = max(1, int(num_threads))
        if n not in self._compiled:
            compiled = compile_model(self.model, n)
            request = compiled.create_infer_request()
            self._compiled[n] = (compiled, request)
        compiled, self.request = self._compiled[n]
        ins = {p.get_any_name(): i for i, p in enumerate(compiled.inputs)}
        outs = {p.get_any_name(): i for i, p in enumerate(compiled.outputs)}
        self._in = [(ins[name], pos) for name, pos in zip(self.feed_names, self.feed_positions)]
        self._out = [outs[name] for name in self.output_names]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        r = self.request
        for port, pos in self._in:
            r.set_input_tensor(port, ov.Tensor(np.ascontiguousarray(inputs[pos]), shared_memory=True))
        r.infer()
        return [np.array(r.get_output_tensor(i).data) for i in self._out]

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fname = f"{stem}.onnx"
        (directory / fname).write_bytes(self.model)
        return {
            "backend": "openvino",
            "file": fname,
            "feed_names": self.feed_names,
            "feed_positions": self.feed_positions,
            "output_names": self.output_names,
        }


class OpenVinoBackend(Backend):
    name = "openvino"
    kinds = frozenset({"region"})  # Note [OpenVINO as a library]
    targets = frozenset({"cpu"})

    def supports(self, kgraph: Graph) -> bool:
        from korch.ir.ops import Op

        # an opaque node keeps its own domain and opset; OpenVINO's ONNX frontend reads
        # the default domain only
        return all(
            dom in ("", "ai.onnx") for n in kgraph.nodes if n.op is Op.OPAQUE for dom, _ in n.attr("opset") or ()
        )

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        from korch.kernels.ort.export import to_onnx

        const_inputs = {name: consts[name] for name in kgraph.inputs if name in consts}
        model = to_onnx(kgraph, const_inputs=const_inputs).SerializeToString()
        feed = [(name, pos) for pos, name in enumerate(kgraph.inputs) if name not in const_inputs]
        return OvKernel(model, [n for n, _ in feed], [p for _, p in feed], list(kgraph.outputs), num_threads)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        model = (Path(directory) / meta["file"]).read_bytes()
        return OvKernel(model, meta["feed_names"], meta["feed_positions"], meta["output_names"], num_threads)

    def version(self) -> str:
        from korch.kernels.ort.backend import EXPORT_REVISION

        return f"openvino-{ov.__version__.split('-')[0]} {PRECISION}; export {EXPORT_REVISION}"


register(OpenVinoBackend())
