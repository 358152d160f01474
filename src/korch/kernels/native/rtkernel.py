"""A kernel of korch's runtime called from Python: its handle (``korch_linear_create``
over an int64 code), its thread count and the pool hold it is measured under. The
native linear kernels (``linear.py``) and TopK (``topk.py``) are two; ``SpecKernel``
the one-output ones a dataclass describes (``pool.py``, ``softmax.py``, ``norm.py``,
``transpose.py``)."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from korch.ir.graph import Graph
from korch.kernels.base import CompiledKernel, buffer_address


class RuntimeKernel(CompiledKernel):
    backend = "native"

    def _create(self, code: np.ndarray) -> None:
        from korch.kernels.native.toolchain import runtime

        self.code = code
        self._lib = runtime()
        handle = self._lib.korch_linear_create(code.ctypes.data, len(code))
        if not handle:
            raise RuntimeError(self._lib.korch_last_error().decode())
        self._handle = ctypes.c_void_p(handle)

    @property
    def post_steps(self) -> int:
        """How many of the epilogue's steps the kernel applies in registers, on the
        paths that can (Note [Register post-ops] in korch_gemm.h)."""
        return int(self._lib.korch_linear_post_steps(self._handle))

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None and h.value:
            self._lib.korch_linear_free(h)

    @contextlib.contextmanager
    def timed(self):
        # Note [One pool, awake for a segment] in korch_rt.cc: in place, the kernel runs in
        # a segment that holds the pool, its workers spinning; measured alone without the
        # hold, each call would find them asleep and run mostly on one thread
        self._lib.korch_pool_hold(1)
        try:
            yield
        finally:
            self._lib.korch_pool_hold(0)

    def set_threads(self, num_threads: int) -> None:
        self._lib.korch_set_threads(int(num_threads))

    def _run(self, what: str) -> None:
        if self._lib.korch_linear_run(self._handle, self._ptrs) != 0:
            raise RuntimeError(f"native {what} failed: {self._lib.korch_last_error().decode()}")


class SpecKernel(RuntimeKernel):
    """A runtime kernel with one float32 output over its input at ``spec.x_pos``,
    described by a dataclass ``spec``: a subclass names its ``op`` (the saved meta's and
    the error's), its ``spec_type`` and its ``encoder`` (spec, number of inputs -> the
    runtime's code); the output's shape is ``spec.shape`` unless it says otherwise."""

    op: ClassVar[str] = ""
    spec_type: ClassVar[type]
    encoder: ClassVar[Callable[[Any, int], np.ndarray]]

    def __init__(self, spec: Any, input_shapes: Sequence[tuple[int, ...]], input_dtypes: Sequence[str]):
        self.spec = spec
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        self.input_dtypes = [str(d) for d in input_dtypes]
        self._create(self.encode(len(self.input_shapes)))
        self._ptrs = (ctypes.c_void_p * (len(self.input_shapes) + 1))()

    def encode(self, n_inputs: int) -> np.ndarray:
        return type(self).encoder(self.spec, n_inputs)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.spec.shape

    def arg_specs(self) -> tuple[list[tuple[tuple[int, ...], str]], list[tuple[tuple[int, ...], str]]]:
        """(shape, dtype) of each input and output, as a segment lays them out."""
        return list(zip(self.input_shapes, self.input_dtypes)), [(self.out_shape, "float32")]

    def input_positions(self) -> tuple[int, ...]:
        """The inputs the runtime reads: ``spec.x_pos``, and more where a spec says so."""
        return (self.spec.x_pos,)

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        keep = []  # alive through the call
        for pos in self.input_positions():
            keep.append(np.ascontiguousarray(inputs[pos], dtype=np.float32))
            self._ptrs[pos] = buffer_address(keep[-1])
        out = np.empty(self.out_shape, dtype=np.float32)
        self._ptrs[len(self.input_shapes)] = buffer_address(out)
        self._run(self.op)
        return [out]

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "op": self.op,
            "spec": asdict(self.spec),
            "input_shapes": [list(x) for x in self.input_shapes],
            "input_dtypes": self.input_dtypes,
        }

    @classmethod
    def of(cls, kgraph: Graph, spec: Any) -> SpecKernel:
        """The kernel for ``spec``, with ``kgraph``'s input shapes and dtypes."""
        shapes = [tuple(kgraph.nodes[nid].shape) for nid in kgraph.inputs.values()]
        dtypes = [kgraph.nodes[nid].dtype for nid in kgraph.inputs.values()]
        return cls(spec, shapes, dtypes)

    @classmethod
    def load(cls, meta: dict[str, Any]) -> SpecKernel:
        spec = cls.spec_type(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta["spec"].items()})
        return cls(spec, [tuple(x) for x in meta["input_shapes"]], meta["input_dtypes"])
