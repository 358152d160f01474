"""The onnxruntime backend: runs any kernel graph (linear, opaque or memory-bound).

A kernel is exported with ``korch.kernels.ort.export``; its constant inputs (``in{i}_c``) are
baked in as initializers, so onnxruntime pre-packs weights and fuses epilogues
(Conv+Add+Relu, MatMul+Add into Gemm/FusedMatMul ...). That is how a linear candidate
carries its epilogue here. It is also the fallback that makes every primitive runnable.

Calls go through the C session's ``run`` (``InferenceSession._sess``), which skips the
Python wrapper's per-call validation (about 10 us less per call). Outputs are fresh
arrays on every call: a compiled kernel can be called at two places of one model, so
a pre-bound output buffer would be overwritten while the first result is still live.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.kernels.base import Backend, CompiledKernel, register

# the export's revision, part of every measurement's key for backends that run
# ``to_onnx``'s output: raising nearest-upsample Gathers to Resize and pooling windows
# to MaxPool (2), hard activations (3), Softmax, LayerNormalization and [N] biases (4),
# GlobalAveragePool (5), linear Resize (6) changed what a kernel runs
EXPORT_REVISION = 6


def make_session(model: bytes | str, num_threads: int, spin: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(num_threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    # Note [No spinning thread pools] in kernels/tvm/backend.py: a kernel among others never
    # spins (vit_tiny_b1's BLP plan, timed in blocks: 56 ms; 76 ms when every session
    # spins during its calls). A kernel that is the whole executable (the plan check's
    # one-region plans, OrtKernel.set_spin) spins like onnxruntime's default session,
    # also between calls (Note [An executable runs alone] in plans.py).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


class OrtKernel(CompiledKernel):
    backend = "ort"

    def __init__(
        self,
        session,
        feed_names: Sequence[str],
        feed_positions: Sequence[int],
        output_names: Sequence[str],
        model_bytes: bytes | None = None,
        spin: bool = False,
    ):
        self.session = session
        self.spin = spin
        self.feed_names = list(feed_names)
        self.feed_positions = list(feed_positions)
        self.output_names = list(output_names)
        self._model_bytes = model_bytes
        self._run = getattr(session, "_sess", session).run
        self._pairs = list(zip(self.feed_names, self.feed_positions))
        self._sessions: dict[int, Any] = {}  # by thread count (set_threads)
        self._threads = int(session.get_session_options().intra_op_num_threads)
        self._sessions[self._threads] = session

    def set_threads(self, num_threads: int) -> None:
        """A session's pool size is fixed at creation: keep one session per thread count."""
        n = max(1, int(num_threads))
        if n == self._threads or self._model_bytes is None:
            return
        if n not in self._sessions:
            self._sessions[n] = make_session(self._model_bytes, n, self.spin)
        self.session, self._threads = self._sessions[n], n
        self._run = getattr(self.session, "_sess", self.session).run

    def set_spin(self, spin: bool) -> None:
        """Whether the pool spins during a call: for a kernel that runs alone (see make_session)."""
        if spin == self.spin or self._model_bytes is None:
            return
        self.spin = spin
        self._sessions = {self._threads: make_session(self._model_bytes, self._threads, spin)}
        self.session = self._sessions[self._threads]
        self._run = getattr(self.session, "_sess", self.session).run

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feed = {name: inputs[pos] for name, pos in self._pairs}
        if self._run is self.session.run:  # pragma: no cover - older onnxruntime without ``_sess``
            return self._run(self.output_names, feed)
        return self._run(self.output_names, feed, None)

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fname = f"{stem}.onnx"
        (directory / fname).write_bytes(self._model_bytes if self._model_bytes is not None else b"")
        return {
            "backend": "ort",
            "file": fname,
            "feed_names": self.feed_names,
            "feed_positions": self.feed_positions,
            "output_names": self.output_names,
            "spin": self.spin,
        }


class OrtBackend(Backend):
    name = "ort"
    kinds = frozenset({"linear", "opaque", "memory", "region"})
    targets = frozenset({"cpu", "cuda"})  # on cuda: opaque primitives, on the host

    def supports(self, kgraph: Graph) -> bool:
        # to_onnx lowers every primitive; PAD needs opset >= 11, which opaque nodes could lower
        from korch.ir.ops import Op

        for node in kgraph.nodes:
            if node.op is Op.OPAQUE:
                for dom, ver in node.attr("opset") or ():
                    if dom in ("", "ai.onnx") and int(ver) < 11:
                        return False
        return True

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        from korch.kernels.ort.export import to_onnx

        # constant inputs without a value in ``consts`` stay graph inputs, fed at call time
        const_inputs = {name: consts[name] for name in kgraph.inputs if name in consts}
        model = to_onnx(kgraph, const_inputs=const_inputs).SerializeToString()
        session = make_session(model, num_threads)
        feed = [(name, pos) for pos, name in enumerate(kgraph.inputs) if name not in const_inputs]
        return OrtKernel(session, [n for n, _ in feed], [p for _, p in feed], list(kgraph.outputs), model)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        path = Path(directory) / meta["file"]
        model = path.read_bytes()
        spin = bool(meta.get("spin", False))
        session = make_session(model, num_threads, spin)
        return OrtKernel(session, meta["feed_names"], meta["feed_positions"], meta["output_names"], model, spin)

    def version(self) -> str:
        import onnxruntime as ort

        return f"onnxruntime-{ort.__version__}; export {EXPORT_REVISION}"


register(OrtBackend())
