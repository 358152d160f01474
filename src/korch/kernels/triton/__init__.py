"""Triton: the kernel generator for memory-bound kernels on the cuda target."""
