// Activation quantizers, numerically those of ggml's reference quantizers:
//   Q8_0: d = amax/127 (stored fp16), id = 1/d, q = round-half-away(x*id)
//         (quantize_row_q8_0_ref; llama.cpp's AVX path rounds half to even,
//         which differs only when x*id is exactly k+0.5).
//   Q8_K: max = the signed element of largest |x| (first one on ties),
//         iscale = -127/max, q = min(127, round-half-even(iscale*x)),
//         d = 1/iscale (float, negative when max > 0), bsums = sums of 16 q
//         (quantize_row_q8_K_ref).
#include <cmath>
#include <cstring>


#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"
#include "engine/quant/x86.h"
#include "engine/quant/quant.h"

namespace decoded::quant::internal::DECODED_ISA_NS {
namespace {

// ggml's nearest_int: round half to even, via the FPU's default mode.
inline int NearestInt(float v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

void QuantizeRowQ8_0(const float* x, int64_t k, void* out) {
  auto* b = static_cast<BlockQ8_0*>(out);
  const int64_t nb = k / kQK;
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 v0 = _mm512_loadu_ps(x);
    const __m512 v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = FloatToHalf(d);
    const __m512 vid = _mm512_set1_ps(id);
    // Round half away from zero exactly: floor(a) + floor(2*(a - floor(a)))
    // on a = |v|; every step is exact in f32.
    auto round_away = [](__m512 v) {
      const __m512 a = _mm512_abs_ps(v);
      const __m512 fl = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
      const __m512 frac2 = _mm512_add_ps(_mm512_sub_ps(a, fl), _mm512_sub_ps(a, fl));
      const __m512 r = _mm512_add_ps(fl, _mm512_roundscale_ps(frac2, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
      const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
      return _mm512_cvttps_epi32(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign)));
    };
    const __m512i q0 = round_away(_mm512_mul_ps(v0, vid));
    const __m512i q1 = round_away(_mm512_mul_ps(v1, vid));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
#else
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = FloatToHalf(d);
    for (int j = 0; j < kQK; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
#endif
  }
}

void QuantizeRowQ8_K(const float* x, int64_t k, void* out) {
  auto* b = static_cast<BlockQ8_K*>(out);
  const int64_t nb = k / kQKK;
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQKK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    // cvtps_epi32 rounds with MXCSR's default round-half-even, as NearestInt.
    const __m512 vs = _mm512_set1_ps(iscale);
    const __m512i v127 = _mm512_set1_epi32(127);
    for (int g = 0; g < kQKK / 16; ++g) {
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * g), vs)), v127);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16 * g), _mm512_cvtsepi32_epi8(q));
      b[i].bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
#else
    for (int j = 0; j < kQKK; ++j) {
      const int v = NearestInt(iscale * x[j]);
      b[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQKK / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b[i].qs[16 * g + l];
      b[i].bsums[g] = static_cast<int16_t>(sum);
    }
#endif
    b[i].d = 1.0f / iscale;
  }
}

}  // namespace decoded::quant::internal::DECODED_ISA_NS
