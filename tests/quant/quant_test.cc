// Tests of engine/quant against independent references:
//  - MatMul vs a plain double-precision dot of DequantizeRow(weight row) and
//    DequantizeRow(converted activation), on random blocks of every type;
//  - DequantizeRow vs the Python gguf package (tests/data/quant_reference.json,
//    written by tools/gen_quant_reference.py from the real model's rows);
//  - QuantizeActivationRow vs gguf's Q8_0 quantizer (fixture) and vs the Q8_K
//    formula of ggml's quantize_row_q8_K_ref, written out plainly below;
//  - MatMul of Q4_1 / Q5_1 (real SmolLM2 rows and gguf-quantized ones) vs
//    the float64 dot of gguf's dequantized weight and activation rows
//    (fixture "matmul");
//  - a kernel fed a weight with one block's scale moved to the neighbour
//    block, or (Q4_1 / Q5_1) with its mins dropped, fails the MatMul
//    comparison, so the tolerance can catch such bugs.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "engine/quant/quant.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"
#include "tests/common/per_cpu_isa.h"

namespace decoded::quant {
namespace {

using Bytes = std::vector<uint8_t>;

size_t RowBytesOf(DType t, int64_t k) { return *RowBytes(t, k); }

void PutHalf(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// Random weight rows with finite, realistically scaled block scales (random
// code bytes cover every bit pattern of the quantized fields).
Bytes RandomWeights(DType t, int64_t rows, int64_t k, std::mt19937& rng) {
  const size_t rb = RowBytesOf(t, k);
  Bytes w(rb * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(1e-3f, 2e-2f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  const DTypeTraits& tr = Traits(t);
  const int64_t nblocks = rows * (k / tr.block_size);
  for (int64_t i = 0; i < nblocks; ++i) {
    uint8_t* blk = w.data() + i * tr.block_bytes;
    switch (t) {
      case DType::kF32: {
        const float v = normal(rng);
        std::memcpy(blk, &v, 4);
        break;
      }
      case DType::kF16:
        PutHalf(blk, normal(rng));
        break;
      case DType::kBF16: {
        const uint16_t h = F32ToBF16(normal(rng));
        std::memcpy(blk, &h, 2);
        break;
      }
      case DType::kQ4_0:
      case DType::kQ5_0:
      case DType::kQ8_0:
        PutHalf(blk, scale(rng));
        break;
      case DType::kQ4_1:
      case DType::kQ5_1: {
        // m is the block minimum: mostly in [-range, 0], as quantizers make it.
        const float d = scale(rng);
        const float range = d * (t == DType::kQ4_1 ? 15.0f : 31.0f);
        PutHalf(blk, d);
        PutHalf(blk + 2, range * std::uniform_real_distribution<float>(-1.0f, 0.2f)(rng));
        break;
      }
      case DType::kQ4_K:
      case DType::kQ5_K:
        PutHalf(blk, scale(rng));
        PutHalf(blk + 2, scale(rng));
        break;
      case DType::kQ6_K:
        PutHalf(blk + 208, scale(rng));
        break;
      default:
        break;
    }
  }
  return w;
}

std::vector<float> RandomActivations(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(m * k);
  for (auto& v : x) v = normal(rng);
  return x;
}

struct Converted {
  Bytes data;
  size_t row_bytes;
};

Converted ConvertActivations(DType wt, const std::vector<float>& x, int64_t m, int64_t k) {
  Converted c{Bytes(ActivationRowBytes(wt, k) * m), ActivationRowBytes(wt, k)};
  for (int64_t i = 0; i < m; ++i) QuantizeActivationRow(wt, x.data() + i * k, k, c.data.data() + i * c.row_bytes);
  return c;
}

// Relative tolerance of every MatMul comparison: |got - want| <= kRelTol *
// sum_j |w_j * a_j|. The kernels' block sums are exact integers and
// everything after is f32 scaling plus a summation over at most ~k/16 partial
// sums per lane, whose rounding error stays below ~(k/16 + 10) * 2^-24 of the
// absolute-term sum (< 1e-5 for k <= 2048); a dot near zero from cancellation
// is thus still checked to f32 precision of its terms. Q4_1 / Q5_1 add the
// min term as a second f32 product per block; the measured worst case
// (MinTypesErrorIsMeasuredAndDroppedMinsExceedIt prints it) stays two orders
// of magnitude inside, and a kernel that drops the mins misses by > 100x.
constexpr double kRelTol = 1e-5;

// y[i*ldy + r] (r in [r0, r1)) against the double dot of the dequantized
// weight row and dequantized activation row; `worst` (if set) receives the
// largest |got - want| / sum_j |w_j * a_j| seen.
::testing::AssertionResult MatchesReference(DType t, const Bytes& w, int64_t k, const Converted& xq, int64_t m,
                                            const std::vector<float>& y, int64_t ldy, int64_t r0, int64_t r1,
                                            double* worst = nullptr) {
  const size_t rb = RowBytesOf(t, k);
  std::vector<float> wrow(k), arow(k);
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  bool failed = false;
  for (int64_t i = 0; i < m; ++i) {
    DequantizeRow(ActivationType(t), xq.data.data() + i * xq.row_bytes, arow.data(), k);
    for (int64_t r = r0; r < r1; ++r) {
      DequantizeRow(t, w.data() + r * rb, wrow.data(), k);
      double ref = 0.0, mag = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        ref += static_cast<double>(wrow[j]) * arow[j];
        mag += std::fabs(static_cast<double>(wrow[j]) * arow[j]);
      }
      const double got = y[i * ldy + r];
      const double err = std::fabs(got - ref);
      if (worst != nullptr) *worst = std::max(*worst, std::isnan(err) ? INFINITY : err / (mag + 1e-30));
      const double tol = kRelTol * mag + 1e-30;
      if (!failed && !(err <= tol)) {
        failed = true;
        result = ::testing::AssertionFailure() << DTypeName(t) << " k=" << k << " row " << r << " act " << i
                                               << ": got " << got << " want " << ref << " (|diff| " << err
                                               << " > tol " << tol << ")";
      }
    }
  }
  return result;
}

const DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                              DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

TEST(QuantTypes, ReportsSupportedWeightTypes) {
  for (DType t : kWeightTypes) EXPECT_TRUE(IsSupportedWeightType(t)) << DTypeName(t);
  EXPECT_FALSE(IsSupportedWeightType(DType::kQ2_K));
  EXPECT_FALSE(IsSupportedWeightType(DType::kI32));
  EXPECT_EQ(ActivationType(DType::kQ5_0), DType::kQ8_0);
  EXPECT_EQ(ActivationType(DType::kQ4_1), DType::kQ8_0);
  EXPECT_EQ(ActivationType(DType::kQ5_1), DType::kQ8_0);
  EXPECT_FALSE(IsSupportedWeightType(DType::kQ8_1));
  EXPECT_EQ(ActivationType(DType::kQ6_K), DType::kQ8_K);
  EXPECT_EQ(ActivationType(DType::kBF16), DType::kF32);
  EXPECT_EQ(ActivationRowBytes(DType::kQ8_0, 640), 20u * 34u);
  EXPECT_EQ(ActivationRowBytes(DType::kQ4_K, 512), 2u * 292u);
  EXPECT_EQ(ActivationRowBytes(DType::kF16, 10), 40u);
}

// The kernels and activation quantizers run once per tier this CPU supports.
class QuantKernels : public testing::PerCpuIsaTest {};
class QuantActivation : public testing::PerCpuIsaTest {};
DECODED_INSTANTIATE_PER_CPU_ISA(QuantKernels);
DECODED_INSTANTIATE_PER_CPU_ISA(QuantActivation);

TEST_P(QuantKernels, RunOnTheSelectedTier) { EXPECT_STREQ(KernelVariant(), CpuIsaName(GetParam())); }

TEST_P(QuantKernels, MatMulMatchesDequantizedReferenceForEveryType) {
  std::mt19937 rng(42);
  // 7 rows: one 4-row group plus a 3-row remainder in the blocked kernels.
  constexpr int64_t kRows = 7;
  for (DType t : kWeightTypes) {
    const int64_t bs = Traits(t).block_size;
    // 96 = 3 blocks of 32 (odd block count); 40 exercises f32-type tails.
    for (int64_t k : {int64_t{40}, int64_t{96}, int64_t{256}, int64_t{640}, int64_t{1024}, int64_t{2048}}) {
      if (k % bs != 0) continue;
      for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{9}}) {  // 9: batched rows plus a remainder
        const Bytes w = RandomWeights(t, kRows, k, rng);
        const std::vector<float> x = RandomActivations(m, k, rng);
        const Converted xq = ConvertActivations(t, x, m, k);
        const int64_t ldy = kRows + 5;
        std::vector<float> y(m * ldy, -7.0f);
        MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data.data(), xq.row_bytes, m, y.data(), ldy, 0, kRows);
        EXPECT_TRUE(MatchesReference(t, w, k, xq, m, y, ldy, 0, kRows)) << "m=" << m;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t r = kRows; r < ldy; ++r) EXPECT_EQ(y[i * ldy + r], -7.0f) << "wrote outside [r0, r1)";
        }
      }
    }
  }
}

