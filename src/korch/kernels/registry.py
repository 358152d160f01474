"""Every backend, by name: the modules below register themselves on import, in this
order (the order of a candidate's ``backends``).

Backends whose tool is missing (torch, triton) fail to import and are left out.
``KORCH_BACKENDS``: more backend modules to import (comma-separated module names), for
backends that live outside korch; spawned measurement workers read it too.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from korch.errors import KorchError
from korch.kernels.base import _REGISTRY, Backend

BACKEND_MODULES = (
    "korch.kernels.ort.backend",
    "korch.kernels.openvino.backend",  # only where openvino is installed; regions only
    "korch.kernels.library.numpy_blas",
    "korch.kernels.native.linear",  # needs a C++ compiler and scipy-openblas32 at build
    "korch.kernels.native.segment",  # loads saved native segments (never a candidate)
    "korch.kernels.library.torch_cpu",  # only where torch is installed
    "korch.kernels.tvm.backend",
    "korch.kernels.library.torch_cuda",  # cuda target; only where torch is installed
    "korch.kernels.library.torch_topk",  # cuda target: an opaque TopK on the device
    "korch.kernels.triton.backend",  # cuda target; only where triton is installed
)

# the backends whose kernels korch generates (the others are libraries)
GENERATORS = frozenset({"tvm", "triton"})

_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for mod in BACKEND_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(mod)
    for mod in filter(None, (m.strip() for m in os.environ.get("KORCH_BACKENDS", "").split(","))):
        importlib.import_module(mod)  # a plugin the user named: its ImportError is theirs to see
    _loaded = True


def get_backend(name: str) -> Backend:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KorchError(f"unknown kernel backend {name!r}; available here: {sorted(_REGISTRY)}") from None


def all_backends() -> list[Backend]:
    _load()
    return list(_REGISTRY.values())
