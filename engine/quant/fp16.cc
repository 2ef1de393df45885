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

uint16_t F32ToF16(float f) { return internal::FloatToHalf(f); }

float BF16ToF32(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToBF16(float f) {
  uint32_t x = Bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace decoded::quant