TEST_P(QuantKernels, MatMulWritesOnlyItsRowRange) {
  std::mt19937 rng(7);
  for (DType t : kWeightTypes) {
    const int64_t k = 256;
    const Bytes w = RandomWeights(t, 9, k, rng);
    const Converted xq = ConvertActivations(t, RandomActivations(1, k, rng), 1, k);
    std::vector<float> y(9, -7.0f);
    MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data.data(), xq.row_bytes, 1, y.data(), 9, 2, 8);
    EXPECT_TRUE(MatchesReference(t, w, k, xq, 1, y, 9, 2, 8));
    EXPECT_EQ(y[0], -7.0f);
    EXPECT_EQ(y[1], -7.0f);
    EXPECT_EQ(y[8], -7.0f);
  }
}

// An output row must not depend on the batch it was computed in: row i of a
// MatMul over m activation rows, with the weight rows split across any
// number of threads, is byte-identical to the m = 1 product of that row
// alone (batched decode serves each session's logits bit-exact to its solo
// run; D2 == D1 compares bytes). m runs 1..40 and the window of activation
// rows moves, so a row lands in every position of the prefill tiles, in the
// tiles' remainders, and in splits whose row ranges cut tiles apart.
TEST_P(QuantKernels, EveryOutputIsBitIdenticalWhateverTheBatchAndRowSplit) {
  std::mt19937 rng(2024);
  constexpr int64_t kRows = 13, kActs = 40;
  for (DType t : kWeightTypes) {
    const int64_t bs = Traits(t).block_size;
    // Odd and even block counts: 96 = 3 blocks, 640 = 20, 896 = 28 (Gemma 3 /
    // Qwen2.5 rows), 576 = 18 (SmolLM2); 768 / 512 for the K-quants.
    for (int64_t k : {int64_t{40}, int64_t{96}, int64_t{576}, int64_t{640}, int64_t{896}, int64_t{512},
                      int64_t{768}}) {
      if (k % bs != 0 || (bs == 256) != (k == 512 || k == 768) || (bs == 1 && k != 40 && k != 640)) continue;
      const Bytes w = RandomWeights(t, kRows, k, rng);
      const Converted xq = ConvertActivations(t, RandomActivations(kActs, k, rng), kActs, k);
      std::vector<float> solo(kActs * kRows);
      for (int64_t i = 0; i < kActs; ++i) {
        MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data.data() + i * xq.row_bytes, xq.row_bytes, 1,
               solo.data() + i * kRows, kRows, 0, kRows);
      }
      ASSERT_TRUE(MatchesReference(t, w, k, xq, kActs, solo, kRows, 0, kRows)) << "k=" << k;
      for (int64_t m = 1; m <= kActs; ++m) {
        const int64_t first = (m * 7) % (kActs - m + 1);  // window [first, first + m)
        for (int nth : {1, 2, 3, 5}) {
          std::vector<float> y(m * kRows, -7.0f);
          for (int ith = 0; ith < nth; ++ith) {
            MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data.data() + first * xq.row_bytes, xq.row_bytes, m, y.data(),
                   kRows, kRows * ith / nth, kRows * (ith + 1) / nth);
          }
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t r = 0; r < kRows; ++r) {
              uint32_t got, want;
              std::memcpy(&got, &y[i * kRows + r], 4);
              std::memcpy(&want, &solo[(first + i) * kRows + r], 4);
              ASSERT_EQ(got, want) << DTypeName(t) << " k=" << k << " m=" << m << " threads=" << nth
                                   << ": output (activation row " << first + i << ", weight row " << r
                                   << ") differs from its m = 1 product in bits";
            }
          }
        }
      }
    }
  }
}

