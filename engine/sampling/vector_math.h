// Float kernels the sampler runs over a whole logits row each token, written
// so that GCC/Clang vectorise them at -O3 without -ffast-math (fixed-width
// partial accumulators instead of one serial reduction).
#ifndef DECODED_ENGINE_SAMPLING_VECTOR_MATH_H_
#define DECODED_ENGINE_SAMPLING_VECTOR_MATH_H_

#include <cstddef>
#include <cstdint>
#include <limits>

#include "engine/exp_poly.h"

namespace decoded::sampling_internal {

// exp(x) for x <= 0 (or -inf): relative error < 2e-7 on [-87, 0], exactly 0
// below -87.3 (where the true value is < 1.2e-38 and irrelevant to a softmax).
// Method: engine/exp_poly.h (Cephes expf).
inline float ExpNonPositive(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 0.0f ? 0.0f : x);
  return x < -87.3f ? 0.0f : ExpPoly(xc);
}

// Largest element; -inf for an empty row. Input must not contain NaN.
inline float Max(const float* x, size_t n) {
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  for (size_t j = 0; j < kLanes; ++j) lane[j] = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = lane[j] > x[i + j] ? lane[j] : x[i + j];
  }
  float m = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < kLanes; ++j) m = m > lane[j] ? m : lane[j];
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}

// sum(w) accumulated in double.
inline double Sum(const float* w, size_t n) {
  constexpr size_t kLanes = 8;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] += w[i + j];
  }
  double s = 0.0;
  for (size_t j = 0; j < kLanes; ++j) s += lane[j];
  for (; i < n; ++i) s += w[i];
  return s;
}

// w[i] = exp((x[i] - max) * inv_t); returns sum(w) in double. max must be
// finite and >= every x[i]; inv_t > 0.
inline double ExpShiftedSum(const float* x, size_t n, float max, float inv_t, float* w) {
  for (size_t i = 0; i < n; ++i) w[i] = ExpNonPositive((x[i] - max) * inv_t);
  return Sum(w, n);
}

}  // namespace decoded::sampling_internal

#endif  // DECODED_ENGINE_SAMPLING_VECTOR_MATH_H_
