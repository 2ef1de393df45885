// Sixteen f32 lanes with a fixed arithmetic, for kernels whose results must
// not depend on the tier's vector width or on the optimization level
// (engine/cpu/attention_isa.cc): one __m512 on the avx512vnni tier, two
// __m256 on avx2, an array on scalar.
//
// Every operation is the same lane-wise IEEE operation on every tier, and
// Fma is fused wherever the tier has FMA, written as the instruction rather
// than left to the compiler's a*b+c contraction (which GCC does at -O2 but not
// at -O1, so the -O1 sanitizer build would compute other bits than Release).
// So avx2 and avx512vnni give the same bits at any -O level; the scalar tier
// (no FMA) rounds a*b and +c separately.
//
// Internal to engine/cpu; per-tier copies (engine/isa_namespace.h).
#ifndef DECODED_ENGINE_CPU_SIMD16_H_
#define DECODED_ENGINE_CPU_SIMD16_H_

#include <algorithm>
#include <bit>
#include <cstdint>

#include "engine/isa_namespace.h"
#include "engine/quant/blocks.h"
#include "engine/quant/x86.h"

namespace decoded::cpu {
inline namespace DECODED_ISA_NS {
namespace simd {

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define DECODED_SIMD16_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define DECODED_SIMD16_AVX2 1
#endif

struct F32x16 {
#if defined(DECODED_SIMD16_AVX512)
  __m512 v;
#elif defined(DECODED_SIMD16_AVX2)
  __m256 lo, hi;  // lanes 0-7, 8-15
#else
  float v[16];
#endif
};

// The tier's vector registers, and how many of them one F32x16 takes (for
// kernels that size their register blocking; the scalar tier's figures only
// keep such arithmetic defined).
#if defined(DECODED_SIMD16_AVX512)
inline constexpr int kVectorRegisters = 32, kRegistersPerVector = 1;
#elif defined(DECODED_SIMD16_AVX2)
inline constexpr int kVectorRegisters = 16, kRegistersPerVector = 2;
#else
inline constexpr int kVectorRegisters = 32, kRegistersPerVector = 1;
#endif

#if defined(DECODED_SIMD16_AVX512)

inline F32x16 Set1(float x) { return {_mm512_set1_ps(x)}; }
inline F32x16 Load(const float* p) { return {_mm512_loadu_ps(p)}; }
// 16 IEEE halves from p, exactly as f32.
inline F32x16 LoadHalf(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// Lanes [0, n) from p (0 <= n <= 16), the rest 0; reads only those n floats.
inline F32x16 LoadFirst(const float* p, int n) {
  return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p)};
}
inline void Store(float* p, F32x16 a) { _mm512_storeu_ps(p, a.v); }
// Writes lanes [0, n) only.
inline void StoreFirst(float* p, F32x16 a, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), a.v);
}
inline F32x16 Add(F32x16 a, F32x16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F32x16 Sub(F32x16 a, F32x16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F32x16 Mul(F32x16 a, F32x16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F32x16 Max(F32x16 a, F32x16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F32x16 Min(F32x16 a, F32x16 b) { return {_mm512_min_ps(a.v, b.v)}; }
// a * b + c.
inline F32x16 Fma(F32x16 a, F32x16 b, F32x16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
// Lanes [begin, end) of a; `fill` in the others.
inline F32x16 KeepLanes(F32x16 a, int begin, int end, float fill) {
  const auto keep = static_cast<__mmask16>(((1u << end) - 1u) & ~((1u << begin) - 1u));
  return {_mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), a.v)};
}
// 2^k for lanes holding integers k in [-126, 127].
inline F32x16 Pow2(F32x16 k) {
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k.v), _mm512_set1_epi32(127)), 23);
  return {_mm512_castsi512_ps(e)};
}
// a where x >= bound, else 0.
inline F32x16 ZeroBelow(F32x16 a, F32x16 x, float bound) {
  return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(bound), _CMP_GE_OQ), a.v)};
}
inline float Lane0(F32x16 a) { return _mm512_cvtss_f32(a.v); }
// The largest lane (max is exact: no order to fix).
inline float ReduceMax(F32x16 a) {
  const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
}
// The sum of the lanes by the tree of the scalar tier below: lane l + lane
// l + 8, then + 4, + 2, + 1.
inline float ReduceSum(F32x16 a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1)));
}
// ReduceSum of 16 vectors at once, lane j of the result = ReduceSum(a[j]):
// the same tree per lane, its shuffles shared. At each level a vector
// carries twice as many keys at half the width. It runs in two parts so a
// caller can reduce keys as soon as they are computed, holding a quarter of
// the registers: ReduceSum4 takes the keys kSum4Keys[i] through the first
// two levels (lanes l + l+8, then + l+4), FinishSum16 the four results
// through the last two. The key orders put key j in lane j at the end.
struct Sum4 {
  __m512 v;  // four keys of 4 lanes
};
inline constexpr int kSum4Keys[4][4] = {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};
inline Sum4 ReduceSum4(F32x16 a, F32x16 b, F32x16 c, F32x16 d) {
  // lanes l + l+8: [a 0-7 | b 0-7], [c 0-7 | d 0-7]
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a.v, b.v, 0x44), _mm512_shuffle_f32x4(a.v, b.v, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c.v, d.v, 0x44), _mm512_shuffle_f32x4(c.v, d.v, 0xEE));
  // + l+4: [a 0-3 | b 0-3 | c 0-3 | d 0-3]
  return {_mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD))};
}
inline F32x16 FinishSum16(const Sum4 s[4]) {
  __m512 e[2];
  for (int t = 0; t < 2; ++t) {  // + l+2: eight keys of 2 lanes
    e[t] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * t].v, s[2 * t + 1].v, 0x44),
                         _mm512_shuffle_ps(s[2 * t].v, s[2 * t + 1].v, 0xEE));
  }
  // + l+1: sixteen keys of one lane
  return {_mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], 0x88), _mm512_shuffle_ps(e[0], e[1], 0xDD))};
}

