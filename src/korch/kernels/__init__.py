"""Kernel generators and library backends (the only stage besides the runtime that imports TVM)."""

import os

# Set before TVM starts its thread pool: see Note [No spinning thread pools] in kernels/tvm/backend.py.
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