// Swaps the fp16 scale of block 0 and block 1 of every row: a kernel that
// reads the neighbour block's scale computes exactly this.
Bytes WithScalesShiftedByOneBlock(DType t, const Bytes& w, int64_t rows, int64_t k) {
  Bytes bad = w;
  const size_t rb = RowBytesOf(t, k);
  const size_t bb = Traits(t).block_bytes;
  const size_t off = t == DType::kQ6_K ? 208 : 0;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = bad.data() + r * rb;
    std::swap_ranges(row + off, row + off + 2, row + bb + off);
  }
  return bad;
}

TEST_P(QuantKernels, ComparisonCatchesScaleTakenFromNeighbourBlock) {
  std::mt19937 rng(99);
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K}) {
    const int64_t k = 512, rows = 5;
    const Bytes w = RandomWeights(t, rows, k, rng);
    const Converted xq = ConvertActivations(t, RandomActivations(1, k, rng), 1, k);
    const Bytes bad = WithScalesShiftedByOneBlock(t, w, rows, k);
    std::vector<float> y(rows);
    MatMul(t, bad.data(), RowBytesOf(t, k), k, xq.data.data(), xq.row_bytes, 1, y.data(), rows, 0, rows);
    EXPECT_FALSE(MatchesReference(t, w, k, xq, 1, y, rows, 0, rows)) << DTypeName(t);
    MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data.data(), xq.row_bytes, 1, y.data(), rows, 0, rows);
    EXPECT_TRUE(MatchesReference(t, w, k, xq, 1, y, rows, 0, rows)) << DTypeName(t);
  }
}

