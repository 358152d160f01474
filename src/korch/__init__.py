"""korch: operator fission, optimal kernel orchestration and auto tiling for ONNX models."""

import os

# Before any OpenMP runtime loads (torch's): OpenMP workers that spin after a parallel
# region steal the cores the next library's kernel needs. Measured on segformer_block
# (2 threads, quiet machine): 32 ms end to end with the default policy, 2.7 ms passive.
# See Note [No spinning thread pools] in korch/kernels/tvm/backend.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A pool that sleeps at once pays a wake-up on every parallel region: inside a native
# segment 67-82 us a parallel kernel passive, 4.6-4.8 us with GOMP_SPINCOUNT=2000-10000
# (quiet 2-core VM, benchmarks/native_dispatch.py). End to end the spin lost: workers
# spinning after a segment take the core an onnxruntime step between segments needs
# (composed plans 0.46x the best peer with GOMP_SPINCOUNT=10000, 0.51x passive;
# benchmarks/RESULTS.md "Native segments"). Passive stays the default; GOMP_SPINCOUNT
# set by the user is honoured by libgomp.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

from korch.api import CompiledModel, load, optimize
from korch.config import Settings
from korch.errors import InputError, KorchError, ModelError

__version__ = "0.1.0"
__all__ = ["CompiledModel", "InputError", "KorchError", "ModelError", "Settings", "load", "optimize"]