#elif defined(DECODED_SIMD16_AVX2)

inline F32x16 Set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F32x16 Load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline F32x16 LoadHalf(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline __m256i FirstMask8(int n) {  // lanes [0, n) of 8, n clamped to [0, 8]
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(std::clamp(n, 0, 8)), idx);
}
inline F32x16 LoadFirst(const float* p, int n) {
  return {_mm256_maskload_ps(p, FirstMask8(n)), _mm256_maskload_ps(p + 8, FirstMask8(n - 8))};
}
inline void Store(float* p, F32x16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline void StoreFirst(float* p, F32x16 a, int n) {
  _mm256_maskstore_ps(p, FirstMask8(n), a.lo);
  _mm256_maskstore_ps(p + 8, FirstMask8(n - 8), a.hi);
}
inline F32x16 Add(F32x16 a, F32x16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F32x16 Sub(F32x16 a, F32x16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F32x16 Mul(F32x16 a, F32x16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F32x16 Max(F32x16 a, F32x16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F32x16 Min(F32x16 a, F32x16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline F32x16 Fma(F32x16 a, F32x16 b, F32x16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline F32x16 KeepLanes(F32x16 a, int begin, int end, float fill) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  auto keep = [&](__m256i lane) {  // begin <= lane < end
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(begin), lane),
                                                   _mm256_cmpgt_epi32(_mm256_set1_epi32(end), lane)));
  };
  const __m256 f = _mm256_set1_ps(fill);
  return {_mm256_blendv_ps(f, a.lo, keep(idx)),
          _mm256_blendv_ps(f, a.hi, keep(_mm256_add_epi32(idx, _mm256_set1_epi32(8))))};
}
inline F32x16 Pow2(F32x16 k) {
  auto p2 = [](__m256 x) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(x), _mm256_set1_epi32(127)), 23));
  };
  return {p2(k.lo), p2(k.hi)};
}
inline F32x16 ZeroBelow(F32x16 a, F32x16 x, float bound) {
  const __m256 b = _mm256_set1_ps(bound);
  return {_mm256_and_ps(a.lo, _mm256_cmp_ps(x.lo, b, _CMP_GE_OQ)),
          _mm256_and_ps(a.hi, _mm256_cmp_ps(x.hi, b, _CMP_GE_OQ))};
}
inline float Lane0(F32x16 a) { return _mm256_cvtss_f32(a.lo); }
inline float ReduceMax(F32x16 a) {
  const __m256 m8 = _mm256_max_ps(a.lo, a.hi);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
}
inline float ReduceSum(F32x16 a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1)));
}
// The avx512 tier's tree in 256-bit halves, its two parts split after the
// third level here (key orders chosen so key j ends in lane j).
struct Sum4 {
  __m256 v;  // four keys of 2 lanes
};
inline constexpr int kSum4Keys[4][4] = {{0, 4, 1, 5}, {2, 6, 3, 7}, {8, 12, 9, 13}, {10, 14, 11, 15}};
inline Sum4 ReduceSum4(F32x16 a, F32x16 b, F32x16 c, F32x16 d) {
  // l + l+8, then + l+4: [a 0-3 | b 0-3], [c 0-3 | d 0-3]
  const __m256 a8 = _mm256_add_ps(a.lo, a.hi), b8 = _mm256_add_ps(b.lo, b.hi);
  const __m256 c8 = _mm256_add_ps(c.lo, c.hi), d8 = _mm256_add_ps(d.lo, d.hi);
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a8, b8, 0x20), _mm256_permute2f128_ps(a8, b8, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c8, d8, 0x20), _mm256_permute2f128_ps(c8, d8, 0x31));
  // + l+2: [a 0-1 | c 0-1 | b 0-1 | d 0-1]
  return {_mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE))};
}
inline F32x16 FinishSum16(const Sum4 s[4]) {
  __m256 f[2];
  for (int t = 0; t < 2; ++t) {  // + l+1
    f[t] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * t].v, s[2 * t + 1].v, 0x88),
                         _mm256_shuffle_ps(s[2 * t].v, s[2 * t + 1].v, 0xDD));
  }
  return {f[0], f[1]};
}