nlohmann::json LoadFixture() {
  std::ifstream in(testing::TestDataPath("quant_reference.json"));
  EXPECT_TRUE(in.good()) << "missing tests/data/quant_reference.json (tools/gen_quant_reference.py)";
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

Bytes FromHex(const std::string& hex) {
  Bytes out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

TEST(QuantDequantize, MatchesGgufPackageOnRealAndSyntheticRows) {
  const nlohmann::json fx = LoadFixture();
  ASSERT_TRUE(fx.is_object());
  int checked_types = 0;
  std::vector<std::string> seen;
  for (const auto& c : fx["dequant"]) {
    const auto type = LookupDType(c["type_id"].get<uint32_t>());
    ASSERT_TRUE(type.has_value());
    const DType t = static_cast<DType>(c["type_id"].get<uint32_t>());
    const int64_t k = c["k"].get<int64_t>();
    const Bytes raw = FromHex(c["hex"].get<std::string>());
    ASSERT_EQ(raw.size(), RowBytesOf(t, k)) << c["source"];
    const std::vector<float> want = c["values"].get<std::vector<float>>();
    std::vector<float> got(k);
    DequantizeRow(t, raw.data(), got.data(), k);
    int mismatches = 0;
    for (int64_t j = 0; j < k && mismatches < 5; ++j) {
      // Bitwise equality: every decoder step is an exact or singly-rounded
      // f32 operation in the same order as gguf-py's numpy code.
      if (std::memcmp(&got[j], &want[j], 4) != 0) {
        ++mismatches;
        ADD_FAILURE() << c["type"] << " " << c["source"] << " element " << j << ": got " << got[j] << " want "
                      << want[j];
      }
    }
    seen.push_back(c["type"].get<std::string>());
    ++checked_types;
  }
  for (const char* name : {"q8_0", "q5_0", "q4_K", "q6_K", "f32", "q4_0", "q5_K", "f16", "bf16", "q4_1", "q5_1"}) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), name), seen.end()) << "fixture lacks " << name;
  }
  EXPECT_GT(checked_types, 0);
}

