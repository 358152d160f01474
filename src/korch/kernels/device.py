"""Device helpers for the ``cuda`` target's backends (triton, torch_cuda).

Note [Device kernels]
~~~~~~~~~~~~~~~~~~~~~
A backend for the ``cuda`` target returns compiled kernels with ``device_kernel =
True``. Besides the numpy interface every kernel has (``__call__``: numpy in, numpy
out, for checks and for hosts), they run on torch tensors already on the device
(``run_device``), which is what the executable and the profiler use so that tensors
stay on the GPU between kernels. Without a GPU, the same code runs on CPU torch
tensors: Triton kernels through Triton's interpreter (``TRITON_INTERPRET=1``, which
must be set before triton is imported), torch kernels on the CPU. That is how CI
checks the cuda target's kernels.

torch is imported lazily: ``import korch`` never imports it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence

import numpy as np


def interpret() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def torch():
    import torch as _torch

    return _torch


def has_cuda() -> bool:
    try:
        return bool(torch().cuda.is_available())
    except ImportError:
        return False


def cuda_target_problem() -> str | None:
    """Why the ``cuda`` target cannot run here (one line for the CLI), or None.

    It runs where torch and triton are importable and either torch sees a CUDA device
    or Triton interprets on the CPU (``TRITON_INTERPRET=1``, Note [Device kernels])."""
    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return f"--target cuda needs {' and '.join(missing)}, not installed here (pip install 'korch[gpu]')"
    if interpret() or has_cuda():
        return None
    return (
        "--target cuda: torch sees no CUDA device here; use --target cpu, or set "
        "TRITON_INTERPRET=1 to run the cuda target's kernels on the CPU under Triton's interpreter"
    )


def device_name() -> str:
    """``cuda`` when a GPU is visible (and Triton is not interpreting), else ``cpu``."""
    return "cuda" if has_cuda() and not interpret() else "cpu"


def torch_dtype(dtype: str):
    t = torch()
    return {
        "float32": t.float32,
        "float16": t.float16,
        "float64": t.float64,
        "int64": t.int64,
        "int32": t.int32,
        "int8": t.int8,
        "uint8": t.uint8,
        "bool": t.bool,
    }[dtype]


def to_device(a, device: str, dtype: str | None = None):
    """A contiguous torch tensor on ``device`` holding ``a`` (numpy array or tensor)."""
    t = torch()
    if isinstance(a, t.Tensor):
        x = a
    else:
        arr = np.asarray(a)
        if dtype is not None and str(arr.dtype) != dtype:
            arr = arr.astype(dtype)
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = np.array(arr, order="C")
        x = t.from_numpy(arr)
    if str(x.device) != device and not (device == "cuda" and x.is_cuda):
        x = x.to(device)
    return x.contiguous()


def to_host(x) -> np.ndarray:
    return x.detach().cpu().numpy()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch().cuda.synchronize()


def run_numpy(kernel, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The numpy interface of a device kernel: copy in, run, copy out."""
    xs = [to_device(x, kernel.device, spec[1]) for x, spec in zip(inputs, kernel.input_specs)]
    outs = kernel.run_device(xs)
    return [to_host(o) for o in outs]
