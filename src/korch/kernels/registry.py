"""Imports every backend module so each registers itself."""

import contextlib

with contextlib.suppress(ImportError):
    from korch.kernels import ort_backend  # noqa: F401
with contextlib.suppress(ImportError):
    from korch.kernels import numpy_backend  # noqa: F401
with contextlib.suppress(ImportError):
    from korch.kernels import tvm_backend  # noqa: F401
with contextlib.suppress(ImportError):
    from korch.kernels import chaos_backend  # noqa: F401  (registers only with KORCH_CHAOS=1)
with contextlib.suppress(ImportError):
    from korch.kernels import torch_backend  # noqa: F401  (only when torch is installed)
with contextlib.suppress(ImportError):
    from korch.kernels import torch_cuda_backend  # noqa: F401  (cuda target; only when torch is installed)
with contextlib.suppress(ImportError):
    from korch.kernels import triton_backend  # noqa: F401  (cuda target; only when triton is installed)
