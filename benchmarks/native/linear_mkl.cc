// MKL cblas_sgemm harness for benchmarks/linear_libraries.py, loaded with ctypes.
// 'packed' packs B once (cblas_sgemm_pack), MKL's analogue of a blocked weight layout.
#include <mkl.h>
#include <chrono>

namespace {
struct Handle {
  int M, K, N;
  const float* w;
  float* packed = nullptr;
};
}  // namespace

extern "C" {

void* mkl_matmul_create(int M, int K, int N, const float* w, int packed, int threads) {
  mkl_set_num_threads(threads);
  auto* h = new Handle{M, K, N, w};
  if (packed) {
    h->packed = static_cast<float*>(
        mkl_malloc(cblas_sgemm_pack_get_size(CblasBMatrix, M, N, K), 64));
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, CblasNoTrans, M, N, K, 1.f, w, N, h->packed);
  }
  return h;
}

void mkl_run(void* p, const float* a, float* c, int n, double* ns_out) {
  auto* h = static_cast<Handle*>(p);
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (h->packed)
      cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, h->M, h->N, h->K, a, h->K,
                          h->packed, h->N, 0.f, c, h->N);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, h->M, h->N, h->K, 1.f, a, h->K,
                  h->w, h->N, 0.f, c, h->N);
    ns_out[i] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
}

void mkl_destroy(void* p) {
  auto* h = static_cast<Handle*>(p);
  if (h->packed) mkl_free(h->packed);
  delete h;
}
}
