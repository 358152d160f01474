"""korch: operator fission, optimal kernel orchestration and auto tiling for ONNX models."""

import os

# Before any OpenMP runtime loads (torch's): OpenMP workers that spin after a parallel
# region steal the cores the next library's kernel needs. Measured on segformer_block
# (2 threads, quiet machine): 32 ms end to end with the default policy, 2.7 ms passive.
# See Note [No spinning thread pools] in korch/kernels/tvm/backend.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Native segments do not use OpenMP: korch's runtime has its own pool, awake for a
# segment's run and asleep between (Note [One pool, awake for a segment] in
# korch/kernels/native/korch_rt.cc).
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

from korch.api import CompiledModel, load, optimize
from korch.config import Settings
from korch.errors import InputError, KorchError, ModelError

__version__ = "0.1.0"
__all__ = ["CompiledModel", "InputError", "KorchError", "ModelError", "Settings", "load", "optimize"]
