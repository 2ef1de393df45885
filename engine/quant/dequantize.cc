// DequantizeRow (quant.h): plain scalar decoding of every supported block
// format. It is the reference the SIMD dot products are tested against, so it
// follows the layout comments in blocks.h literally and stays unvectorised.
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/quant/blocks.h"
#include "engine/quant/quant.h"

namespace decoded::quant {
namespace {

using namespace internal;  // NOLINT: block structs

void DequantQ4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>((b[i].qs[j] & 0xF) - 8);
      y[j + 16] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

// d * q is exact in f32 (an 11-bit fp16 significand times a code below 32),
// so y = d*q + m is one rounding whether or not the compiler fuses it: the
// bits of gguf-py's (d * q) + m.
void DequantQ4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = HalfToFloat(b[i].d);
    const float m = HalfToFloat(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(b[i].qs[j] & 0xF) + m;
      y[j + 16] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}

void DequantQ5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = HalfToFloat(b[i].d);
    const float m = HalfToFloat(b[i].m);
    const uint32_t qh = LoadU32(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(lo) + m;
      y[j + 16] = d * static_cast<float>(hi) + m;
    }
  }
}

void DequantQ5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = HalfToFloat(b[i].d);
    const uint32_t qh = LoadU32(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = d * static_cast<float>(lo - 16);
      y[j + 16] = d * static_cast<float>(hi - 16);
    }
  }
}

void DequantQ8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

// Q4_K and Q5_K share their layout but for Q5_K's fifth bit (qh).
template <bool kHasHigh, typename Block>
void DequantQ45K(const Block* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d);
    const float dmin = HalfToFloat(b[i].dmin);
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = b[i].qs + 32 * c;
      uint8_t sc0, m0, sc1, m1;
      ScaleMinK4(2 * c, b[i].scales, &sc0, &m0);
      ScaleMinK4(2 * c + 1, b[i].scales, &sc1, &m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        int v = q[l] & 0xF;
        if constexpr (kHasHigh) v |= ((b[i].qh[l] >> (2 * c)) & 1) << 4;
        y[l] = d0 * static_cast<float>(v) - mm0;
      }
      for (int l = 0; l < 32; ++l) {
        int v = q[l] >> 4;
        if constexpr (kHasHigh) v |= ((b[i].qh[l] >> (2 * c + 1)) & 1) << 4;
        y[32 + l] = d1 * static_cast<float>(v) - mm1;
      }
      y += 64;
    }
  }
}

void DequantQ4_K(const BlockQ4_K* b, float* y, int64_t nb) { DequantQ45K<false>(b, y, nb); }
void DequantQ5_K(const BlockQ5_K* b, float* y, int64_t nb) { DequantQ45K<true>(b, y, nb); }

void DequantQ6_K(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      for (int t = 0; t < 4; ++t) {
        for (int l = 0; l < 32; ++l) {
          const uint8_t lowbyte = ql[32 * (t & 1) + l];
          const int low = t < 2 ? (lowbyte & 0xF) : (lowbyte >> 4);
          const int q = (low | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
          const int e = 128 * h + 32 * t + l;
          y[e] = d * static_cast<float>(b[i].scales[e / 16]) * static_cast<float>(q);
        }
      }
    }
    y += kQKK;
  }
}

void DequantQ8_K(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    for (int j = 0; j < kQKK; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}

}  // namespace

void DequantizeRow(DType t, const void* src, float* dst, int64_t k) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, p, static_cast<size_t>(k) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = F16ToF32(LoadU16(p + 2 * i));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = BF16ToF32(LoadU16(p + 2 * i));
      return;
    case DType::kQ4_0:
      return DequantQ4_0(reinterpret_cast<const BlockQ4_0*>(p), dst, k / kQK);
    case DType::kQ4_1:
      return DequantQ4_1(reinterpret_cast<const BlockQ4_1*>(p), dst, k / kQK);
    case DType::kQ5_0:
      return DequantQ5_0(reinterpret_cast<const BlockQ5_0*>(p), dst, k / kQK);
    case DType::kQ5_1:
      return DequantQ5_1(reinterpret_cast<const BlockQ5_1*>(p), dst, k / kQK);
    case DType::kQ8_0:
      return DequantQ8_0(reinterpret_cast<const BlockQ8_0*>(p), dst, k / kQK);
    case DType::kQ4_K:
      return DequantQ4_K(reinterpret_cast<const BlockQ4_K*>(p), dst, k / kQKK);
    case DType::kQ5_K:
      return DequantQ5_K(reinterpret_cast<const BlockQ5_K*>(p), dst, k / kQKK);
    case DType::kQ6_K:
      return DequantQ6_K(reinterpret_cast<const BlockQ6_K*>(p), dst, k / kQKK);
    case DType::kQ8_K:
      return DequantQ8_K(reinterpret_cast<const BlockQ8_K*>(p), dst, k / kQKK);
    default:
      for (int64_t i = 0; i < k; ++i) dst[i] = std::numeric_limits<float>::quiet_NaN();
      return;
  }
}

}  // namespace decoded::quant
