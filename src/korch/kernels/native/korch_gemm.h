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
#include <iterator>
#include <type_traits>
#include <cmath>
#include <cstdint>

namespace korch_gemm {

// Note [Forced inlining]: the micro kernels, their stores and the post-ops are inlined
// always, not as GCC's unit-growth limits allow: adding the pooling code to korch_rt.cc
// (another few templates in the unit) left the pointwise tile's store with a post out
// of line, and a bias alone took the 1x1 16 -> 72 on 56 x 56 from 81 to 130 us.
#define KORCH_INLINE inline __attribute__((always_inline))
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

// Note [Register post-ops]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The head of a kernel's epilogue applied to a tile while it is still in registers,
// oneDNN's post-ops: a per-channel bias, then an optional clamp of an affine map, then
// optionally that result times the biased value:
//
//   y = acc + bias[channel];  g = min(max(y * ga + gb, lo), hi);  out = gate ? y * g : g
//
// ReLU is lo = 0, ReLU6 lo = 0 and hi = 6, HardSigmoid ga = 1/6, gb = 1/2, lo = 0,
// hi = 1, and HardSwish that with the gate (fission's forms, activations.py); with
// sigmoid for the clamp, Sigmoid and (gated) SiLU. The rest
// of the chain runs over rows after the tile is stored (Note [Epilogue rows]). Run as
// passes over the stored output, bias and ReLU cost 45% of a 1x1 conv of 16 -> 72
// channels on 56 x 56 pixels (83 us, 106 with the bias, 120 with the ReLU, one Zen 4
// core): each pass read and wrote a task's block through L2. Where it is applied:
// - the pointwise tile (micro_a, micro_a_wide): in the stores, the post a template
//   argument (87 us with bias and ReLU);
// - the direct conv's tile (micro_wide, micro_at): right after the micro kernel, on
//   the tile it stored in L1 (post_tile), the loop specialised on whether there is one;
// - the channel-blocked depthwise conv: on its eight accumulators before they are
//   transposed back.
// - a MatMul through the packed AVX-512 GEMM (gemm_wide): in its stores, the columns
//   the channels. GELU over rows cost a 197 x 192 x 768 MatMul + bias 48-60 us of its
//   240; in the stores 10-16 (deit_tiny's MLP, two threads of an Intel Xeon).
// The AVX2 GEMM, OpenBLAS's and the im2col path run the whole chain over rows.
//
// GELU's erf form is a third activation: g = erf(y * ga + gb) * ea + eb, gated, then
// the product scaled by os: y * 0.5 * (1 + erf(y / sqrt 2)) is ga = 1 / sqrt 2, ea = 1,
// eb = 1, os = 0.5. Run over rows instead, its five steps cost a 1x1 conv 40 -> 160 on
// 56 x 56 with its bias 2.5x the conv with the bias alone (224 -> 567 us, two threads of
// an Intel Xeon), and ConvNeXt's MLP convs are all of this form.
struct Post {
  const float* bias = nullptr;  // bias[channel], contiguous; null: none
  // a tensor laid out as the tile's output (its origin, the same row stride), added after
  // the bias (Note [Residual in registers] in korch_rt.cc); null: none. Read by
  // micro_a_wide and korch_rt.cc's Winograd output transform only
  const float* sum = nullptr;
  bool sum_after = false;  // the sum added after the activation, not before it
  bool clamp = false, sigmoid = false, gate = false;  // sigmoid: g = 1 / (1 + exp(-y)) instead
  bool erf = false, scaled = false;  // erf: g = erf(y * ga + gb) * ea + eb; scaled: the result times os
  bool affine = true;  // false: ga = 1 and gb = 0, the map skipped (ReLU, ReLU6)
  float ga = 1.0f, gb = 0.0f, lo = 0.0f, hi = 0.0f, ea = 1.0f, eb = 0.0f, os = 1.0f;
};

// the activation part of a Post on one value (the bias already added)
KORCH_INLINE float post_act1(const Post& p, float y) {
  float g;
  if (p.clamp) g = std::min(std::max(y * p.ga + p.gb, p.lo), p.hi);
  else if (p.sigmoid) g = 1.0f / (1.0f + std::exp(-y));
  else if (p.erf) g = std::erf(y * p.ga + p.gb) * p.ea + p.eb;
  else return y;
  const float r = p.gate ? y * g : g;
  return p.scaled ? r * p.os : r;
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr bool available = true;

// Note [Vector transcendentals] in korch_rt.cc: Cephes exp, eight lanes
KORCH_INLINE __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-87.33654022216797f);
  const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), _mm256_set1_ps(2.0f));
  return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
}

// erf as the generated kernels compute it (korch/kernels/tvm/fastmath.py): Eigen's
// rational approximation over [-4, 4], x p(x^2) / q(x^2); the coefficients, highest
// power first, for erf8 and erf16 alike; korch_rt.cc's rows use it too
constexpr float ERF_P[] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f, -5.69250639462346e-05f, -7.34990630326855e-04f,
                           -2.95459980854025e-03f, -1.60960333262415e-02f};
constexpr float ERF_Q[] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f, -7.37332916720468e-03f, -1.42647390514189e-02f};
KORCH_INLINE __m256 erf8(__m256 x) {
  const __m256 c = _mm256_set1_ps(4.0f);
  x = _mm256_max_ps(_mm256_min_ps(x, c), _mm256_sub_ps(_mm256_setzero_ps(), c));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(ERF_P[0]), q = _mm256_set1_ps(ERF_Q[0]);
  for (size_t i = 1; i < std::size(ERF_P); ++i) p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(ERF_P[i]));
  for (size_t i = 1; i < std::size(ERF_Q); ++i) q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(ERF_Q[i]));
  return _mm256_div_ps(_mm256_mul_ps(x, p), q);
}

