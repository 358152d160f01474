"""A kernel of korch's runtime called from Python: its handle (``korch_linear_create``
over an int64 code), its thread count and the pool hold it is measured under. The
native linear kernels (``linear.py``) and TopK (``topk.py``) are two."""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from korch.kernels.base import CompiledKernel


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
