"""korch: operator fission, optimal kernel orchestration and auto tiling for ONNX models."""

import os

# Before any OpenMP runtime loads (torch's): OpenMP workers that spin after a parallel
# region steal the cores the next library's kernel needs. Measured on segformer_block
# (2 threads, quiet machine): 32 ms end to end with the default policy, 2.7 ms passive.
# See Note [No spinning thread pools] in korch/kernels/tvm/backend.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ...but a pool that sleeps at once pays a futex wake-up on every parallel region, and
# a native segment (korch.kernels.native) runs its kernels back to back on libgomp's
# pool: 67 us a parallel kernel passive, 3.8 us with a short spin (quiet 2-core VM,
# benchmarks/native_dispatch.py). An explicit GOMP_SPINCOUNT overrides the passive
# policy's zero in libgomp: its workers spin ~10k rounds (tens of us), then sleep;
# libgomp's own default is 300k.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")

from korch.api import CompiledModel, load, optimize
from korch.config import Settings
from korch.errors import InputError, KorchError, ModelError

__version__ = "0.1.0"
__all__ = ["CompiledModel", "InputError", "KorchError", "ModelError", "Settings", "load", "optimize"]
