// The sampler's row kernels (row_kernels.h), compiled once per tier. The
// reductions are written with GCC's generic vector types (16 floats), which
// each tier's -march lowers to its own registers (one zmm, two ymm, four xmm):
// the auto-vectorizer leaves max/NaN and find-first loops scalar. Element-wise
// exp is a plain loop over a small buffer, which it does vectorize. No
// -ffast-math: every result is the one the written order defines.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/exp_poly.h"
#include "engine/sampling/row_kernels.h"

// The 16-float vector type is wider than the scalar and avx2 tiers' registers;
// GCC warns that passing it by value would differ in ABI between -march
// levels. It never crosses a call boundary here (every helper taking or
// returning one is inline in this file).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace decoded::sampling_internal::DECODED_ISA_NS {
namespace {

constexpr size_t kLanes = 16;
using F16 = float __attribute__((vector_size(kLanes * sizeof(float))));
using I16 = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));
using F8 = float __attribute__((vector_size(8 * sizeof(float))));
using D8 = double __attribute__((vector_size(8 * sizeof(double))));

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Elements per block of the find kernels: compares are OR-ed over a block
// and folded to one flag once per block.
constexpr size_t kFindBlock = 8 * kLanes;
// Elements per buffer of exp terms (stack, L1-resident).
constexpr size_t kExpChunk = 1024;

inline F16 Load(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline F16 Splat(float s) { return F16{} + s; }

inline bool Any(I16 m) {
  int32_t lanes[kLanes];
  std::memcpy(lanes, &m, sizeof(lanes));
  int32_t any = 0;
  for (int32_t l : lanes) any |= l;
  return any != 0;
}

// First i in [0, n) with hit(x[i], v); n when none. `hit` is a generic
// comparison, applied to 16-float vectors (OR-ed over a block of
// kFindBlock elements, folded to one flag per block) and then to the floats
// of the block that has one.
template <typename Hit>
size_t FindFirst(const float* x, size_t n, float v, Hit hit) {
  const F16 s = Splat(v);
  auto block_hit = [&](const float* p) {
    I16 m{};
    for (size_t j = 0; j < kFindBlock; j += kLanes) m |= hit(Load(p + j), s);
    return Any(m);
  };
  size_t i = 0;
  while (i + kFindBlock <= n && !block_hit(x + i)) i += kFindBlock;
  for (; i < n; ++i) {
    if (hit(x[i], v)) return i;
  }
  return n;
}

// Adds w[0, n) to the 16 double lanes: lane j takes w[j], w[j + 16], ...
inline void AccumulateDouble(const float* w, size_t n, D8* lo, D8* hi) {
  for (size_t i = 0; i < n; i += kLanes) {
    F8 a, b;
    std::memcpy(&a, w + i, sizeof(a));
    std::memcpy(&b, w + i + 8, sizeof(b));
    *lo += __builtin_convertvector(a, D8);
    *hi += __builtin_convertvector(b, D8);
  }
}

inline double FoldDouble(D8 lo, D8 hi) {
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lo[j];
  for (int j = 0; j < 8; ++j) s += hi[j];
  return s;
}

// exp((x - max) * inv_t) of n <= kExpChunk elements into w (vectorized).
inline void ExpTerms(const float* x, size_t n, float max, float inv_t, float* w) {
  for (size_t j = 0; j < n; ++j) w[j] = ExpNonPositive((x[j] - max) * inv_t);
}

// Sum of w[0, n) in double: 16 lanes over the whole multiple of 16, then the
// lanes, then the tail, in that order.
double SumTermsInChunks(const float* x, size_t n, float max, float inv_t, float* w, bool keep) {
  D8 lo{}, hi{};
  float buffer[kExpChunk];
  const size_t whole = n - n % kLanes;
  for (size_t i = 0; i < whole; i += kExpChunk) {
    const size_t len = std::min(kExpChunk, whole - i);
    float* out = keep ? w + i : buffer;
    ExpTerms(x + i, len, max, inv_t, out);
    AccumulateDouble(out, len, &lo, &hi);
  }
  double s = FoldDouble(lo, hi);
  for (size_t i = whole; i < n; ++i) {
    const float e = ExpNonPositive((x[i] - max) * inv_t);
    if (keep) w[i] = e;
    s += e;
  }
  return s;
}

}  // namespace

RowMax ScanMax(const float* x, size_t n) {
  F16 mx = Splat(kNegInf);
  I16 nan{};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const F16 v = Load(x + i);
    mx = v > mx ? v : mx;  // a NaN v compares false: ignored
    nan |= v != v;
  }
  RowMax r{kNegInf, Any(nan)};
  for (size_t j = 0; j < kLanes; ++j) r.max = mx[j] > r.max ? mx[j] : r.max;
  for (; i < n; ++i) {
    r.max = x[i] > r.max ? x[i] : r.max;
    r.has_nan |= std::isnan(x[i]);
  }
  return r;
}

size_t FindFirstEqual(const float* x, size_t n, float v) {
  return FindFirst(x, n, v, [](auto a, auto b) { return a == b; });
}

size_t FindFirstAbove(const float* x, size_t n, float t) {
  return FindFirst(x, n, t, [](auto a, auto b) { return a > b; });
}

void SanitizeCopy(const float* x, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = x[i] != x[i] ? kNegInf : x[i];
}

double SumExpShifted(const float* x, size_t n, float max, float inv_t) {
  return SumTermsInChunks(x, n, max, inv_t, nullptr, false);
}

double ExpShifted(const float* x, size_t n, float max, float inv_t, float* w) {
  return SumTermsInChunks(x, n, max, inv_t, w, true);
}

double Sum(const float* w, size_t n) {
  D8 lo{}, hi{};
  const size_t whole = n - n % kLanes;
  AccumulateDouble(w, whole, &lo, &hi);
  double s = FoldDouble(lo, hi);
  for (size_t i = whole; i < n; ++i) s += w[i];
  return s;
}

}  // namespace decoded::sampling_internal::DECODED_ISA_NS
