// A small GEMM with a packed right operand, for linear kernels whose weights are
// constants: C = A @ B with B packed once (panels of NR columns, K-major), so a call
// pays no packing of the weights, which OpenBLAS redoes on every call (on the
// 64-row MatMuls of a transformer block, a large share of the call).
//
// The register tile is MR x NR = 6 x 16 (12 ymm accumulators, AVX2 + FMA); K is
// blocked by KC so that a panel's block stays in L1, rows by MC so that A's block
// stays in L2. Operands are addressed with two strides each, so the same kernel
// serves a row-major MatMul and a convolution computed as im2col^T @ W^T and
// written back channel-major (NCHW). Without AVX2/FMA, korch_rt.cc keeps OpenBLAS.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace korch_gemm {

constexpr int64_t MR = 6, NR = 16, KC = 256, MC = 96;

inline int64_t packed_size(int64_t K, int64_t N) { return (N + NR - 1) / NR * K * NR; }

// B(k, n) = B[k * bk + n * bn], packed into panels of NR columns (zero padded)
inline void pack_b(const float* B, int64_t K, int64_t N, int64_t bk, int64_t bn, float* out) {
  const int64_t panels = (N + NR - 1) / NR;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = out + p * K * NR;
    const int64_t n0 = p * NR, nn = std::min(NR, N - n0);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < nn; ++j) dst[k * NR + j] = B[k * bk + (n0 + j) * bn];
      for (int64_t j = nn; j < NR; ++j) dst[k * NR + j] = 0.0f;
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool available = true;

// tmp[MR x NR] = A(rows, kc) @ Bp(kc, NR), A(i, k) = A[i * ars + off(k)]; rows past mr
// repeat the last (discarded)
template <class Off>
inline void micro_at(int64_t kc, const float* A, int64_t ars, Off off, int64_t mr, const float* Bp, float* tmp,
                     bool acc = false) {
  const float* r0 = A;
  const float* r1 = A + std::min<int64_t>(1, mr - 1) * ars;
  const float* r2 = A + std::min<int64_t>(2, mr - 1) * ars;
  const float* r3 = A + std::min<int64_t>(3, mr - 1) * ars;
  const float* r4 = A + std::min<int64_t>(4, mr - 1) * ars;
  const float* r5 = A + std::min<int64_t>(5, mr - 1) * ars;
  // acc: add to what tmp holds (a tile summed over blocks of K)
  auto init = [&](int i) { return acc ? _mm256_load_ps(tmp + 8 * i) : _mm256_setzero_ps(); };
  __m256 c00 = init(0), c01 = init(1), c10 = init(2), c11 = init(3), c20 = init(4), c21 = init(5);
  __m256 c30 = init(6), c31 = init(7), c40 = init(8), c41 = init(9), c50 = init(10), c51 = init(11);
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(Bp + k * NR), b1 = _mm256_loadu_ps(Bp + k * NR + 8);
    const int64_t o = off(k);
    __m256 a = _mm256_broadcast_ss(r0 + o);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(r1 + o);
    c10 = _mm256_fmadd_ps(a, b0, c10);
    c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(r2 + o);
    c20 = _mm256_fmadd_ps(a, b0, c20);
    c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(r3 + o);
    c30 = _mm256_fmadd_ps(a, b0, c30);
    c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(r4 + o);
    c40 = _mm256_fmadd_ps(a, b0, c40);
    c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(r5 + o);
    c50 = _mm256_fmadd_ps(a, b0, c50);
    c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  _mm256_storeu_ps(tmp + 0, c00);
  _mm256_storeu_ps(tmp + 8, c01);
  _mm256_storeu_ps(tmp + 16, c10);
  _mm256_storeu_ps(tmp + 24, c11);
  _mm256_storeu_ps(tmp + 32, c20);
  _mm256_storeu_ps(tmp + 40, c21);
  _mm256_storeu_ps(tmp + 48, c30);
  _mm256_storeu_ps(tmp + 56, c31);
  _mm256_storeu_ps(tmp + 64, c40);
  _mm256_storeu_ps(tmp + 72, c41);
  _mm256_storeu_ps(tmp + 80, c50);
  _mm256_storeu_ps(tmp + 88, c51);
}

// A(i, k) = A[i * ars + k * acs]
inline void micro(int64_t kc, const float* A, int64_t ars, int64_t acs, int64_t mr, const float* Bp, float* tmp) {
  micro_at(kc, A, ars, [acs](int64_t k) { return k * acs; }, mr, Bp, tmp);
}

// C(i, j) = A(i, :) @ B(:, j) for rows [m0, m1) and panels [p0, p1), where
// A(i, k) = A[i * ars + k * acs], C(i, j) = C[i * crs + j * ccs], Bp = pack_b(B, K, N)
inline void gemm(int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* Bp, float* C,
                 int64_t crs, int64_t ccs, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  alignas(32) float tmp[MR * NR];
  for (int64_t kk = 0; kk < K; kk += KC) {
    const int64_t kc = std::min(KC, K - kk);
    for (int64_t mb = m0; mb < m1; mb += MC) {
      const int64_t me = std::min(m1, mb + MC);
      for (int64_t p = p0; p < p1; ++p) {
        const float* bp = Bp + p * K * NR + kk * NR;
        const int64_t n0 = p * NR, nn = std::min(NR, N - n0);
        for (int64_t i = mb; i < me; i += MR) {
          const int64_t mr = std::min(MR, me - i);
          micro(kc, A + i * ars + kk * acs, ars, acs, mr, bp, tmp);
          if (ccs == 1 && nn == NR) {
            for (int64_t r = 0; r < mr; ++r) {
              float* c = C + (i + r) * crs + n0;
              __m256 v0 = _mm256_load_ps(tmp + r * NR), v1 = _mm256_load_ps(tmp + r * NR + 8);
              if (kk) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c + 8));
              }
              _mm256_storeu_ps(c, v0);
              _mm256_storeu_ps(c + 8, v1);
            }
          } else {
            for (int64_t j = 0; j < nn; ++j)
              for (int64_t r = 0; r < mr; ++r) {
                float* c = C + (i + r) * crs + (n0 + j) * ccs;
                *c = kk ? *c + tmp[r * NR + j] : tmp[r * NR + j];
              }
          }
        }
      }
    }
  }
}
#else
constexpr bool available = false;
inline void gemm(int64_t, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t, int64_t,
                 int64_t, int64_t, int64_t) {}
#endif

}  // namespace korch_gemm
