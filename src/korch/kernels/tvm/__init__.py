"""TVM TensorIR: the kernel generator for memory-bound kernels on the cpu target."""
