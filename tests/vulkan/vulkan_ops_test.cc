// Single ops on the Vulkan backend against an independent reference, each
// within a tolerance measured here, and a deliberately broken variant that
// exceeds it (so the tolerance can fail):
//   - mat-vec / mat-mat and get_rows over every weight type the kernels take
//     (random blocks; reference: the CPU's dequantization, itself checked
//     against the gguf package's, then an f64 dot product);
//   - the f32 ops (norms, RoPE, attention) through the family fixtures
//     (vulkan_decode_test), which use all of them.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/graph/optimizer.h"
#include "engine/quant/quant.h"
#include "engine/vulkan/vulkan_backend.h"
#include "gtest/gtest.h"
#include "tests/vulkan/vulkan_test_device.h"

namespace decoded {
namespace {

// `rows` random rows of `cols` elements of type t: random payload bytes, the
// f16 scales (every block's first bytes, or Q6_K's last two) replaced by small
// finite values so every element is a sane number.
std::vector<uint8_t> RandomRows(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t row_bytes = *RowBytes(t, cols);
  std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  const DTypeTraits& tr = Traits(t);
  auto half = [&](uint8_t* p) {
    // f16 in [2^-8, 2^-6): sign random, exponent 7..8, mantissa random.
    const uint16_t h = static_cast<uint16_t>((byte(rng) & 1) << 15 | (7 + byte(rng) % 2) << 10 | (byte(rng) << 2));
    std::memcpy(p, &h, 2);
  };
  const size_t blocks = bytes.size() / tr.block_bytes;
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t* blk = bytes.data() + b * tr.block_bytes;
    switch (t) {
      case DType::kF32: {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        const float f = u(rng);
        std::memcpy(blk, &f, 4);
        break;
      }
      case DType::kF16: half(blk); break;
      case DType::kBF16: {
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        const float f = u(rng);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(blk, &h, 2);
        break;
      }
      case DType::kQ4_1:
      case DType::kQ5_1:
      case DType::kQ4_K:
      case DType::kQ5_K: half(blk); half(blk + 2); break;  // d and m / dmin
      case DType::kQ6_K: half(blk + 208); break;
      default: half(blk); break;  // d first
    }
  }
  return bytes;
}

struct TypeCase {
  DType type;
  int64_t cols;
};

class VulkanMatMulTest : public ::testing::TestWithParam<TypeCase> {};

// out[i, r] = dot(W[r], x[i]) for 3 activation rows (a batch) and 70 weight
// rows, and get_rows of 3 rows, against the CPU's dequantized rows.
TEST_P(VulkanMatMulTest, MatchesTheDequantizedReference) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  const int64_t validation0 = device->validation_messages();
  const DType t = GetParam().type;
  const int64_t cols = GetParam().cols, n = 70, m = 3;
  std::mt19937 rng(static_cast<uint32_t>(t) * 7919u + static_cast<uint32_t>(cols));
  std::vector<uint8_t> wbytes = RandomRows(t, n, cols, rng);
  WeightTensor w{"w", t, n, cols, *RowBytes(t, cols), wbytes.data(), 1};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (float& v : x) v = u(rng);
  const std::vector<int32_t> ids = {69, 0, 33};

