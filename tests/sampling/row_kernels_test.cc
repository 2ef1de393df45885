// The sampler's row kernels (engine/sampling/row_kernels.h) on every tier
// this CPU supports, against plain loops (double-precision std::exp for the
// softmax sums). Lengths cover empty rows, tails shorter than a vector, and
// hits in every part of the find kernels' blocks and in their tails.
#include "engine/sampling/row_kernels.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/per_cpu_isa.h"

namespace decoded::sampling_internal {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr size_t kLengths[] = {0, 1, 15, 16, 17, 127, 128, 129, 1000, 1024, 4111, 262144};

std::vector<float> Logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(-3.0f, 4.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

class RowKernels : public testing::PerCpuIsaTest {};
DECODED_INSTANTIATE_PER_CPU_ISA(RowKernels);

TEST_P(RowKernels, ScanMaxFindsTheLargestNonNanAndReportsNan) {
  for (size_t n : kLengths) {
    std::vector<float> x = Logits(n, 1);
    float want = -kInf;
    for (float v : x) want = std::max(want, v);
    RowMax r = ScanMax(x.data(), n);
    EXPECT_EQ(r.max, want) << n;
    EXPECT_FALSE(r.has_nan) << n;
    if (n == 0) continue;
    // A NaN anywhere (vector body or tail) is reported and never the max.
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      std::vector<float> y = x;
      y[at] = kNan;
      float m = -kInf;
      for (float v : y) m = std::isnan(v) ? m : std::max(m, v);
      r = ScanMax(y.data(), n);
      EXPECT_TRUE(r.has_nan) << n << " at " << at;
      EXPECT_EQ(r.max, m) << n << " at " << at;
    }
  }
  const std::vector<float> all_nan(40, kNan);
  EXPECT_EQ(ScanMax(all_nan.data(), all_nan.size()).max, -kInf);
  EXPECT_EQ(ScanMax(nullptr, 0).max, -kInf);
}

TEST_P(RowKernels, FindKernelsReturnTheLowestHitOrN) {
  for (size_t n : kLengths) {
    const std::vector<float> base(n, 1.0f);
    EXPECT_EQ(FindFirstEqual(base.data(), n, 2.0f), n);
    EXPECT_EQ(FindFirstAbove(base.data(), n, 1.0f), n);
    for (size_t at = 0; at < n; at += (n > 300 ? 97 : 1)) {
      std::vector<float> x = base;
      x[at] = 2.0f;
      if (at + 5 < n) x[at + 5] = 2.0f;  // a later hit does not win
      EXPECT_EQ(FindFirstEqual(x.data(), n, 2.0f), at) << n;
      EXPECT_EQ(FindFirstAbove(x.data(), n, 1.5f), at) << n;
    }
  }
  // NaN is never above anything.
  std::vector<float> x(300, 0.0f);
  x[3] = kNan;
  x[200] = 5.0f;
  EXPECT_EQ(FindFirstAbove(x.data(), x.size(), 1.0f), 200u);
  EXPECT_EQ(FindFirstAbove(x.data(), x.size(), -kInf), 0u);
}

TEST_P(RowKernels, SanitizeCopyTurnsNanIntoMinusInfinity) {
  std::vector<float> x = Logits(37, 2);
  x[0] = kNan;
  x[36] = kNan;
  x[20] = kInf;
  std::vector<float> out(37);
  SanitizeCopy(x.data(), x.size(), out.data());
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_EQ(out[i], -kInf);
    } else {
      EXPECT_EQ(out[i], x[i]);
    }
  }
}

TEST_P(RowKernels, ExpSumsMatchDoubleReference) {
  for (size_t n : kLengths) {
    if (n == 0) continue;
    std::vector<float> x = Logits(n, 3);
    if (n > 2) x[n / 3] = -kInf;  // contributes exactly 0 (not the max)
    float max = -kInf;
    for (float v : x) max = std::max(max, v);
    for (float inv_t : {1.0f, 1.25f, 0.5f}) {
      // The kernels round the argument to f32 first (as the sampler defines
      // the term); the claim under test is exp's accuracy from there on.
      auto term = [&](float v) { return std::exp(static_cast<double>((v - max) * inv_t)); };
      double want = 0.0;
      for (float v : x) want += term(v);
      const double sum = SumExpShifted(x.data(), n, max, inv_t);
      EXPECT_NEAR(sum, want, want * 1e-6) << n;
      std::vector<float> w(n, -1.0f);
      EXPECT_EQ(ExpShifted(x.data(), n, max, inv_t, w.data()), sum) << n << ": one definition of the terms";
      for (size_t i = 0; i < n; ++i) {
        const double e = term(x[i]);
        ASSERT_NEAR(w[i], e, 2e-7 * e + 1e-37) << n << " at " << i;
      }
      EXPECT_EQ(Sum(w.data(), n), sum) << n << ": same order as the fused sum";
    }
  }
}

}  // namespace
}  // namespace decoded::sampling_internal