// the activation part of a Post on eight lanes (the bias already added)
KORCH_INLINE __m256 post_act8(const Post& p, __m256 y) {
  __m256 g;
  if (p.clamp) {
    g = p.affine ? _mm256_add_ps(_mm256_mul_ps(y, _mm256_set1_ps(p.ga)), _mm256_set1_ps(p.gb)) : y;
    g = _mm256_min_ps(_mm256_max_ps(g, _mm256_set1_ps(p.lo)), _mm256_set1_ps(p.hi));
  } else if (p.sigmoid) {  // the rows' formula (korch_rt.cc unary8), so the same values
    const __m256 one = _mm256_set1_ps(1.0f);
    g = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), y))));
  } else if (p.erf) {
    const __m256 a = p.affine ? _mm256_fmadd_ps(y, _mm256_set1_ps(p.ga), _mm256_set1_ps(p.gb)) : y;
    g = _mm256_fmadd_ps(erf8(a), _mm256_set1_ps(p.ea), _mm256_set1_ps(p.eb));
  } else {
    return y;
  }
  const __m256 r = p.gate ? _mm256_mul_ps(y, g) : g;
  return p.scaled ? _mm256_mul_ps(r, _mm256_set1_ps(p.os)) : r;
}
#if defined(__AVX512F__)
KORCH_INLINE __m512 exp16(__m512 x) {  // exp8 on sixteen lanes
  const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-87.33654022216797f);
  const __m512 xc = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  // p * 2^n in one instruction (vscalefps), where exp8 builds 2^(n-1) in the exponent
  // bits and doubles it: the same product (a power of two scales exactly), four fewer
  // operations on the two vector ports a SiLU or sigmoid post-op saturates
  const __m512 y = _mm512_scalef_ps(p, n);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y, _mm512_set1_ps(INFINITY));
}

KORCH_INLINE __m512 erf16(__m512 x) {  // erf8 on sixteen lanes
  const __m512 c = _mm512_set1_ps(4.0f);
  x = _mm512_max_ps(_mm512_min_ps(x, c), _mm512_sub_ps(_mm512_setzero_ps(), c));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(ERF_P[0]), q = _mm512_set1_ps(ERF_Q[0]);
  for (size_t i = 1; i < std::size(ERF_P); ++i) p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(ERF_P[i]));
  for (size_t i = 1; i < std::size(ERF_Q); ++i) q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(ERF_Q[i]));
  return _mm512_div_ps(_mm512_mul_ps(x, p), q);
}

KORCH_INLINE __m512 post_act16(const Post& p, __m512 y) {
  __m512 g;
  if (p.clamp) {
    g = p.affine ? _mm512_add_ps(_mm512_mul_ps(y, _mm512_set1_ps(p.ga)), _mm512_set1_ps(p.gb)) : y;
    g = _mm512_min_ps(_mm512_max_ps(g, _mm512_set1_ps(p.lo)), _mm512_set1_ps(p.hi));
  } else if (p.sigmoid) {
    const __m512 one = _mm512_set1_ps(1.0f);
    g = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), y))));
  } else if (p.erf) {
    const __m512 a = p.affine ? _mm512_fmadd_ps(y, _mm512_set1_ps(p.ga), _mm512_set1_ps(p.gb)) : y;
    g = _mm512_fmadd_ps(erf16(a), _mm512_set1_ps(p.ea), _mm512_set1_ps(p.eb));
  } else {
    return y;
  }
  const __m512 r = p.gate ? _mm512_mul_ps(y, g) : g;
  return p.scaled ? _mm512_mul_ps(r, _mm512_set1_ps(p.os)) : r;
}
#endif