// Zeroes the fp16 min m (bytes 2-3) of every Q4_1 / Q5_1 block: a kernel
// that drops the min term computes exactly this.
Bytes WithMinsDropped(DType t, const Bytes& w) {
  Bytes bad = w;
  const size_t bb = Traits(t).block_bytes;
  for (size_t off = 0; off + bb <= bad.size(); off += bb) bad[off + 2] = bad[off + 3] = 0;
  return bad;
}

// Q4_1 / Q5_1 MatMul against the fixture's float64 dots of gguf-dequantized
// weight rows and gguf-quantized Q8_0 activations: real SmolLM2 rows (k =
// 1536) and 9-block rows, 7 weight rows x 5 activation rows, so the batched
// activation path and its remainder both run. The same weights with their
// mins dropped must miss.
TEST_P(QuantKernels, MinTypesMatchGgufMatVecReference) {
  const nlohmann::json fx = LoadFixture();
  ASSERT_TRUE(fx.is_object());
  ASSERT_TRUE(fx.contains("matmul"));
  std::vector<std::string> seen;
  for (const auto& c : fx["matmul"]) {
    const DType t = static_cast<DType>(c["type_id"].get<uint32_t>());
    const int64_t k = c["k"].get<int64_t>(), rows = c["rows"].get<int64_t>(), m = c["m"].get<int64_t>();
    const Bytes w = FromHex(c["w_hex"].get<std::string>());
    const Bytes xq = FromHex(c["act_hex"].get<std::string>());
    const std::vector<double> want = c["want"].get<std::vector<double>>();
    const std::vector<double> mag = c["mag"].get<std::vector<double>>();
    ASSERT_EQ(ActivationType(t), DType::kQ8_0);
    ASSERT_EQ(w.size(), RowBytesOf(t, k) * rows) << c["source"];
    ASSERT_EQ(xq.size(), ActivationRowBytes(t, k) * m) << c["source"];
    ASSERT_EQ(want.size(), static_cast<size_t>(m * rows));
    std::vector<float> y(m * rows, NAN), y_bad(m * rows, NAN);
    MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data(), ActivationRowBytes(t, k), m, y.data(), rows, 0, rows);
    const Bytes bad = WithMinsDropped(t, w);
    MatMul(t, bad.data(), RowBytesOf(t, k), k, xq.data(), ActivationRowBytes(t, k), m, y_bad.data(), rows, 0, rows);
    double worst = 0.0, bad_least = INFINITY;
    for (size_t i = 0; i < want.size(); ++i) {
      const double tol = kRelTol * mag[i];
      EXPECT_LE(std::fabs(y[i] - want[i]), tol) << c["type"] << " " << c["source"] << " output " << i;
      worst = std::max(worst, std::fabs(y[i] - want[i]) / mag[i]);
      bad_least = std::min(bad_least, std::fabs(y_bad[i] - want[i]) / mag[i]);
    }
    // Every output, not just one, misses with the mins dropped.
    EXPECT_GT(bad_least, kRelTol) << c["type"] << " " << c["source"];
    std::printf("%s %s: max |err|/sum|w*a| %.3g; mins dropped: min %.3g (tolerance %.0e)\n",
                c["type"].get<std::string>().c_str(), c["source"].get<std::string>().c_str(), worst, bad_least,
                kRelTol);
    seen.push_back(c["type"].get<std::string>());
  }
  for (const char* name : {"q4_1", "q5_1"}) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), name), seen.end()) << "fixture lacks a " << name << " matmul";
  }
}

