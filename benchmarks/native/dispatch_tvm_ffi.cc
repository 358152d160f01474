// C++ calling a TVM-exported kernel through tvm-ffi (libtvm_ffi only, no TVM runtime):
// Module::LoadFromFile + ffi::Function call with DLTensor arguments.
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>  // AnyView conversion for DLTensor*
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <chrono>

namespace ffi = tvm::ffi;

extern "C" {

// Loads `path`, calls function `name`(a[4], b[4]) n times; returns ns per call and
// writes b[0] (for a = {1,2,3,4}) to *check. Returns -1 if the function is missing.
double dispatch_tvm_ffi_ns(const char* path, const char* name, int n, float* check) {
  ffi::Module mod = ffi::Module::LoadFromFile(path);
  auto f = mod->GetFunction(name);
  if (!f.has_value()) return -1;
  float a[4] = {1, 2, 3, 4}, b[4] = {0, 0, 0, 0};
  int64_t shape[1] = {4};
  DLTensor ta{a, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor tb{b, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  ffi::Function fn = *f;
  fn(&ta, &tb);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fn(&ta, &tb);
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
  *check = b[0];
  return ns;
}
}
