"""The numpy backend: a MATMUL with an elementwise epilogue (``korch.kernels.epilogue``),
run by np.matmul (OpenBLAS)."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph
from korch.ir.ops import Op
from korch.kernels.base import Backend, CompiledKernel, register
from korch.kernels.epilogue import (
    LinearPlan,
    Operand,
    load_consts,
    match_linear,
    save_consts,
)

_UFUNC = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.MAX: np.maximum,
    Op.MIN: np.minimum,
}


def _blas_set_threads():
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*"))
    libs += glob.glob(os.path.join(os.path.dirname(np.__file__), ".libs", "libscipy_openblas*"))
    for path in libs:
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(path)
            for sym in (
                "scipy_openblas_set_num_threads64_",
                "scipy_openblas_set_num_threads",
                "openblas_set_num_threads",
            ):
                if hasattr(lib, sym):
                    return getattr(lib, sym)
    return None


_BLAS_SET = _blas_set_threads()
_blas_threads: list[int] = [0]


def set_blas_threads(n: int) -> None:
    """OpenBLAS's thread count (process-wide; a no-op when the symbol is not found)."""
    if _BLAS_SET is not None and _blas_threads[0] != n:
        _BLAS_SET(int(n))
        _blas_threads[0] = n


def _apply_unary(op: Op, out: np.ndarray) -> None:
    if op is Op.NEG:
        np.negative(out, out=out)
    elif op is Op.EXP:
        np.exp(out, out=out)
    elif op is Op.TANH:
        np.tanh(out, out=out)
    elif op is Op.ABS:
        np.abs(out, out=out)
    elif op is Op.SIGMOID:
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.add(out, 1.0, out=out)
        np.reciprocal(out, out=out)
    else:  # pragma: no cover
        raise NotImplementedError(op)


def _const_operand(opd: Operand, consts: dict[str, np.ndarray], dtype: str):
    """A constant or scalar operand, ready for the ufunc; None when fed at call time."""
    if opd.scalar is not None:
        return np.asarray(opd.scalar, dtype=dtype)[()]
    if opd.name in consts:
        return np.require(opd.view(np.asarray(consts[opd.name], dtype=dtype)), requirements="C")
    return None


class NumpyKernel(CompiledKernel):
    backend = "numpy"

    def __init__(self, plan: LinearPlan, consts: dict[str, np.ndarray], num_threads: int):
        self.plan = plan
        self.num_threads = num_threads
        self.consts = {k: np.asarray(v, dtype=plan.dtype) for k, v in consts.items() if k in plan.input_names}
        dtype = plan.dtype
        self._b = None
        bname = plan.input_names[plan.b]
        if bname in self.consts:
            self._b = np.require(self.consts[bname], requirements="C")
        # one GEMM for A[..., M, K] @ B[K, N]
        self._flatten = len(plan.b_shape) == 2 and len(plan.a_shape) > 2
        k, n = plan.b_shape[-2:]
        self._a2 = (-1, k)
        self._o2 = (-1, n)
        self._steps = [
            (
                s.op,
                s.operand,
                s.value_left,
                None if s.operand is None else _const_operand(s.operand, self.consts, dtype),
            )
            for s in plan.epilogue
        ]
        set_blas_threads(num_threads)

    def set_threads(self, num_threads: int) -> None:
        self.num_threads = max(1, int(num_threads))

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        plan = self.plan
        if _blas_threads[0] != self.num_threads:
            set_blas_threads(self.num_threads)
        a = inputs[plan.a]
        b = self._b if self._b is not None else inputs[plan.b]
        out = np.empty(plan.shape, dtype=plan.dtype)
        if self._flatten:
            np.matmul(a.reshape(self._a2), b, out=out.reshape(self._o2))
        else:
            np.matmul(a, b, out=out)
        for op, opd, left, value in self._steps:
            if opd is None:
                _apply_unary(op, out)
                continue
            if value is None:
                value = opd.view(inputs[opd.pos])
            if left:
                _UFUNC[op](out, value, out=out)
            else:
                _UFUNC[op](value, out, out=out)
        return [out]

    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        return save_consts(self.backend, self.plan, self.consts, Path(directory), stem)


class NumpyBackend(Backend):
    name = "numpy"
    kinds = frozenset({"linear"})

    def supports(self, kgraph: Graph) -> bool:
        return match_linear(kgraph, frozenset({Op.MATMUL})) is not None

    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        plan = match_linear(kgraph, frozenset({Op.MATMUL}))
        if plan is None:
            raise ValueError("numpy backend: not a MATMUL with an elementwise epilogue")
        return NumpyKernel(plan, consts, num_threads)

    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel:
        plan, consts = load_consts(meta, directory)
        return NumpyKernel(plan, consts, num_threads)

    def version(self) -> str:
        return f"numpy-{np.__version__}"


register(NumpyBackend())
