"""Library backends for linear kernels with an elementwise epilogue: numpy (BLAS), torch (CPU, CUDA)."""
