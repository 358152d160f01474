"""The backend interface every kernel generator and library backend implements.

A backend turns a candidate kernel, in its canonical standalone form
(``korch.ir.subgraph.extract``: inputs ``in{i}`` or ``in{i}_c`` for constants,
outputs ``out{j}``), into a ``CompiledKernel``: a callable taking the kernel's inputs
as numpy arrays in order (constant inputs included; a backend may ignore those it
baked in at build time) and returning its outputs as a list of numpy arrays.
A compiled kernel saves itself into an executable's folder and loads back.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from korch.ir.graph import Graph

ALIGN = 64  # bytes: what generated kernels assume of every buffer (Note [TVM buffer alignment])


def buffer_address(a: np.ndarray) -> int:
    """Data address of a C-contiguous array: 0.8 us for a writable one, against 2-3 us
    for ``a.ctypes.data`` or ``a.__array_interface__`` (measured here, numpy 2.4), which
    a read-only one takes."""
    if not a.nbytes:
        return 0
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):  # read-only
        return a.ctypes.data


def aligned_empty(shape: Sequence[int], dtype: str | np.dtype, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data is ``align``-byte aligned."""
    # math.prod and one ndarray over the buffer: 3 us, against 10 us with np.prod,
    # ``.ctypes.data`` and view+reshape (measured here, numpy 2.4)
    dt = np.dtype(dtype)
    shape = tuple(shape)
    nbytes = math.prod(shape) * dt.itemsize
    buf = np.empty(max(1, nbytes) + align, dtype=np.uint8)
    off = (-ctypes.addressof(ctypes.c_char.from_buffer(buf))) % align
    return np.ndarray(shape, dt, buf, off)


def aligned_copy(a: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """A writable, C-contiguous, ``align``-byte-aligned copy of ``a``."""
    a = np.asarray(a)
    out = aligned_empty(a.shape, a.dtype, align)
    out[...] = a
    return out


class CompiledKernel(abc.ABC):
    backend: str = ""

    @abc.abstractmethod
    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]: ...

    @abc.abstractmethod
    def save(self, directory: Path, stem: str) -> dict[str, Any]:
        """Write files named ``stem*`` under ``directory``; return JSON-able metadata."""

    def set_threads(self, num_threads: int) -> None:  # noqa: B027 - optional hook
        """Run with ``num_threads`` threads from now on (Note [Runtime threads])."""

    def timed(self) -> contextlib.AbstractContextManager:
        """The state the kernel is measured in: the one it runs in in place (a native
        kernel holds korch's pool, as the segment it will run in does)."""
        return contextlib.nullcontext()


class Backend(abc.ABC):
    name: str = ""
    # the kernel classes (korch.ir.subgraph.kernel_class) this backend takes
    kinds: frozenset[str] = frozenset()
    # the Settings.target values this backend serves (Note [Device kernels] in device.py)
    targets: frozenset[str] = frozenset({"cpu"})

    @abc.abstractmethod
    def supports(self, kgraph: Graph) -> bool:
        """Whether ``build`` can compile this kernel (pure, cheap, no compilation)."""

    @abc.abstractmethod
    def build(self, kgraph: Graph, consts: dict[str, np.ndarray], num_threads: int) -> CompiledKernel:
        """Compile. ``consts`` maps each ``in{i}_c`` input name to its value."""

    def build_many(
        self, items: Sequence[tuple[Graph, dict[str, np.ndarray]]], num_threads: int, tile_configs=None
    ) -> list[CompiledKernel | Exception]:
        # tile_configs: a generator's (TVM's); a kernel of a workload TVM also takes (a
        # pooling the native backend runs, say) comes with one, which a library ignores
        out: list[CompiledKernel | Exception] = []
        for kgraph, consts in items:
            try:
                out.append(self.build(kgraph, consts, num_threads))
            except Exception as e:  # noqa: BLE001 - a failed build is a recorded result
                out.append(e)
        return out

    @abc.abstractmethod
    def load(self, meta: dict[str, Any], directory: Path, num_threads: int) -> CompiledKernel: ...

    def version(self) -> str:
        """Tool version string; part of every measurement's key."""
        return "0"


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    _REGISTRY[backend.name] = backend
    return backend