// a Post over a tile just stored by a micro kernel, still in L1: mr rows of ld floats,
// panels x NR columns (the channels; post.bias aligned, one per column). Applied in the
// micro kernels' own stores instead, the pointer and its branch cost the kernels with
// no post at all: the stem conv's 24-accumulator tile 40% (190 -> 267 us), the
// pointwise 1x1 16 -> 72 on 56 x 56 16% (83 -> 97 us). So they stay out of them.
KORCH_INLINE void post_tile(const Post& post, float* tile, int64_t mr, int64_t ld, int panels) {
  for (int64_t r = 0; r < mr; ++r)
    for (int64_t j = 0; j < panels * NR; j += 8) {
      __m256 v = _mm256_load_ps(tile + r * ld + j);
      if (post.bias) v = _mm256_add_ps(v, _mm256_load_ps(post.bias + j));
      _mm256_store_ps(tile + r * ld + j, post_act8(post, v));
    }
}
#if defined(__AVX512F__)
// post_tile on sixteen lanes. Two functions, not one choosing its lanes inside: with
// one, GCC compiled the direct conv's loop *without* a post 25% slower (the stem,
// 193 -> 240 us, one Zen 4 core), though the post is a template choice there.
KORCH_INLINE void post_tile16(const Post& post, float* tile, int64_t mr, int64_t ld, int panels) {
  // bias and a plain clamp (ReLU, ReLU6), the common case, in a loop of its own: the
  // general loop tests each of the Post's flags for every vector (the 7x7 stem conv's
  // tile has 147 FMAs a row of it, so the post was a tenth of its time)
  if (post.clamp && !post.affine && !post.gate && !post.scaled) {
    const __m512 lo = _mm512_set1_ps(post.lo), hi = _mm512_set1_ps(post.hi);
    const auto rows = [&](auto with_bias) __attribute__((always_inline)) {
      for (int64_t r = 0; r < mr; ++r)
        for (int64_t j = 0; j < panels * NR; j += 16) {
          __m512 v = _mm512_load_ps(tile + r * ld + j);
          if constexpr (decltype(with_bias)::value) v = _mm512_add_ps(v, _mm512_load_ps(post.bias + j));
          _mm512_store_ps(tile + r * ld + j, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
        }
    };
    if (post.bias) rows(std::true_type{});
    else rows(std::false_type{});
    return;
  }
  for (int64_t r = 0; r < mr; ++r)
    for (int64_t j = 0; j < panels * NR; j += 16) {
      __m512 v = _mm512_load_ps(tile + r * ld + j);
      if (post.bias) v = _mm512_add_ps(v, _mm512_load_ps(post.bias + j));
      _mm512_store_ps(tile + r * ld + j, post_act16(post, v));
    }
}
#endif

// tmp[R x NR] = A(R rows, kc) @ Bp(kc, NR), A(i, k) = A[i * ars + off(k)]; acc: add
// to what tmp holds (a tile summed over blocks of K). R (1..6) is a constant, so a
// tail tile computes only its own rows.
template <int R, int S, class Off>
KORCH_INLINE void micro_rows(int64_t kc, const float* A, int64_t ars_, Off off, const float* Bp, float* tmp, bool acc) {
  const int64_t ars = S ? S : ars_;  // S: the row stride as a constant (1: a convolution's unit stride)
  // named accumulators, not an array: GCC kept a __m256 c[R][2] on the stack, a store
  // per FMA pair (2.2x slower); tmp is added at the end, not loaded as initial values
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(Bp + k * NR), b1 = _mm256_load_ps(Bp + k * NR + 8);
    const float* a0 = A + off(k);
    if constexpr (R > 0) {
      const __m256 a = _mm256_broadcast_ss(a0 + 0 * ars);
      c00 = _mm256_fmadd_ps(a, b0, c00);
      c01 = _mm256_fmadd_ps(a, b1, c01);
    }
    if constexpr (R > 1) {
      const __m256 a = _mm256_broadcast_ss(a0 + 1 * ars);
      c10 = _mm256_fmadd_ps(a, b0, c10);
      c11 = _mm256_fmadd_ps(a, b1, c11);
    }
    if constexpr (R > 2) {
      const __m256 a = _mm256_broadcast_ss(a0 + 2 * ars);
      c20 = _mm256_fmadd_ps(a, b0, c20);
      c21 = _mm256_fmadd_ps(a, b1, c21);
    }
    if constexpr (R > 3) {
      const __m256 a = _mm256_broadcast_ss(a0 + 3 * ars);
      c30 = _mm256_fmadd_ps(a, b0, c30);
      c31 = _mm256_fmadd_ps(a, b1, c31);
    }
    if constexpr (R > 4) {
      const __m256 a = _mm256_broadcast_ss(a0 + 4 * ars);
      c40 = _mm256_fmadd_ps(a, b0, c40);
      c41 = _mm256_fmadd_ps(a, b1, c41);
    }
    if constexpr (R > 5) {
      const __m256 a = _mm256_broadcast_ss(a0 + 5 * ars);
      c50 = _mm256_fmadd_ps(a, b0, c50);
      c51 = _mm256_fmadd_ps(a, b1, c51);
    }
  }
  auto store = [&](int i, __m256 v0, __m256 v1) __attribute__((always_inline)) {
    if (acc) {
      v0 = _mm256_add_ps(v0, _mm256_load_ps(tmp + i * NR));
      v1 = _mm256_add_ps(v1, _mm256_load_ps(tmp + i * NR + 8));
    }
    _mm256_store_ps(tmp + i * NR, v0);
    _mm256_store_ps(tmp + i * NR + 8, v1);
  };
  if constexpr (R > 0) store(0, c00, c01);
  if constexpr (R > 1) store(1, c10, c11);
  if constexpr (R > 2) store(2, c20, c21);
  if constexpr (R > 3) store(3, c30, c31);
  if constexpr (R > 4) store(4, c40, c41);
  if constexpr (R > 5) store(5, c50, c51);
}

// the first mr (1..MR) rows of the tile; rows past mr of tmp are left as they were.
// Bp is 32-byte aligned (Note [Aligned panels]) and tmp too.
template <class Off>
inline void micro_at(int64_t kc, const float* A, int64_t ars, Off off, int64_t mr, const float* Bp, float* tmp,
                     bool acc = false) {
  if (ars == 1) {  // offsets in the instructions, no address arithmetic per row
    switch (mr) {
      case 1: return micro_rows<1, 1>(kc, A, 1, off, Bp, tmp, acc);
      case 2: return micro_rows<2, 1>(kc, A, 1, off, Bp, tmp, acc);
      case 3: return micro_rows<3, 1>(kc, A, 1, off, Bp, tmp, acc);
      case 4: return micro_rows<4, 1>(kc, A, 1, off, Bp, tmp, acc);
      case 5: return micro_rows<5, 1>(kc, A, 1, off, Bp, tmp, acc);
      default: return micro_rows<MR, 1>(kc, A, 1, off, Bp, tmp, acc);
    }
  }
  switch (mr) {
    case 1: return micro_rows<1, 0>(kc, A, ars, off, Bp, tmp, acc);
    case 2: return micro_rows<2, 0>(kc, A, ars, off, Bp, tmp, acc);
    case 3: return micro_rows<3, 0>(kc, A, ars, off, Bp, tmp, acc);
    case 4: return micro_rows<4, 0>(kc, A, ars, off, Bp, tmp, acc);
    case 5: return micro_rows<5, 0>(kc, A, ars, off, Bp, tmp, acc);
    default: return micro_rows<MR, 0>(kc, A, ars, off, Bp, tmp, acc);
  }
}

// A(i, k) = A[i * ars + k * acs]
inline void micro(int64_t kc, const float* A, int64_t ars, int64_t acs, int64_t mr, const float* Bp, float* tmp) {
  micro_at(kc, A, ars, [acs](int64_t k) { return k * acs; }, mr, Bp, tmp);
}

