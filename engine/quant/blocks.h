// GGUF block layouts (ggml-common.h) and fp16 helpers shared by the quant
// kernels. Internal to engine/quant.
//
// Every block is a packed little-endian byte record; fields are read through
// these structs, which have no padding (static_asserts below). Element order
// inside a block, per type (q = stored unsigned code):
//   Q4_0 (18 B): d f16, qs[16]; x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8).
//   Q4_1 (20 B): d f16, m f16, qs[16]; x[j] = d*(qs[j]&15) + m,
//                x[j+16] = d*(qs[j]>>4) + m (m is the block minimum).
//   Q5_0 (22 B): d f16, qh u32, qs[16]; high bit of element j is bit j of qh,
//                x = d*((nibble | hbit<<4) - 16).
//   Q5_1 (24 B): d f16, m f16, qh u32, qs[16]; codes as Q5_0's,
//                x = d*(nibble | hbit<<4) + m.
//   Q8_0 (34 B): d f16, qs int8[32]; x[j] = d*qs[j].
//   Q4_K (144 B): d f16, dmin f16, scales[12] (8 packed 6-bit (sc, m) pairs),
//                 qs[128]; 64-element chunk c reads qs[32c..32c+31]: low
//                 nibbles are sub-block 2c, high nibbles sub-block 2c+1;
//                 x = d*sc*q - dmin*m.
//   Q5_K (176 B): as Q4_K plus qh[32] before qs; element l of sub-block s has
//                 high bit (qh[l] >> s) & 1.
//   Q6_K (210 B): ql[128], qh[64], scales int8[16], d f16; element
//                 128h + 32t + l (h<2, t<4, l<32) has low 4 bits from
//                 ql[64h + 32(t&1) + l] (low nibble for t<2, high for t>=2)
//                 and high 2 bits (qh[32h + l] >> 2t) & 3; x = d*sc[e/16]*(q-32).
//   Q8_K (292 B): d f32, qs int8[256], bsums int16[16] (sums of 16 qs each).
#ifndef DECODED_ENGINE_QUANT_BLOCKS_H_
#define DECODED_ENGINE_QUANT_BLOCKS_H_

#include <cstdint>
#include <cstring>

#include "engine/isa_namespace.h"
#include "engine/quant/x86.h"

namespace decoded::quant::internal {

inline namespace DECODED_ISA_NS {}

inline constexpr int kQK = 32;    // elements per Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 block
inline constexpr int kQKK = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

// The helpers below are compiled into every tier's kernels and into baseline
// code: one symbol per tier (engine/isa_namespace.h).
inline namespace DECODED_ISA_NS {

// Blocks are not naturally aligned inside a row (18/20/22/24/34-byte records), so
// multi-byte fields are read with memcpy.
inline uint32_t LoadU32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t LoadU16(const void* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN).
inline float HalfToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise into a binary32 normal.
    int e = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block
// (ggml's get_scale_min_k4 layout: j<4 in the low 6 bits of bytes j / j+4;
// j>=4 split between a nibble of bytes 8..11 and the top 2 bits of 0..7).
inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// binary32 -> binary16, round to nearest even, overflow to inf, NaN to a
// quiet NaN (F16C's vcvtps2ph with imm 0, where the tier has F16C).
inline uint16_t FloatToHalf(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // |f| < 2^-14: adding 0.5 puts the half-subnormal ulp (2^-24) at the
    // float ulp of 0.5, so the FPU's RNE does the rounding.
    float a;
    std::memcpy(&a, &x, 4);
    a += 0.5f;
    uint32_t ab;
    std::memcpy(&ab, &a, 4);
    return sign | static_cast<uint16_t>(ab - 0x3F000000u);
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xC8000FFFu + odd;  // rebias exponent 127 -> 15 and round half to even
  return sign | static_cast<uint16_t>(x >> 13);
#endif
}

}  // inline namespace DECODED_ISA_NS

}  // namespace decoded::quant::internal

#endif  // DECODED_ENGINE_QUANT_BLOCKS_H_