// The same comparison on many random Q4_1 / Q5_1 matrices (random codes,
// realistic d and m), recording the largest error and how far a kernel that
// drops the mins misses: the figures behind kRelTol.
TEST_P(QuantKernels, MinTypesErrorIsMeasuredAndDroppedMinsExceedIt) {
  std::mt19937 rng(2024);
  for (DType t : {DType::kQ4_1, DType::kQ5_1}) {
    double worst = 0.0, bad_least = INFINITY;
    for (int trial = 0; trial < 30; ++trial) {
      const int64_t k = std::array<int64_t, 3>{288, 1536, 2048}[trial % 3], rows = 7, m = 5;
      const Bytes w = RandomWeights(t, rows, k, rng);
      const Converted xq = ConvertActivations(t, RandomActivations(m, k, rng), m, k);
      std::vector<float> y(m * rows);
      MatMul(t, w.data(), RowBytesOf(t, k), k, xq.data.data(), xq.row_bytes, m, y.data(), rows, 0, rows);
      EXPECT_TRUE(MatchesReference(t, w, k, xq, m, y, rows, 0, rows, &worst));
      const Bytes bad = WithMinsDropped(t, w);
      MatMul(t, bad.data(), RowBytesOf(t, k), k, xq.data.data(), xq.row_bytes, m, y.data(), rows, 0, rows);
      double bad_worst = 0.0;
      EXPECT_FALSE(MatchesReference(t, w, k, xq, m, y, rows, 0, rows, &bad_worst));
      bad_least = std::min(bad_least, bad_worst);
    }
    std::printf("%s random: max |err|/sum|w*a| %.3g; mins dropped: each matrix misses by >= %.3g (tolerance %.0e)\n",
                DTypeName(t), worst, bad_least, kRelTol);
    EXPECT_LT(worst, kRelTol / 10) << DTypeName(t);
    EXPECT_GT(bad_least, 100 * kRelTol) << DTypeName(t);
  }
}

TEST_P(QuantActivation, Q8_0MatchesGgufQuantizerIncludingTies) {
  const nlohmann::json fx = LoadFixture();
  ASSERT_TRUE(fx.is_object());
  const auto& a = fx["q8_0_activation"];
  const int64_t k = a["k"].get<int64_t>();
  const std::vector<float> x = a["input"].get<std::vector<float>>();
  const Bytes want = FromHex(a["hex"].get<std::string>());
  ASSERT_EQ(want.size(), ActivationRowBytes(DType::kQ8_0, k));
  Bytes got(want.size());
  QuantizeActivationRow(DType::kQ8_0, x.data(), k, got.data());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(static_cast<int>(got[i]), static_cast<int>(want[i])) << "byte " << i << " (block " << i / 34 << ")";
  }
}

