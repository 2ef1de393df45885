// The CPU kernels of the FFN, bias and RoPE ops against their formulas
// written out independently here (papers / HF modeling code), in double.
#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/kernels.h"
#include "gtest/gtest.h"

namespace decoded::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(CpuKernelsTest, SiluMulIsSiluOfGateTimesUp) {
  const int64_t n = 5000;  // above the split threshold: two threads share it
  const std::vector<float> a = Random(n, 1), b = Random(n, 2);
  std::vector<float> out(n, -1.0f);
  for (int ith = 0; ith < 2; ++ith) SiluMul(a.data(), b.data(), out.data(), n, ith, 2);
  for (int64_t i = 0; i < n; ++i) {
    const double x = a[i];
    const double want = x * (1.0 / (1.0 + std::exp(-x))) * b[i];  // HF ACT2FN["silu"](gate) * up
    ASSERT_NEAR(out[i], want, 1e-5 * (1.0 + std::abs(want))) << i;
  }
}

TEST(CpuKernelsTest, AddRowBroadcastsTheBiasOverRows) {
  const int64_t rows = 3, cols = 7;
  const std::vector<float> x = Random(rows * cols, 3), bias = Random(cols, 4);
  std::vector<float> out(rows * cols);
  AddRow(x.data(), bias.data(), out.data(), rows, cols, 0, 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(out[r * cols + c], x[r * cols + c] + bias[c]);
  }
}

// cos/sin tables [seq, half] for positions 0..seq-1 (the driver's layout).
void Tables(int64_t seq, int32_t head_dim, double base, std::vector<float>* cos, std::vector<float>* sin) {
  const int32_t half = head_dim / 2;
  for (int64_t t = 0; t < seq; ++t) {
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * std::pow(base, -2.0 * i / head_dim);
      cos->push_back(static_cast<float>(std::cos(angle)));
      sin->push_back(static_cast<float>(std::sin(angle)));
    }
  }
}

TEST(CpuKernelsTest, RopeAdjacentRotatesNeighbouringPairsAsRoFormer) {
  const int64_t seq = 3;
  const int32_t heads = 2, hd = 8, half = hd / 2;
  std::vector<float> cos, sin;
  Tables(seq, hd, 10000.0, &cos, &sin);
  const std::vector<float> x = Random(seq * heads * hd, 5);
  std::vector<float> out(x.size());
  RopeAdjacent(x.data(), cos.data(), sin.data(), out.data(), seq, heads, hd, 0, 1);
  for (int64_t t = 0; t < seq; ++t) {
    for (int32_t h = 0; h < heads; ++h) {
      const float* xs = x.data() + (t * heads + h) * hd;
      const float* o = out.data() + (t * heads + h) * hd;
      for (int32_t i = 0; i < half; ++i) {
        const double th = static_cast<double>(t) * std::pow(10000.0, -2.0 * i / hd);
        EXPECT_NEAR(o[2 * i], xs[2 * i] * std::cos(th) - xs[2 * i + 1] * std::sin(th), 1e-5);
        EXPECT_NEAR(o[2 * i + 1], xs[2 * i] * std::sin(th) + xs[2 * i + 1] * std::cos(th), 1e-5);
      }
    }
  }
}

// HF's apply_rotary_pos_emb (rotate_half) on original rows equals adjacent
// pairing on rows permuted as llama.cpp's converter permutes Q/K for arch
// llama: permuted[2i + j] = original[j * half + i].
TEST(CpuKernelsTest, AdjacentPairingOnConverterPermutedRowsEqualsHfRotateHalf) {
  const int64_t seq = 4;
  const int32_t heads = 3, hd = 16, half = hd / 2;
  std::vector<float> cos, sin;
  Tables(seq, hd, 500.0, &cos, &sin);
  const std::vector<float> x = Random(seq * heads * hd, 6);
  std::vector<float> permuted(x.size());
  for (int64_t row = 0; row < seq * heads; ++row) {
    for (int32_t i = 0; i < half; ++i) {
      for (int32_t j = 0; j < 2; ++j) permuted[row * hd + 2 * i + j] = x[row * hd + j * half + i];
    }
  }
  std::vector<float> neox(x.size()), adjacent(x.size());
  RopeNeox(x.data(), cos.data(), sin.data(), neox.data(), seq, heads, hd, 0, 1);
  RopeAdjacent(permuted.data(), cos.data(), sin.data(), adjacent.data(), seq, heads, hd, 0, 1);
  for (int64_t row = 0; row < seq * heads; ++row) {
    const int64_t t = row / heads;
    for (int32_t d = 0; d < hd; ++d) {
      // HF: q * cos + rotate_half(q) * sin, cos/sin repeated over both halves.
      const int32_t i = d % half;
      const double th = static_cast<double>(t) * std::pow(500.0, -2.0 * i / hd);
      const double rot = d < half ? -x[row * hd + d + half] : x[row * hd + d - half];
      const double want = x[row * hd + d] * std::cos(th) + rot * std::sin(th);
      EXPECT_NEAR(neox[row * hd + d], want, 1e-5);
      EXPECT_NEAR(adjacent[row * hd + 2 * i + d / half], want, 1e-5);
    }
  }
}

}  // namespace
}  // namespace decoded::cpu