  Graph g;
  std::vector<uint8_t> xb(x.size() * 4), idb(ids.size() * 4);
  std::memcpy(xb.data(), x.data(), xb.size());
  std::memcpy(idb.data(), ids.data(), idb.size());
  const NodeId wn = g.weight(w);
  g.mark_output(g.matmul(wn, g.constant(DType::kF32, m, cols, xb, "x"), "mm"));
  g.mark_output(g.get_rows(wn, g.constant(DType::kI32, 1, 3, idb, "ids"), "rows"));
  auto plan = Optimize(g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto backend = vulkan::CreateBackend(device);
  auto compiled = backend->Compile(std::move(g), *std::move(plan), PlanResources{});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  auto ex_or = backend->CreateExecutor(1);
  ASSERT_TRUE(ex_or.ok()) << ex_or.status();
  auto ex = *std::move(ex_or);
  ASSERT_TRUE((*compiled)->Run(*ex, SymEnv{}).ok());
  const absl::Span<const float> mm = (*compiled)->output(0), rows = (*compiled)->output(1);

  // The reference, and the same with one weight byte flipped (a dequantization
  // bug in one unit): the tolerance must tell them apart.
  auto reference = [&](const std::vector<uint8_t>& bytes, std::vector<double>* out_mm, std::vector<float>* out_rows) {
    std::vector<float> deq(static_cast<size_t>(n * cols));
    for (int64_t r = 0; r < n; ++r) {
      quant::DequantizeRow(t, bytes.data() + static_cast<size_t>(r) * w.row_bytes, deq.data() + r * cols, cols);
    }
    out_mm->assign(static_cast<size_t>(m * n), 0.0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < n; ++r) {
        double s = 0.0;
        for (int64_t c = 0; c < cols; ++c) s += double(deq[r * cols + c]) * double(x[i * cols + c]);
        (*out_mm)[i * n + r] = s;
      }
    }
    out_rows->clear();
    for (int32_t id : ids) out_rows->insert(out_rows->end(), deq.begin() + id * cols, deq.begin() + (id + 1) * cols);
  };
  auto worst_error = [&](const std::vector<double>& ref_mm, const std::vector<float>& ref_rows) {
    // Relative to the size of the terms (sum |w||x|): f32 accumulation error.
    double worst = 0.0;
    for (size_t i = 0; i < ref_mm.size(); ++i) worst = std::max(worst, std::fabs(mm[i] - ref_mm[i]));
    double scale = 0.0;
    for (double v : ref_mm) scale = std::max(scale, std::fabs(v));
    double rows_worst = 0.0;
    for (size_t i = 0; i < ref_rows.size(); ++i) rows_worst = std::max(rows_worst, double(std::fabs(rows[i] - ref_rows[i])));
    return std::max(worst / std::max(scale, 1e-30), rows_worst);
  };
  std::vector<double> ref_mm;
  std::vector<float> ref_rows;
  reference(wbytes, &ref_mm, &ref_rows);
  const double err = worst_error(ref_mm, ref_rows);
  // Measured on lavapipe: <= 2e-7 relative for every type (f32 sums of up to
  // 512 products against f64); get_rows bit-exact but for FMA contraction.
  constexpr double kTolerance = 2e-6;
  EXPECT_LE(err, kTolerance) << DTypeName(t);

  std::vector<uint8_t> broken = wbytes;
  // A payload byte of row 0 (past the block's first scale), not its scale.
  broken[Traits(t).block_bytes > 4 ? 5 : 1] ^= 0x5A;
  reference(broken, &ref_mm, &ref_rows);
  EXPECT_GT(worst_error(ref_mm, ref_rows), kTolerance) << DTypeName(t) << ": one flipped byte goes unnoticed";
  std::printf("%s x %lld: relative error %.3g\n", DTypeName(t), static_cast<long long>(cols), err);
  EXPECT_EQ(device->validation_messages(), validation0);
}

constexpr TypeCase kTypes[] = {
    {DType::kF32, 96},   {DType::kF32, 40},   {DType::kF16, 64},   {DType::kF16, 24},  {DType::kBF16, 64},
    {DType::kQ4_0, 128}, {DType::kQ4_1, 128}, {DType::kQ5_0, 128}, {DType::kQ5_1, 128}, {DType::kQ8_0, 128},
    {DType::kQ4_K, 512}, {DType::kQ5_K, 512}, {DType::kQ6_K, 512},
};

std::string TypeName(const ::testing::TestParamInfo<TypeCase>& info) {
  return std::string(DTypeName(info.param.type)) + "_" + std::to_string(info.param.cols);
}

INSTANTIATE_TEST_SUITE_P(Types, VulkanMatMulTest, ::testing::ValuesIn(kTypes), TypeName);

}  // namespace
}  // namespace decoded
