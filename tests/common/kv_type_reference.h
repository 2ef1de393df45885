// Independent definitions of the KV cache's element types for tests
// (engine/kv_layout.h): IEEE binary16 and GGML's Q8_0 (GGUF spec) decoded by
// their definitions, and the nearest binary16 found by search, not with the
// engine's conversion helpers.
#ifndef DECODED_TESTS_COMMON_KV_TYPE_REFERENCE_H_
#define DECODED_TESTS_COMMON_KV_TYPE_REFERENCE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace decoded::testing {

// IEEE binary16 by its definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals
// 2^-14 m/1024.
inline double HalfValue(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s != 0 ? -v : v;
}

// The nearest binary16 to x, ties to the even code: binary search over the
// finite magnitudes, whose values grow with their codes.
inline uint16_t NearestHalf(float x) {
  const double a = std::fabs(static_cast<double>(x));
  uint32_t lo = 0, hi = 0x7BFF;  // the largest code whose value is <= a lies in [lo, hi]
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (HalfValue(static_cast<uint16_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  uint32_t best = lo;
  if (lo < 0x7BFF) {
    const double below = a - HalfValue(static_cast<uint16_t>(lo)), above = HalfValue(static_cast<uint16_t>(lo + 1)) - a;
    if (above < below || (above == below && (lo & 1) != 0)) best = lo + 1;
  }
  return static_cast<uint16_t>(best | (std::signbit(x) ? 0x8000u : 0u));
}

// A Q8_0 row decoded by its definition (GGUF spec): per 34-byte block, x = d q.
inline std::vector<double> DecodeQ8_0(const uint8_t* row, int32_t n) {
  std::vector<double> out;
  for (int32_t b = 0; b < n / 32; ++b) {
    uint16_t d;
    std::memcpy(&d, row + 34 * b, 2);
    for (int32_t j = 0; j < 32; ++j) out.push_back(HalfValue(d) * static_cast<int8_t>(row[34 * b + 2 + j]));
  }
  return out;
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_KV_TYPE_REFERENCE_H_
