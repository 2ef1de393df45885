// F32 / F16 / BF16 weights times F32 activations: widen the weight to f32 and
// accumulate f32 FMAs (ggml's f32 dot; ggml converts the activation to the
// weight type instead, so results agree to f32 rounding, not bit for bit).
#include <cstring>


#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"
#include "engine/quant/prefetch.h"
#include "engine/quant/x86.h"
#include "engine/quant/quant.h"

namespace decoded::quant::internal::DECODED_ISA_NS {
namespace {

struct F32W {
  static float Scalar(const uint8_t* p, int64_t i) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
#if defined(__AVX512F__)
  static __m512 Load16(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static constexpr int kBytes = 4;
#elif defined(__AVX2__)
  static __m256 Load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static constexpr int kBytes = 4;
#endif
};

struct F16W {
  static float Scalar(const uint8_t* p, int64_t i) { return HalfToFloat(LoadU16(p + 2 * i)); }
#if defined(__AVX512F__)
  static __m512 Load16(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
  static constexpr int kBytes = 2;
#elif defined(__AVX2__)
  static __m256 Load8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static constexpr int kBytes = 2;
#endif
};

struct BF16W {
  static float Scalar(const uint8_t* p, int64_t i) { return BF16ToF32(LoadU16(p + 2 * i)); }
#if defined(__AVX512F__)
  static __m512 Load16(const uint8_t* p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
  static constexpr int kBytes = 2;
#elif defined(__AVX2__)
  static __m256 Load8(const uint8_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static constexpr int kBytes = 2;
#endif
};

template <typename W>
float Dot(const uint8_t* w, const float* x, int64_t k) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    acc0 = _mm512_fmadd_ps(W::Load16(w + i * W::kBytes, 0xFFFF), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(W::Load16(w + (i + 16) * W::kBytes, 0xFFFF), _mm512_loadu_ps(x + i + 16), acc1);
  }
  for (; i < k; i += 16) {
    const __mmask16 m = k - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (k - i)) - 1);
    acc0 = _mm512_fmadd_ps(W::Load16(w + i * W::kBytes, m), _mm512_maskz_loadu_ps(m, x + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    acc0 = _mm256_fmadd_ps(W::Load8(w + i * W::kBytes), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(W::Load8(w + (i + 8) * W::kBytes), _mm256_loadu_ps(x + i + 8), acc1);
  }
  const __m256 v = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float sum = _mm_cvtss_f32(s);
  for (; i < k; ++i) sum += W::Scalar(w, i) * x[i];
  return sum;
#else
  float sum = 0.0f;
  for (int64_t i = 0; i < k; ++i) sum += W::Scalar(w, i) * x[i];
  return sum;
#endif
}

template <typename W>
void MatMulImpl(DECODED_QUANT_MATMUL_ARGS) {
  for (int64_t r = r0; r < r1; ++r) {
    PrefetchAhead(w + r * w_row_bytes, w_row_bytes);
    for (int64_t i = 0; i < m; ++i) {
      y[i * ldy + r] = Dot<W>(w + r * w_row_bytes, reinterpret_cast<const float*>(xq + i * xq_row_bytes), k);
    }
  }
}

}  // namespace

void MatMulF32(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<F32W>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulF16(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<F16W>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }
void MatMulBF16(DECODED_QUANT_MATMUL_ARGS) { MatMulImpl<BF16W>(w, w_row_bytes, k, xq, xq_row_bytes, m, y, ldy, r0, r1); }

}  // namespace decoded::quant::internal::DECODED_ISA_NS
