// exp(x) without libm, branch-free so loops over it vectorize: Cephes expf
// (S. Moshier): x = k ln2 + r with |r| <= ln2/2 (ln2 split in two), exp(r) by
// a degree-6 minimax polynomial, 2^k from exponent bits; relative error a few
// ulp. Shared by the f32 kernels (GELU's tanh) and the sampler's row kernels
// (softmax), both per tier; each caller clamps x to its own range first.
#ifndef DECODED_ENGINE_EXP_POLY_H_
#define DECODED_ENGINE_EXP_POLY_H_

#include <bit>
#include <cstdint>

#include "engine/isa_namespace.h"

namespace decoded {
// Per-tier copies (engine/isa_namespace.h): this is inlined into kernel tiers.
inline namespace DECODED_ISA_NS {

// Precondition: -87.3 <= x <= 88 (2^k then stays a normal float).
inline float ExpPoly(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float k = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
}

// exp(x) for softmax terms x = (logit - max) / T <= 0: relative error < 2e-7
// on [-87, 0], exactly 0 below -87.3 (where the true value is < 1.2e-38 and
// irrelevant to a softmax) and for -inf. Branch-free, so loops vectorize.
inline float ExpNonPositive(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 0.0f ? 0.0f : x);
  return x < -87.3f ? 0.0f : ExpPoly(xc);
}

}  // namespace DECODED_ISA_NS
}  // namespace decoded

#endif  // DECODED_ENGINE_EXP_POLY_H_
