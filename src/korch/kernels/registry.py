"""Imports every backend module so each registers itself."""

import contextlib

with contextlib.suppress(ImportError):
    from korch.kernels.ort import backend  # noqa: F401
with contextlib.suppress(ImportError):
    from korch.kernels.library import numpy_blas  # noqa: F401
with contextlib.suppress(ImportError):
    from korch.kernels.tvm import backend  # noqa: F401
with contextlib.suppress(ImportError):
    from korch.kernels import chaos_backend  # noqa: F401  (registers only with KORCH_CHAOS=1)
with contextlib.suppress(ImportError):
    from korch.kernels.library import torch_cpu  # noqa: F401  (only when torch is installed)
with contextlib.suppress(ImportError):
    from korch.kernels.library import torch_cuda  # noqa: F401  (cuda target; only when torch is installed)
with contextlib.suppress(ImportError):
    from korch.kernels.triton import backend  # noqa: F401  (cuda target; only when triton is installed)