#if defined(__AVX512F__)
// Note [Wide tiles]
// ~~~~~~~~~~~~~~~~~
// Where the CPU has AVX-512, a register tile is up to WR = 12 rows by two panels (32
// columns: 24 zmm accumulators of the 32), each FMA taking its row's value as an
// embedded broadcast. The 6 x 16 AVX2 tile needs 6 rows for enough independent
// accumulators (12, for an FMA latency of 4 on two pipes): a 7-pixel row of a 7x7
// conv split 4 + 3 ran at 63 GFLOP/s on one Zen 4 core against onnxruntime's 112
// (its NCHWc kernels are AVX-512 here). With zmm accumulators over two panels, a
// tile of any row count keeps the pipes busy (2R chains of twice the width), so a
// row of 7 is one tile. The panels are korch_gemm::pack_b's (NR = 16 columns each,
// pstride floats apart); tmp holds the tile as R rows of 32 floats, 64-byte aligned.
constexpr bool wide = true;
constexpr int64_t WR = 12, WN = 32;

// Note [Weights fetched ahead]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In a model, a convolution's weights come from memory: resnet18 streams 46 MB of them
// a call, far past the caches, where a kernel timed alone finds its own in L2 or L3
// (its 512-channel 3x3 conv, 9.4 MB: 860 us alone, 1,150 in place on two threads;
// the VM reads 14 GB/s a core). The tiles reading a block of K run from L1 once the
// first has brought it in, and that first tile waits on memory. So while a block's
// tiles run, they fetch the next block's lines (prefetcht0), the tiles sharing them
// out and each spreading its share over its K loop (pf_n lines, one every pf_step-th
// k: all at the start, they filled the line-fill buffers and stalled the FMAs). resnet18,
// its saved plan, two threads, four processes each: 15.8-16.7 -> 15.4-15.8 ms (fetched
// all at a tile's start: 15.9-16.1); its last stage's convs 1,145-1,174 -> 943-964 us.
// Fetching, in a task's last block, the first block of the task the thread would
// likely claim next made no difference measured, and is not done.

// Note [Weights fetched ahead]: a tile's share of the next block's lines (n, from pf),
// one line of each of P panels every step-th k; the micro kernels tick() it in their
// K loops. fetch_share() is what a caller passes them (pf, pf_n, pf_step): tile t of
// tiles' part of `lines` lines from `next`, over a K loop of kc.
struct FetchShare {
  const float* pf;
  int64_t n, step;
};
inline FetchShare fetch_share(const float* next, int64_t lines, int64_t t, int64_t tiles, int64_t kc) {
  const int64_t l0 = lines * t / tiles, l1 = lines * (t + 1) / tiles;
  return {next + l0 * NR, l1 - l0, l1 > l0 ? std::max<int64_t>(1, kc / (l1 - l0)) : 1};
}
struct FetchAhead {
  const float* pf;
  int64_t pstride, n, step, wait = 1, j = 0;
  template <int P>
  KORCH_INLINE void tick() {
    if (--wait == 0 && j < n) {
      for (int q = 0; q < P; ++q) _mm_prefetch(reinterpret_cast<const char*>(pf + q * pstride + j * NR), _MM_HINT_T0);
      ++j, wait = step;
    }
  }
};

template <int R, int P, int S, class Off>
KORCH_INLINE void micro_wide_rows(int64_t kc, const float* A, int64_t ars_, Off off, const float* Bp, int64_t pstride,
                            float* tmp, bool acc, const float* pf, int64_t pf_n, int64_t pf_step) {
  const int64_t ars = S ? S : ars_;
  const __m512 z = _mm512_setzero_ps();
  __m512 c0a = z, c0b = z, c1a = z, c1b = z, c2a = z, c2b = z, c3a = z, c3b = z, c4a = z, c4b = z, c5a = z,
         c5b = z, c6a = z, c6b = z, c7a = z, c7b = z, c8a = z, c8b = z, c9a = z, c9b = z, c10a = z, c10b = z,
         c11a = z, c11b = z;
  const float* B1 = Bp + pstride;
  FetchAhead fetch{pf, pstride, pf_n, pf_step};
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(Bp + k * NR);
    const __m512 b1 = P > 1 ? _mm512_load_ps(B1 + k * NR) : z;
    fetch.tick<P>();
    const float* a0 = A + off(k);
#define KORCH_WROW(i)                                  \
  if constexpr (R > i) {                               \
    const __m512 x = _mm512_set1_ps(a0[i * ars]);      \
    c##i##a = _mm512_fmadd_ps(x, b0, c##i##a);         \
    if constexpr (P > 1) c##i##b = _mm512_fmadd_ps(x, b1, c##i##b); \
  }
    KORCH_WROW(0) KORCH_WROW(1) KORCH_WROW(2) KORCH_WROW(3) KORCH_WROW(4) KORCH_WROW(5)
    KORCH_WROW(6) KORCH_WROW(7) KORCH_WROW(8) KORCH_WROW(9) KORCH_WROW(10) KORCH_WROW(11)
#undef KORCH_WROW
  }
  auto store = [&](int i, __m512 v0, __m512 v1) __attribute__((always_inline)) {
    float* t = tmp + i * WN;
    if (acc) {
      v0 = _mm512_add_ps(v0, _mm512_load_ps(t));
      if constexpr (P > 1) v1 = _mm512_add_ps(v1, _mm512_load_ps(t + NR));
    }
    _mm512_store_ps(t, v0);
    if constexpr (P > 1) _mm512_store_ps(t + NR, v1);
  };
#define KORCH_WSTORE(i) \
  if constexpr (R > i) store(i, c##i##a, c##i##b);
  KORCH_WSTORE(0) KORCH_WSTORE(1) KORCH_WSTORE(2) KORCH_WSTORE(3) KORCH_WSTORE(4) KORCH_WSTORE(5)
  KORCH_WSTORE(6) KORCH_WSTORE(7) KORCH_WSTORE(8) KORCH_WSTORE(9) KORCH_WSTORE(10) KORCH_WSTORE(11)
#undef KORCH_WSTORE
}