#else  // scalar: plain lanes, a*b and +c rounded separately

inline F32x16 Set1(float x) {
  F32x16 r;
  std::fill(r.v, r.v + 16, x);
  return r;
}
inline F32x16 Load(const float* p) {
  F32x16 r;
  std::copy(p, p + 16, r.v);
  return r;
}
inline F32x16 LoadHalf(const uint16_t* p) {
  F32x16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = quant::internal::HalfToFloat(quant::internal::LoadU16(p + l));
  return r;
}
inline F32x16 LoadFirst(const float* p, int n) {
  F32x16 r = Set1(0.0f);
  std::copy(p, p + n, r.v);
  return r;
}
inline void Store(float* p, F32x16 a) { std::copy(a.v, a.v + 16, p); }
inline void StoreFirst(float* p, F32x16 a, int n) { std::copy(a.v, a.v + n, p); }
template <typename F>
inline F32x16 Map2(F32x16 a, F32x16 b, F f) {
  F32x16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = f(a.v[l], b.v[l]);
  return r;
}
inline F32x16 Add(F32x16 a, F32x16 b) { return Map2(a, b, [](float x, float y) { return x + y; }); }
inline F32x16 Sub(F32x16 a, F32x16 b) { return Map2(a, b, [](float x, float y) { return x - y; }); }
inline F32x16 Mul(F32x16 a, F32x16 b) { return Map2(a, b, [](float x, float y) { return x * y; }); }
// As maxps / minps: the second operand when either is NaN or both are zero.
inline F32x16 Max(F32x16 a, F32x16 b) { return Map2(a, b, [](float x, float y) { return x > y ? x : y; }); }
inline F32x16 Min(F32x16 a, F32x16 b) { return Map2(a, b, [](float x, float y) { return x < y ? x : y; }); }
inline F32x16 Fma(F32x16 a, F32x16 b, F32x16 c) {
  F32x16 r;
  for (int l = 0; l < 16; ++l) {
    const float p = a.v[l] * b.v[l];
    r.v[l] = p + c.v[l];
  }
  return r;
}
inline F32x16 KeepLanes(F32x16 a, int begin, int end, float fill) {
  for (int l = 0; l < 16; ++l) {
    if (l < begin || l >= end) a.v[l] = fill;
  }
  return a;
}
inline F32x16 Pow2(F32x16 k) {
  F32x16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = std::bit_cast<float>((static_cast<int32_t>(k.v[l]) + 127) << 23);
  return r;
}
inline F32x16 ZeroBelow(F32x16 a, F32x16 x, float bound) {
  for (int l = 0; l < 16; ++l) {
    if (!(x.v[l] >= bound)) a.v[l] = 0.0f;
  }
  return a;
}
inline float Lane0(F32x16 a) { return a.v[0]; }
inline float ReduceMax(F32x16 a) {
  float m = a.v[0];
  for (int l = 1; l < 16; ++l) m = a.v[l] > m ? a.v[l] : m;
  return m;
}
inline float ReduceSum(F32x16 a) {
  for (int w = 8; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) a.v[l] += a.v[l + w];
  }
  return a.v[0];
}
// Each key's ReduceSum, in the avx512 tier's key order.
struct Sum4 {
  float v[4];
};
inline constexpr int kSum4Keys[4][4] = {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};
inline Sum4 ReduceSum4(F32x16 a, F32x16 b, F32x16 c, F32x16 d) {
  return {{ReduceSum(a), ReduceSum(b), ReduceSum(c), ReduceSum(d)}};
}
inline F32x16 FinishSum16(const Sum4 s[4]) {
  F32x16 r;
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 4; ++k) r.v[kSum4Keys[i][k]] = s[i].v[k];
  }
  return r;
}

