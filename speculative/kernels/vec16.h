// Sixteen float32 lanes, one type per ISA path, with the same lane-wise arithmetic on each:
// V16Avx512 (one zmm), V16Avx2 (two ymm), V16Portable (a float[16] and std::fma). Kernels written
// once over a `V` (attention_impl.inc, rms_norm_impl.inc) and compiled once per type compute the
// same bits on every path. Lanes past a row's end are loaded as 0 (`load_n(p, n)`, n < 16) and not
// stored (`store_n(p, n)` stores the first min(n, 16) lanes).
//
// `reduce_add` sums the lanes in one fixed tree: lane j + lane j+8, then j + j+4, j + j+2, j + j+1.

#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace spec {

// The best path this CPU runs: 3 AVX-512 (F + VL), 2 AVX2 + FMA, 1 portable.
inline int64_t best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  return 1;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
struct V16Avx512 {
  __m512 v;
  static __mmask16 mask(int64_t n) {  // the first min(n, 16) lanes
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
  }
  static V16Avx512 zero() { return {_mm512_setzero_ps()}; }
  static V16Avx512 bcast(float x) { return {_mm512_set1_ps(x)}; }
  static V16Avx512 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static V16Avx512 load_n(const float* p, int64_t n) {
    return {_mm512_maskz_loadu_ps(mask(n), p)};
  }
  void store_n(float* p, int64_t n) const { _mm512_mask_storeu_ps(p, mask(n), v); }
  static V16Avx512 fma(V16Avx512 a, V16Avx512 b, V16Avx512 c) {
    return {_mm512_fmadd_ps(a.v, b.v, c.v)};
  }
  static V16Avx512 add(V16Avx512 a, V16Avx512 b) { return {_mm512_add_ps(a.v, b.v)}; }
  static V16Avx512 mul(V16Avx512 a, V16Avx512 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static V16Avx512 div(V16Avx512 a, V16Avx512 b) { return {_mm512_div_ps(a.v, b.v)}; }
  static V16Avx512 floor(V16Avx512 a) {
    return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
  }
  // x > threshold ? a : b, lane by lane.
  static V16Avx512 gt_select(V16Avx512 x, V16Avx512 threshold, V16Avx512 a, V16Avx512 b) {
    return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(x.v, threshold.v, _CMP_GT_OQ), b.v, a.v)};
  }
  // 2^n for integral n in [-126, 127].
  static V16Avx512 pow2(V16Avx512 n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(n.v), _mm512_set1_epi32(127));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
  }
  float reduce_add() const {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
};
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
struct V16Avx2 {
  __m256 lo, hi;
  static __m256i mask8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V16Avx2 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V16Avx2 bcast(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V16Avx2 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V16Avx2 load_n(const float* p, int64_t n) {
    return {_mm256_maskload_ps(p, mask8(n)), _mm256_maskload_ps(p + 8, mask8(n - 8))};
  }
  void store_n(float* p, int64_t n) const {
    _mm256_maskstore_ps(p, mask8(n), lo);
    _mm256_maskstore_ps(p + 8, mask8(n - 8), hi);
  }
  static V16Avx2 fma(V16Avx2 a, V16Avx2 b, V16Avx2 c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static V16Avx2 add(V16Avx2 a, V16Avx2 b) {
    return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
  }
  static V16Avx2 mul(V16Avx2 a, V16Avx2 b) {
    return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
  }
  static V16Avx2 div(V16Avx2 a, V16Avx2 b) {
    return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)};
  }
  static V16Avx2 floor(V16Avx2 a) { return {_mm256_floor_ps(a.lo), _mm256_floor_ps(a.hi)}; }
  static V16Avx2 gt_select(V16Avx2 x, V16Avx2 threshold, V16Avx2 a, V16Avx2 b) {
    return {_mm256_blendv_ps(b.lo, a.lo, _mm256_cmp_ps(x.lo, threshold.lo, _CMP_GT_OQ)),
            _mm256_blendv_ps(b.hi, a.hi, _mm256_cmp_ps(x.hi, threshold.hi, _CMP_GT_OQ))};
  }
  static __m256 pow2_8(__m256 n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static V16Avx2 pow2(V16Avx2 n) { return {pow2_8(n.lo), pow2_8(n.hi)}; }
  float reduce_add() const {
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
  }
};
#pragma GCC pop_options

struct V16Portable {
  float a[16];
  static V16Portable zero() { return bcast(0.0f); }
  static V16Portable bcast(float x) {
    V16Portable r;
    std::fill(r.a, r.a + 16, x);
    return r;
  }
  static V16Portable load(const float* p) { return load_n(p, 16); }
  static V16Portable load_n(const float* p, int64_t n) {
    V16Portable r = zero();
    std::copy(p, p + std::max<int64_t>(0, std::min<int64_t>(n, 16)), r.a);
    return r;
  }
  void store_n(float* p, int64_t n) const { std::copy(a, a + std::min<int64_t>(n, 16), p); }
  template <typename F>
  static V16Portable map(F f) {
    V16Portable r;
    for (int j = 0; j < 16; ++j) r.a[j] = f(j);
    return r;
  }
  static V16Portable fma(V16Portable x, V16Portable y, V16Portable z) {
    return map([&](int j) { return std::fma(x.a[j], y.a[j], z.a[j]); });
  }
  static V16Portable add(V16Portable x, V16Portable y) {
    return map([&](int j) { return x.a[j] + y.a[j]; });
  }
  static V16Portable mul(V16Portable x, V16Portable y) {
    return map([&](int j) { return x.a[j] * y.a[j]; });
  }
  static V16Portable div(V16Portable x, V16Portable y) {
    return map([&](int j) { return x.a[j] / y.a[j]; });
  }
  static V16Portable floor(V16Portable x) { return map([&](int j) { return std::floor(x.a[j]); }); }
  static V16Portable gt_select(V16Portable x, V16Portable t, V16Portable p, V16Portable q) {
    return map([&](int j) { return x.a[j] > t.a[j] ? p.a[j] : q.a[j]; });
  }
  static V16Portable pow2(V16Portable n) {
    return map([&](int j) {
      const int32_t bits = (static_cast<int32_t>(n.a[j]) + 127) << 23;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    });
  }
  float reduce_add() const {
    float s[16];
    std::copy(a, a + 16, s);
    for (int width = 8; width >= 1; width /= 2)
      for (int j = 0; j < width; ++j) s[j] = s[j] + s[j + width];
    return s[0];
  }
};

}  // namespace spec
