// korch's native runtime: what a native segment (korch/kernels/native/segment.py) links
// beside its TVM kernels, and what the native linear backend calls through ctypes.
//
// One thread pool, korch's own (Note [One pool, awake for a segment] in korch_rt.cc).
// TVM's generated kernels reach it through the __TVMBackendParallelLaunch pointer a
// segment's init sets; the linear kernels split their work over the same threads and
// call OpenBLAS single-threaded.
#pragma once
#include <cstdint>

extern "C" {
// A linear kernel (MatMul or Conv with an elementwise epilogue) from its int64 code
// (korch/kernels/native/linear.py: encode). Returns nullptr and sets the error when the
// code is not understood.
void* korch_linear_create(const int64_t* code, int64_t n);
// ptrs: the kernel's inputs in order, then its output. 0 on success.
int korch_linear_run(void* handle, void* const* ptrs);
void korch_linear_free(void* handle);
// how many of its epilogue steps run in registers (Note [Register post-ops]); tests
int64_t korch_linear_post_steps(void* handle);

void korch_set_threads(int n);
int korch_get_threads();
// 1 where this build has the AVX-512 tiles (Note [Wide tiles] in korch_gemm.h)
int korch_wide_tiles();
const char* korch_last_error();
void korch_set_error(const char* msg);
void* korch_aligned_alloc(int64_t nbytes);
void korch_aligned_free(void* p);
// runs f(task, env, cdata) on num_task (0: all) pool threads; TVM's parallel-launch ABI
int korch_parallel_launch(int (*f)(int, void*, void*), void* cdata, int num_task);
// while held (nested holds count), the pool's workers spin between jobs instead of
// sleeping; a segment holds it for its run
void korch_pool_hold(int on);
// the holds taken and not yet given back (tests)
int korch_pool_holds();
// 1: TVM kernels run their parallel loops on the calling thread (Note [Serial small kernels])
void korch_serial(int on);
// TVM's workspace ABI (a kernel's scratch buffers)
void* korch_workspace_alloc(int device_type, int device_id, uint64_t nbytes, int code_hint, int bits_hint);
int korch_workspace_free(int device_type, int device_id, void* ptr);
}