template <int P, int S, class Off>
inline void micro_wide_p(int64_t kc, const float* A, int64_t ars, Off off, int64_t mr, const float* Bp,
                         int64_t pstride, float* tmp, bool acc, const float* pf, int64_t pf_n, int64_t pf_step) {
  switch (mr) {
#define KORCH_WCASE(r) \
  case r: return micro_wide_rows<r, P, S>(kc, A, ars, off, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
    KORCH_WCASE(1) KORCH_WCASE(2) KORCH_WCASE(3) KORCH_WCASE(4) KORCH_WCASE(5) KORCH_WCASE(6)
    KORCH_WCASE(7) KORCH_WCASE(8) KORCH_WCASE(9) KORCH_WCASE(10) KORCH_WCASE(11)
#undef KORCH_WCASE
    default: return micro_wide_rows<WR, P, S>(kc, A, ars, off, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
  }
}

// the first mr (1..WR) rows of a tile over panels (1 or 2) panels
template <class Off>
inline void micro_wide(int64_t kc, const float* A, int64_t ars, Off off, int64_t mr, const float* Bp, int64_t pstride,
                       int panels, float* tmp, bool acc, const float* pf = nullptr, int64_t pf_n = 0,
                       int64_t pf_step = 1) {
  if (panels > 1) {
    if (ars == 1) return micro_wide_p<2, 1>(kc, A, 1, off, mr, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
    // stride 2 (a stem, a downsampling conv) a constant too: the row addresses are then
    // displacements, not a chain of adds a k
    if (ars == 2) return micro_wide_p<2, 2>(kc, A, 2, off, mr, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
    return micro_wide_p<2, 0>(kc, A, ars, off, mr, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
  }
  if (ars == 1) return micro_wide_p<1, 1>(kc, A, 1, off, mr, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
  return micro_wide_p<1, 0>(kc, A, ars, off, mr, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
}

// Note [Four-panel tiles]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A row of 7 or 14 output pixels (resnet18's last two stages) makes tiles of 7 rows,
// and a 7 x 2-panel tile keeps only 14 accumulators: each k loads two weight vectors
// and broadcasts seven inputs for 14 FMAs, 147 GFLOP/s on one core of the Xeon against
// 164 for the 12 x 2 tile (a loop over L1 data). Four panels (64 channels) over 7 rows
// are 28 accumulators, 28 FMAs for four loads and seven broadcasts: 161, as MLAS's
// NCHWc kernel runs (6 pixels x 4 filter blocks). Wider rows too (a stride-2 3x3 conv
// or a stem with 64 channels): each input value is broadcast once for 64 channels, not
// once per pair of panels; YOLOv5's 32 -> 64 stride 2 from 80 x 80 349-350 -> 294-308 us
// on two threads of the Xeon. tmp holds R rows of 64 floats.
constexpr int64_t QR = 7, QN = 64;

template <int R, int S, class Off>
KORCH_INLINE void micro_quad_rows(int64_t kc, const float* A, int64_t ars_, Off off, const float* Bp, int64_t pstride,
                                  float* tmp, bool acc, const float* pf, int64_t pf_n, int64_t pf_step) {
  const int64_t ars = S ? S : ars_;
  const __m512 z = _mm512_setzero_ps();
  __m512 c0a = z, c0b = z, c0c = z, c0d = z, c1a = z, c1b = z, c1c = z, c1d = z, c2a = z, c2b = z, c2c = z, c2d = z,
         c3a = z, c3b = z, c3c = z, c3d = z, c4a = z, c4b = z, c4c = z, c4d = z, c5a = z, c5b = z, c5c = z, c5d = z,
         c6a = z, c6b = z, c6c = z, c6d = z;
  const float *B1 = Bp + pstride, *B2 = Bp + 2 * pstride, *B3 = Bp + 3 * pstride;
  FetchAhead fetch{pf, pstride, pf_n, pf_step};
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(Bp + k * NR), b1 = _mm512_load_ps(B1 + k * NR);
    const __m512 b2 = _mm512_load_ps(B2 + k * NR), b3 = _mm512_load_ps(B3 + k * NR);
    fetch.tick<4>();
    const float* a0 = A + off(k);
#define KORCH_QROW(i)                                  \
  if constexpr (R > i) {                               \
    const __m512 x = _mm512_set1_ps(a0[i * ars]);      \
    c##i##a = _mm512_fmadd_ps(x, b0, c##i##a);         \
    c##i##b = _mm512_fmadd_ps(x, b1, c##i##b);         \
    c##i##c = _mm512_fmadd_ps(x, b2, c##i##c);         \
    c##i##d = _mm512_fmadd_ps(x, b3, c##i##d);         \
  }
    KORCH_QROW(0) KORCH_QROW(1) KORCH_QROW(2) KORCH_QROW(3) KORCH_QROW(4) KORCH_QROW(5) KORCH_QROW(6)
#undef KORCH_QROW
  }
  auto store = [&](int i, __m512 v0, __m512 v1, __m512 v2, __m512 v3) __attribute__((always_inline)) {
    float* t = tmp + i * QN;
    if (acc) {
      v0 = _mm512_add_ps(v0, _mm512_load_ps(t));
      v1 = _mm512_add_ps(v1, _mm512_load_ps(t + NR));
      v2 = _mm512_add_ps(v2, _mm512_load_ps(t + 2 * NR));
      v3 = _mm512_add_ps(v3, _mm512_load_ps(t + 3 * NR));
    }
    _mm512_store_ps(t, v0);
    _mm512_store_ps(t + NR, v1);
    _mm512_store_ps(t + 2 * NR, v2);
    _mm512_store_ps(t + 3 * NR, v3);
  };
#define KORCH_QSTORE(i) \
  if constexpr (R > i) store(i, c##i##a, c##i##b, c##i##c, c##i##d);
  KORCH_QSTORE(0) KORCH_QSTORE(1) KORCH_QSTORE(2) KORCH_QSTORE(3) KORCH_QSTORE(4) KORCH_QSTORE(5) KORCH_QSTORE(6)
#undef KORCH_QSTORE
}

// the first mr (1..QR) rows of a tile over four panels, pstride floats apart
template <class Off>
inline void micro_quad(int64_t kc, const float* A, int64_t ars, Off off, int64_t mr, const float* Bp, int64_t pstride,
                       float* tmp, bool acc, const float* pf, int64_t pf_n, int64_t pf_step) {
#define KORCH_QCASE(r)                                                                                           \
  case r:                                                                                                        \
    if (ars == 1) return micro_quad_rows<r, 1>(kc, A, 1, off, Bp, pstride, tmp, acc, pf, pf_n, pf_step);         \
    if (ars == 2) return micro_quad_rows<r, 2>(kc, A, 2, off, Bp, pstride, tmp, acc, pf, pf_n, pf_step);         \
    return micro_quad_rows<r, 0>(kc, A, ars, off, Bp, pstride, tmp, acc, pf, pf_n, pf_step);
  switch (mr) {
    KORCH_QCASE(1) KORCH_QCASE(2) KORCH_QCASE(3) KORCH_QCASE(4) KORCH_QCASE(5) KORCH_QCASE(6)
    default:
      KORCH_QCASE(7)
  }
#undef KORCH_QCASE
}

// a 16 x 16 transpose in registers: r[i] (row i) becomes column i
KORCH_INLINE void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Note [Transposed tile stores]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A direct conv's tile has pixels for rows and channels for columns; Y (NCHW) has
// channels for rows. Columns [0, nn) of the first mr (<= 16) rows, ld floats apart
// (64-byte aligned), go to y[j * ys + r]: per 16 channels a transpose in registers
// and a masked store of mr floats a channel. Copied one float at a time, the store
// took a third of a stem conv's time (3 -> 16, 3x3 stride 2, 224x224: 199 us, 131
// with no store; one Zen 4 core), where K = 27 leaves little compute per tile.
inline void store_transposed(const float* tile, int64_t mr, int64_t ld, int64_t nn, float* y, int64_t ys) {
  const __mmask16 m = (__mmask16)((1u << mr) - 1);
  for (int64_t j0 = 0; j0 < nn; j0 += 16) {
    __m512 r[16];
    for (int64_t i = 0; i < 16; ++i) r[i] = i < mr ? _mm512_load_ps(tile + i * ld + j0) : _mm512_setzero_ps();
    transpose16(r);
    const int64_t jn = std::min<int64_t>(16, nn - j0);
    for (int64_t j = 0; j < jn; ++j) _mm512_mask_storeu_ps(y + (j0 + j) * ys, m, r[j]);
  }
}
#else
constexpr bool wide = false;
constexpr int64_t WR = 6, WN = 32;
#endif

#if defined(__AVX512F__)
// gemm's loops over Note [Wide tiles]: panels in pairs, rows in tiles of up to WR, a
// block of rows split into tiles as equal as they can be
// post: Note [Register post-ops] on the last block of K, columns the channels (a
// MatMul's last dimension), its bias zero padded to whole pairs of panels
inline void gemm_wide(int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* Bp, float* C,
                      int64_t crs, int64_t ccs, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                      const Post* post = nullptr) {
  alignas(64) float tmp[WR * WN];
  for (int64_t kk = 0; kk < K; kk += KC) {
    const int64_t kc = std::min(KC, K - kk);
    for (int64_t mb = m0; mb < m1; mb += MC) {
      const int64_t me = std::min(m1, mb + MC), tiles = (me - mb + WR - 1) / WR;
      for (int64_t p = p0; p < p1; p += 2) {
        const int np = p + 1 < p1 ? 2 : 1;
        const float* bp = Bp + p * K * NR + kk * NR;
        const int64_t n0 = p * NR, nn = std::min<int64_t>(np * NR, N - n0);
        // Note [Weights fetched ahead]: the next pair of panels' block, or the next block's
        // first pair after the last block of rows
        const float* nb = p + 2 < p1 ? bp + 2 * K * NR : me == m1 && kk + kc < K ? Bp + p0 * K * NR + (kk + kc) * NR : nullptr;
        const int64_t nl = nb ? std::min(KC, K - (p + 2 < p1 ? kk : kk + kc)) : 0;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t i = mb + t * (me - mb) / tiles, mr = mb + (t + 1) * (me - mb) / tiles - i;
          const float* a = A + i * ars + kk * acs;
          const FetchShare f = fetch_share(nb, nl, t, tiles, kc);
          micro_wide(kc, a, ars, [acs](int64_t k) { return k * acs; }, mr, bp, K * NR, np, tmp, false, f.pf, f.n, f.step);
          const Post* last = kk + kc == K ? post : nullptr;
          if (ccs == 1 && nn == WN) {
            __m512 b0 = _mm512_setzero_ps(), b1 = b0;
            if (last && last->bias) b0 = _mm512_loadu_ps(last->bias + n0), b1 = _mm512_loadu_ps(last->bias + n0 + NR);
            for (int64_t r = 0; r < mr; ++r) {
              float* c = C + (i + r) * crs + n0;
              __m512 v0 = _mm512_load_ps(tmp + r * WN), v1 = _mm512_load_ps(tmp + r * WN + NR);
              if (kk) {
                v0 = _mm512_add_ps(v0, _mm512_loadu_ps(c));
                v1 = _mm512_add_ps(v1, _mm512_loadu_ps(c + NR));
              }
              if (last) {
                v0 = post_act16(*last, _mm512_add_ps(v0, b0));
                v1 = post_act16(*last, _mm512_add_ps(v1, b1));
              }
              _mm512_storeu_ps(c, v0);
              _mm512_storeu_ps(c + NR, v1);
            }
          } else {
            for (int64_t j = 0; j < nn; ++j)
              for (int64_t r = 0; r < mr; ++r) {
                float* c = C + (i + r) * crs + (n0 + j) * ccs;
                float v = kk ? *c + tmp[r * WN + j] : tmp[r * WN + j];
                if (last) v = post_act1(*last, last->bias ? v + last->bias[n0 + j] : v);
                *c = v;
              }
          }
        }
      }
    }
  }
}
#endif

// C(i, j) = A(i, :) @ B(:, j) for rows [m0, m1) and panels [p0, p1), where
// A(i, k) = A[i * ars + k * acs], C(i, j) = C[i * crs + j * ccs], Bp = pack_b(B, K, N)
// post: AVX-512 only (gemm_wide); the AVX2 path takes none (korch_rt.cc plan_post)
inline void gemm(int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* Bp, float* C,
                 int64_t crs, int64_t ccs, int64_t m0, int64_t m1, int64_t p0, int64_t p1,
                 const Post* post = nullptr) {
#if defined(__AVX512F__)
  return gemm_wide(N, K, A, ars, acs, Bp, C, crs, ccs, m0, m1, p0, p1, post);
#endif
  (void)post;
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
// A panel of the left operand: MR rows, K-major, A(i, k) = A[i * ars + k * acs] (zero rows
// past M), for micro_a_panel (Note [Pointwise convolution rows] in korch_rt.cc)
inline int64_t packed_a_size(int64_t M, int64_t K) { return (M + MR - 1) / MR * K * MR; }

inline void pack_a(const float* A, int64_t M, int64_t K, int64_t ars, int64_t acs, float* out) {
  for (int64_t p = 0; p < (M + MR - 1) / MR; ++p)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t i = 0; i < MR; ++i) {
        const int64_t r = p * MR + i;
        out[(p * K + k) * MR + i] = r < M ? A[r * ars + k * acs] : 0.0f;
      }
}

// C(R x NR) = Ap(R rows of a packed panel, kc) @ B(kc, NR), plus what C holds when acc:
// B(k, j) = B[k * ldb + j] read in place (unaligned), C(i, j) = C[i * ldc + j]
template <int R, bool POST = false>
KORCH_INLINE void micro_a_panel(int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C, int64_t ldc, bool acc,
                          const Post* post = nullptr) {
  const __m256 z = _mm256_setzero_ps();
  __m256 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z, c51 = z;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
    const float* a = Ap + k * MR;
#define KORCH_ROW(i)                                     \
  if constexpr (R > i) {                                 \
    const __m256 x = _mm256_broadcast_ss(a + i);         \
    c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0);           \
    c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);           \
  }
    KORCH_ROW(0) KORCH_ROW(1) KORCH_ROW(2) KORCH_ROW(3) KORCH_ROW(4) KORCH_ROW(5)
#undef KORCH_ROW
  }
  auto store = [&](int i, __m256 v0, __m256 v1) __attribute__((always_inline)) {
    float* c = C + i * ldc;
    if (acc) {
      v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
      v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c + 8));
    }
    if constexpr (POST) {  // Note [Register post-ops]: rows are channels
      if (post->bias) {
        const __m256 b = _mm256_set1_ps(post->bias[i]);
        v0 = _mm256_add_ps(v0, b), v1 = _mm256_add_ps(v1, b);
      }
      v0 = post_act8(*post, v0), v1 = post_act8(*post, v1);
    }
    _mm256_storeu_ps(c, v0);
    _mm256_storeu_ps(c + 8, v1);
  };
  if constexpr (R > 0) store(0, c00, c01);
  if constexpr (R > 1) store(1, c10, c11);
  if constexpr (R > 2) store(2, c20, c21);
  if constexpr (R > 3) store(3, c30, c31);
  if constexpr (R > 4) store(4, c40, c41);
  if constexpr (R > 5) store(5, c50, c51);
}

// post: Note [Register post-ops] (the last block of K), bias[0] the tile's first row's.
// A template argument, not a test in the store: a pointer and a branch there cost the
// kernels with no post at all (the 1x1 16 -> 72 on 56 x 56: 83 -> 97 us, one Zen 4 core).
// Applied to the output after the store instead, the reload of a masked store does not
// forward from it and stalls (a ReLU alone cost 38 us of that kernel).
template <bool POST>
inline void micro_a_m(int64_t mr, int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C, int64_t ldc,
                      bool acc, const Post* post) {
  switch (mr) {
    case 1: return micro_a_panel<1, POST>(kc, Ap, B, ldb, C, ldc, acc, post);
    case 2: return micro_a_panel<2, POST>(kc, Ap, B, ldb, C, ldc, acc, post);
    case 3: return micro_a_panel<3, POST>(kc, Ap, B, ldb, C, ldc, acc, post);
    case 4: return micro_a_panel<4, POST>(kc, Ap, B, ldb, C, ldc, acc, post);
    case 5: return micro_a_panel<5, POST>(kc, Ap, B, ldb, C, ldc, acc, post);
    default: return micro_a_panel<MR, POST>(kc, Ap, B, ldb, C, ldc, acc, post);
  }
}

inline void micro_a(int64_t mr, int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C, int64_t ldc,
                    bool acc, const Post* post = nullptr) {
  if (post) return micro_a_m<true>(mr, kc, Ap, B, ldb, C, ldc, acc, post);
  return micro_a_m<false>(mr, kc, Ap, B, ldb, C, ldc, acc, nullptr);
}
#if defined(__AVX512F__)
// Note [Wide pointwise tiles]: the left-operand tile of Note [Pointwise convolution
// rows] in zmm: R (<= MR) channels by V (<= 4) vectors of 16 pixels read in place, the
// last vector masked (no padded copy: a masked load does not touch the lanes it
// leaves out); 24 accumulators at R = 6, V = 4
template <int R, int V, bool POST>
KORCH_INLINE void micro_a_wide_rv(int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C, int64_t ldc, bool acc,
                            __mmask16 last, const Post* post) {
  const __m512 z = _mm512_setzero_ps();
#define KORCH_PDECL(i) __m512 c##i##0 = z, c##i##1 = z, c##i##2 = z, c##i##3 = z;
  KORCH_PDECL(0) KORCH_PDECL(1) KORCH_PDECL(2) KORCH_PDECL(3) KORCH_PDECL(4) KORCH_PDECL(5)
#undef KORCH_PDECL
  const __mmask16 full = 0xFFFF;
  for (int64_t k = 0; k < kc; ++k) {
    const float* b = B + k * ldb;
    const __m512 b0 = _mm512_maskz_loadu_ps(V == 1 ? last : full, b);
    const __m512 b1 = V > 1 ? _mm512_maskz_loadu_ps(V == 2 ? last : full, b + 16) : z;
    const __m512 b2 = V > 2 ? _mm512_maskz_loadu_ps(V == 3 ? last : full, b + 32) : z;
    const __m512 b3 = V > 3 ? _mm512_maskz_loadu_ps(last, b + 48) : z;
    const float* a = Ap + k * MR;
#define KORCH_PROW(i)                                                   \
  if constexpr (R > i) {                                                \
    const __m512 x = _mm512_set1_ps(a[i]);                              \
    c##i##0 = _mm512_fmadd_ps(x, b0, c##i##0);                          \
    if constexpr (V > 1) c##i##1 = _mm512_fmadd_ps(x, b1, c##i##1);     \
    if constexpr (V > 2) c##i##2 = _mm512_fmadd_ps(x, b2, c##i##2);     \
    if constexpr (V > 3) c##i##3 = _mm512_fmadd_ps(x, b3, c##i##3);     \
  }
    KORCH_PROW(0) KORCH_PROW(1) KORCH_PROW(2) KORCH_PROW(3) KORCH_PROW(4) KORCH_PROW(5)
#undef KORCH_PROW
  }
  auto store = [&](int i, int v, __m512 val) __attribute__((always_inline)) {
    float* c = C + i * ldc + v * 16;
    const __mmask16 m = v == V - 1 ? last : full;
    if (acc) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(m, c));
    if constexpr (POST) {  // Note [Register post-ops]: rows are channels
      if (post->bias) val = _mm512_add_ps(val, _mm512_set1_ps(post->bias[i]));
      const auto add_sum = [&](__m512 x) __attribute__((always_inline)) {
        return _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, post->sum + i * ldc + v * 16));
      };
      if (post->sum && !post->sum_after) val = add_sum(val);
      val = post_act16(*post, val);
      if (post->sum && post->sum_after) val = add_sum(val);
    }
    _mm512_mask_storeu_ps(c, m, val);
  };
