// Per-call dispatch cost for benchmarks/linear_libraries.py: a trivial kernel (add one
// to 4 floats) called from a C++ loop through a function pointer, and the same call
// made through ctypes from Python (dispatch_noop / dispatch_add_one).
#include <chrono>

extern "C" {

__attribute__((noinline)) void dispatch_add_one(const float* a, float* b) {
  for (int i = 0; i < 4; ++i) b[i] = a[i] + 1.f;
}

void dispatch_noop() {}

// ns per call of dispatch_add_one through a volatile function pointer (no inlining).
double dispatch_cpp_loop_ns(int n) {
  void (*volatile fn)(const float*, float*) = dispatch_add_one;
  float a[4] = {1, 2, 3, 4}, b[4];
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fn(a, b);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
}
}
