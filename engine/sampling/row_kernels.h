// Whole-row float kernels of the sampler (one logits row of the vocabulary's
// size per call, e.g. 262144 ids for Gemma 3). Compiled once per
// instruction-set tier (engine/cpu_isa.h, row_kernels_isa.cc) and forwarded to
// the process's tier, like engine/cpu's kernels: the sampler runs these over
// every decoded row, between two batched steps, so their speed is part of
// every token's latency. Internal to engine/sampling.
#ifndef DECODED_ENGINE_SAMPLING_ROW_KERNELS_H_
#define DECODED_ENGINE_SAMPLING_ROW_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "engine/isa_dispatch.h"

namespace decoded::sampling_internal {

struct RowMax {
  float max;     // largest non-NaN element; -inf when there is none (or n = 0)
  bool has_nan;  // some element is NaN
};

// X(return type, name, (parameters), (arguments)).
//  ScanMax:        max and NaN presence in one pass.
//  FindFirstEqual: lowest i with x[i] == v; n when there is none.
//  FindFirstAbove: lowest i with x[i] > t (NaN never is); n when none.
//  SanitizeCopy:   out[i] = isnan(x[i]) ? -inf : x[i].
//  SumExpShifted:  sum_i exp((x[i] - max) * inv_t) in double. x NaN-free,
//                  max finite and >= every x[i], inv_t > 0; exp by
//                  engine/exp_poly.h, exactly 0 below e^-87.3.
//  ExpShifted:     the same, also storing each term (as f32) in w[i].
//  Sum:            sum(w) in double.
#define DECODED_SAMPLING_ROW_KERNELS(X)                                                                   \
  X(RowMax, ScanMax, (const float* x, size_t n), (x, n))                                                  \
  X(size_t, FindFirstEqual, (const float* x, size_t n, float v), (x, n, v))                               \
  X(size_t, FindFirstAbove, (const float* x, size_t n, float t), (x, n, t))                               \
  X(void, SanitizeCopy, (const float* x, size_t n, float* out), (x, n, out))                              \
  X(double, SumExpShifted, (const float* x, size_t n, float max, float inv_t), (x, n, max, inv_t))        \
  X(double, ExpShifted, (const float* x, size_t n, float max, float inv_t, float* w), (x, n, max, inv_t, w)) \
  X(double, Sum, (const float* w, size_t n), (w, n))

DECODED_SAMPLING_ROW_KERNELS(DECODED_DECLARE_ISA_KERNEL)
DECODED_DECLARE_ISA_KERNELS(DECODED_SAMPLING_ROW_KERNELS)

}  // namespace decoded::sampling_internal

#endif  // DECODED_ENGINE_SAMPLING_ROW_KERNELS_H_