#define KORCH_PSTORE(i)                              \
  if constexpr (R > i) {                             \
    store(i, 0, c##i##0);                            \
    if constexpr (V > 1) store(i, 1, c##i##1);       \
    if constexpr (V > 2) store(i, 2, c##i##2);       \
    if constexpr (V > 3) store(i, 3, c##i##3);       \
  }
  KORCH_PSTORE(0) KORCH_PSTORE(1) KORCH_PSTORE(2) KORCH_PSTORE(3) KORCH_PSTORE(4) KORCH_PSTORE(5)
#undef KORCH_PSTORE
}

template <int R, bool POST>
inline void micro_a_wide_r(int64_t nv, int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C,
                           int64_t ldc, bool acc, __mmask16 last, const Post* post) {
  switch (nv) {
    case 1: return micro_a_wide_rv<R, 1, POST>(kc, Ap, B, ldb, C, ldc, acc, last, post);
    case 2: return micro_a_wide_rv<R, 2, POST>(kc, Ap, B, ldb, C, ldc, acc, last, post);
    case 3: return micro_a_wide_rv<R, 3, POST>(kc, Ap, B, ldb, C, ldc, acc, last, post);
    default: return micro_a_wide_rv<R, 4, POST>(kc, Ap, B, ldb, C, ldc, acc, last, post);
  }
}

template <bool POST>
inline void micro_a_wide_m(int64_t mr, int64_t nv, int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C,
                           int64_t ldc, bool acc, __mmask16 last, const Post* post) {
  switch (mr) {
    case 1: return micro_a_wide_r<1, POST>(nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
    case 2: return micro_a_wide_r<2, POST>(nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
    case 3: return micro_a_wide_r<3, POST>(nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
    case 4: return micro_a_wide_r<4, POST>(nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
    case 5: return micro_a_wide_r<5, POST>(nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
    default: return micro_a_wide_r<MR, POST>(nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
  }
}

// mr (1..MR) channels by np (1..64) pixels; post as in micro_a
inline void micro_a_wide(int64_t mr, int64_t np, int64_t kc, const float* Ap, const float* B, int64_t ldb, float* C,
                         int64_t ldc, bool acc, const Post* post = nullptr) {
  const int64_t nv = (np + 15) / 16, rem = np - (nv - 1) * 16;
  const __mmask16 last = (__mmask16)((1u << rem) - 1u);
  if (post) return micro_a_wide_m<true>(mr, nv, kc, Ap, B, ldb, C, ldc, acc, last, post);
  return micro_a_wide_m<false>(mr, nv, kc, Ap, B, ldb, C, ldc, acc, last, nullptr);
}
#endif
#else
constexpr bool available = false;
inline void gemm(int64_t, int64_t, const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t, int64_t,
                 int64_t, int64_t, int64_t) {}
#endif

}  // namespace korch_gemm