#endif

// exp(x) for x <= 0 as engine/exp_poly.h's ExpNonPositive (Cephes expf's
// reduction and degree-6 polynomial; relative error < 2e-7 on [-87, 0],
// exactly 0 below -87.3 and for -inf), written once in this file's
// operations so every tier with FMA computes the same bits.
// Always inlined: GCC stopped inlining it into a grown attention kernel,
// and a call per vector and tile measured some 20% slower there.
[[gnu::always_inline]] inline F32x16 ExpNonPositive(F32x16 x) {
  const F32x16 xc = Min(Max(x, Set1(-87.3f)), Set1(0.0f));
  const F32x16 round = Set1(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const F32x16 k = Sub(Fma(xc, Set1(1.44269504088896341f), round), round);
  F32x16 r = Fma(k, Set1(-0.693359375f), xc);
  r = Fma(k, Set1(2.12194440e-4f), r);
  F32x16 p = Set1(1.9875691500e-4f);
  p = Fma(p, r, Set1(1.3981999507e-3f));
  p = Fma(p, r, Set1(8.3334519073e-3f));
  p = Fma(p, r, Set1(4.1665795894e-2f));
  p = Fma(p, r, Set1(1.6666665459e-1f));
  p = Fma(p, r, Set1(5.0000001201e-1f));
  const F32x16 y = Add(Fma(p, Mul(r, r), r), Set1(1.0f));
  return ZeroBelow(Mul(y, Pow2(k)), x, -87.3f);
}

}  // namespace simd
}  // namespace DECODED_ISA_NS
}  // namespace decoded::cpu

#endif  // DECODED_ENGINE_CPU_SIMD16_H_
