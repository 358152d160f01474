"""korch's native code: the C++ runtime, native linear kernels, native segments."""
