// fp16 / bf16 scalar conversions (quant.h).
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/quant.h"

namespace decoded::quant {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

float F16ToF32(uint16_t h) { return internal::HalfToFloat(h); }

uint16_t F32ToF16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  // Round-to-nearest-even with overflow to inf, quiet NaN, subnormal halves.
  uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // |f| < 2^-14: adding 0.5 puts the half-subnormal ulp (2^-24) at the
    // float ulp of 0.5, so the FPU's RNE does the rounding.
    const float a = FromBits(x) + 0.5f;
    return sign | static_cast<uint16_t>(Bits(a) - 0x3F000000u);
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xC8000FFFu + odd;  // rebias exponent 127 -> 15 and round half to even
  return sign | static_cast<uint16_t>(x >> 13);
#endif
}

float BF16ToF32(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToBF16(float f) {
  uint32_t x = Bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace decoded::quant