// quantize_row_q8_K_ref, spelled out: per 256 values, max = the first value
// of largest magnitude, iscale = -127/max, q = min(127, round-half-even(
// iscale*x)), d = 1/iscale, bsums = sums of 16 consecutive q.
Bytes ReferenceQ8_K(const std::vector<float>& x) {
  const int64_t nb = static_cast<int64_t>(x.size()) / 256;
  Bytes out(nb * 292, 0);
  for (int64_t b = 0; b < nb; ++b) {
    const float* v = x.data() + b * 256;
    uint8_t* blk = out.data() + b * 292;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        max = v[j];
      }
    }
    if (amax == 0.0f) continue;  // d = 0, q = 0, bsums = 0
    const float iscale = -127.0f / max;
    int8_t q[256];
    for (int j = 0; j < 256; ++j) {
      const float r = std::nearbyint(iscale * v[j]);  // default FE_TONEAREST: ties to even
      q[j] = static_cast<int8_t>(r > 127.0f ? 127 : static_cast<int>(r));
    }
    const float d = 1.0f / iscale;
    std::memcpy(blk, &d, 4);
    std::memcpy(blk + 4, q, 256);
    for (int g = 0; g < 16; ++g) {
      int16_t s = 0;
      for (int l = 0; l < 16; ++l) s = static_cast<int16_t>(s + q[16 * g + l]);
      std::memcpy(blk + 260 + 2 * g, &s, 2);
    }
  }
  return out;
}

TEST_P(QuantActivation, Q8_KMatchesReferenceFormula) {
  std::mt19937 rng(5);
  std::vector<float> x = RandomActivations(1, 4 * 256, rng);
  // Block 1: max = -127, so iscale = 1 and k+0.5 inputs are exact ties.
  for (int j = 0; j < 256; ++j) x[256 + j] = static_cast<float>(j % 20) - 9.5f;
  x[256] = -127.0f;
  // Block 2: two values of largest magnitude, opposite signs: the first wins.
  for (int j = 0; j < 256; ++j) x[512 + j] = 0.01f * static_cast<float>(j % 7);
  x[512 + 3] = -5.0f;
  x[512 + 9] = 5.0f;
  // Block 3: all zero.
  for (int j = 0; j < 256; ++j) x[768 + j] = 0.0f;
  const Bytes want = ReferenceQ8_K(x);
  ASSERT_EQ(want.size(), ActivationRowBytes(DType::kQ4_K, 1024));
  Bytes got(want.size(), 0xAB);
  QuantizeActivationRow(DType::kQ4_K, x.data(), 1024, got.data());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(static_cast<int>(got[i]), static_cast<int>(want[i])) << "byte " << i << " of block " << i / 292;
  }
  float d1;
  std::memcpy(&d1, got.data() + 292, 4);
  EXPECT_EQ(d1, 1.0f);  // -max/127 with max = -127
}

TEST_P(QuantActivation, FloatWeightsTakeActivationsUnchanged) {
  const std::vector<float> x = {1.5f, -2.25f, 3.0e-20f, 7.0f};
  std::vector<float> out(4);
  QuantizeActivationRow(DType::kBF16, x.data(), 4, out.data());
  EXPECT_EQ(out, x);
}

TEST(QuantHalf, F16ConversionsFollowIeeeBinary16) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);                 // rounds up to inf
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);    // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);    // tie -> even (0)
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);    // tie -> even (2)
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> even
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie -> even
  EXPECT_EQ(F32ToF16(1.0f / 3.0f), 0x3555);
  EXPECT_EQ(F32ToF16(INFINITY), 0x7C00);
  EXPECT_EQ(F32ToF16(NAN) & 0x7C00, 0x7C00);
  EXPECT_NE(F32ToF16(NAN) & 0x03FF, 0);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0xC000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7C00), INFINITY);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0) continue;  // NaN payloads
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(QuantHalf, BF16ConversionsRoundToNearestEven) {
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  EXPECT_EQ(BF16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(BF16ToF32(0xC040), -3.0f);
  EXPECT_EQ(F32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBF16(from_bits(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(F32ToBF16(from_bits(0x3F818000u)), 0x3F82);  // tie -> even
  EXPECT_EQ(F32ToBF16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
}

}  // namespace
}  // namespace decoded::quant
