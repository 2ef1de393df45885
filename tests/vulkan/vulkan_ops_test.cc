// Single ops on the Vulkan backend against an independent reference, each
// within a tolerance measured here, and a deliberately broken variant that
// exceeds it (so the tolerance can fail):
//   - mat-vec / mat-mat and get_rows over every weight type the kernels take
//     (random blocks; reference: the CPU's dequantization, itself checked
//     against the gguf package's, then an f64 dot product);
//   - the routed-experts FFN (moe.comp, moe_matmul.comp) over quantized
//     experts, DeepSeek-V3's and Qwen3-MoE's routings (reference: the CPU's
//     routing decision, then f64 arithmetic on the dequantized experts);
//   - the f32 ops (norms, RoPE, attention) through the family fixtures
//     (vulkan_decode_test), which use all of them.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu/kernels.h"
#include "engine/graph/optimizer.h"
#include "engine/quant/quant.h"
#include "engine/vulkan/kernels.h"
#include "engine/vulkan/vulkan_backend.h"
#include "engine/vulkan/vulkan_plan.h"
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

// The type, and whether the rows are a prefill chunk of one sequence (the
// tiled mat-mat) or a batch of decode rows (the mat-vec).
class VulkanMatMulTest : public ::testing::TestWithParam<std::tuple<TypeCase, bool>> {};

// out[i, r] = dot(W[r], x[i]) for 3 activation rows of a batch (matmul.comp)
// or 77 rows of one sequence (matmul_tiled.comp: two row tiles by two weight
// tiles, each with a ragged edge) and 70 weight rows, and get_rows of 3 rows,
// against the CPU's dequantized rows.
TEST_P(VulkanMatMulTest, MatchesTheDequantizedReference) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  const int64_t validation0 = device->validation_messages();
  const auto [type_case, one_sequence] = GetParam();
  const DType t = type_case.type;
  const int64_t cols = type_case.cols, n = 70, m = one_sequence ? 77 : 3;
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
  g.set_rows_are_one_sequence(one_sequence);
  auto plan = Optimize(g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto backend = vulkan::CreateBackend(device);
  const int64_t tiled0 = vulkan::GetPlanStats().tiled_matmuls;
  auto compiled = backend->Compile(std::move(g), *std::move(plan), PlanResources{});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const bool tiled_possible = device->shared_memory_bytes() >= vulkan::kTiledMatMulSharedBytes;
  EXPECT_EQ(vulkan::GetPlanStats().tiled_matmuls - tiled0, one_sequence && tiled_possible ? 1 : 0)
      << "a batch's rows never take the tiled mat-mat; a long prefill chunk's do";
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
  // Measured on lavapipe, relative, f32 sums of up to 512 products against
  // f64: the mat-vec <= 2e-7 for every type (lane-strided partials), the tiled
  // mat-mat <= 9.2e-7 (one running sum in k order: Q6_K x 512 the largest);
  // get_rows bit-exact but for FMA contraction.
  constexpr double kTolerance = 2e-6;
  EXPECT_LE(err, kTolerance) << DTypeName(t);

  std::vector<uint8_t> broken = wbytes;
  // A payload byte of row 0 (past the block's first scale), not its scale.
  broken[Traits(t).block_bytes > 4 ? 5 : 1] ^= 0x5A;
  reference(broken, &ref_mm, &ref_rows);
  EXPECT_GT(worst_error(ref_mm, ref_rows), kTolerance) << DTypeName(t) << ": one flipped byte goes unnoticed";
  std::printf("%s x %lld, %s: relative error %.3g\n", DTypeName(t), static_cast<long long>(cols),
              one_sequence ? "tiled mat-mat" : "mat-vec", err);
  EXPECT_EQ(device->validation_messages(), validation0);
}

constexpr TypeCase kTypes[] = {
    {DType::kF32, 96},   {DType::kF32, 40},   {DType::kF16, 64},   {DType::kF16, 24},  {DType::kBF16, 64},
    {DType::kQ4_0, 128}, {DType::kQ4_1, 128}, {DType::kQ5_0, 128}, {DType::kQ5_1, 128}, {DType::kQ8_0, 128},
    {DType::kQ4_K, 512}, {DType::kQ5_K, 512}, {DType::kQ6_K, 512},
};

std::string MatMulCaseName(const ::testing::TestParamInfo<std::tuple<TypeCase, bool>>& info) {
  const TypeCase& c = std::get<0>(info.param);
  return std::string(DTypeName(c.type)) + "_" + std::to_string(c.cols) + (std::get<1>(info.param) ? "_tiled" : "_batch");
}

INSTANTIATE_TEST_SUITE_P(Types, VulkanMatMulTest, ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::Bool()),
                         MatMulCaseName);

// The MoE FFN of 3 rows over 8 experts (k = 2) with experts of type t,
// routed as DeepSeek-V3 (sigmoid, selection bias, 4 groups of which 2 are
// kept by their top-2 sums, normalized, scaled) and as Qwen3-MoE (softmax,
// normalized), against f64 arithmetic on the dequantized experts of the
// CPU's routing decision. A flipped byte in every expert's first down row is
// caught.
class VulkanMoeTest : public ::testing::TestWithParam<DType> {};

TEST_P(VulkanMoeTest, RoutedExpertsMatchTheDequantizedReference) {
  DECODED_VULKAN_DEVICE_OR_SKIP(device);
  const int64_t validation0 = device->validation_messages();
  const DType t = GetParam();
  constexpr int64_t kRows = 3, kHidden = 256, kFfn = 512, kExperts = 8;
  std::mt19937 rng(4242u + static_cast<uint32_t>(t));
  std::vector<uint8_t> gate = RandomRows(t, kExperts * kFfn, kHidden, rng);
  std::vector<uint8_t> up = RandomRows(t, kExperts * kFfn, kHidden, rng);
  std::vector<uint8_t> down = RandomRows(t, kExperts * kHidden, kFfn, rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(kRows * kHidden), logits(kRows * kExperts), bias(kExperts);
  for (float& v : x) v = u(rng);
  for (float& v : logits) v = 2.0f * u(rng);
  for (float& v : bias) v = 0.1f * u(rng);

  MoeRouting v3;
  v3.n_expert = kExperts;
  v3.k = 2;
  v3.gating = MoeGating::kSigmoid;
  v3.norm_topk_prob = true;
  v3.scale = 2.5f;
  v3.n_group = 4;
  v3.topk_group = 2;
  v3.group_score = MoeGroupScore::kTop2Sum;
  v3.has_bias = true;
  MoeRouting qwen;
  qwen.n_expert = kExperts;
  qwen.k = 2;
  qwen.norm_topk_prob = true;

  for (const MoeRouting& r : {v3, qwen}) {
    auto run = [&](const std::vector<uint8_t>& down_bytes) -> std::vector<float> {
      WeightTensor wg{"gate_exps", t, kFfn, kHidden, *RowBytes(t, kHidden), gate.data(), kExperts};
      WeightTensor wu{"up_exps", t, kFfn, kHidden, *RowBytes(t, kHidden), up.data(), kExperts};
      WeightTensor wd{"down_exps", t, kHidden, kFfn, *RowBytes(t, kFfn), down_bytes.data(), kExperts};
      std::vector<uint8_t> bias_bytes(bias.size() * 4);
      std::memcpy(bias_bytes.data(), bias.data(), bias_bytes.size());
      WeightTensor wb{"exp_probs_b", DType::kF32, 1, kExperts, kExperts * 4, bias_bytes.data(), 1};
      Graph g;
      std::vector<uint8_t> xb(x.size() * 4), lb(logits.size() * 4);
      std::memcpy(xb.data(), x.data(), xb.size());
      std::memcpy(lb.data(), logits.data(), lb.size());
      const NodeId xn = g.constant(DType::kF32, kRows, kHidden, xb, "x");
      const NodeId ln = g.constant(DType::kF32, kRows, kExperts, lb, "router_logits");
      g.mark_output(g.moe_ffn(xn, ln, g.weight(wg), g.weight(wu), g.weight(wd), r.has_bias ? g.weight(wb) : kNoNode,
                              r, "moe"));
      auto plan = Optimize(g);
      EXPECT_TRUE(plan.ok()) << plan.status();
      auto backend = vulkan::CreateBackend(device);
      auto compiled = backend->Compile(std::move(g), *std::move(plan), PlanResources{});
      EXPECT_TRUE(compiled.ok()) << compiled.status();
      if (!compiled.ok()) return {};
      auto ex = backend->CreateExecutor(1);
      EXPECT_TRUE(ex.ok());
      EXPECT_TRUE((*compiled)->Run(**ex, SymEnv{}).ok());
      const absl::Span<const float> o = (*compiled)->output(0);
      return std::vector<float>(o.begin(), o.end());
    };
    // The reference on `down_bytes`.
    auto reference = [&](const std::vector<uint8_t>& down_bytes) {
      std::vector<double> out(kRows * kHidden, 0.0);
      std::vector<float> scratch(static_cast<size_t>(cpu::MoeRouteScratchFloats(r)));
      std::vector<float> row(kFfn > kHidden ? kFfn : kHidden);
      const size_t gate_row = *RowBytes(t, kHidden), down_row = *RowBytes(t, kFfn);
      for (int64_t i = 0; i < kRows; ++i) {
        int32_t experts[2];
        float weights[2];
        cpu::MoeRoute(logits.data() + i * kExperts, r.has_bias ? bias.data() : nullptr, r, scratch.data(), experts,
                      weights);
        for (int j = 0; j < r.k; ++j) {
          std::vector<double> h(kFfn);
          for (int64_t f = 0; f < kFfn; ++f) {
            const size_t at = static_cast<size_t>(experts[j] * kFfn + f);
            double g = 0.0, v = 0.0;
            quant::DequantizeRow(t, gate.data() + at * gate_row, row.data(), kHidden);
            for (int64_t c = 0; c < kHidden; ++c) g += double(row[c]) * x[i * kHidden + c];
            quant::DequantizeRow(t, up.data() + at * gate_row, row.data(), kHidden);
            for (int64_t c = 0; c < kHidden; ++c) v += double(row[c]) * x[i * kHidden + c];
            h[f] = g / (1.0 + std::exp(-g)) * v;
          }
          for (int64_t c = 0; c < kHidden; ++c) {
            const size_t at = static_cast<size_t>(experts[j] * kHidden + c);
            quant::DequantizeRow(t, down_bytes.data() + at * down_row, row.data(), kFfn);
            double s = 0.0;
            for (int64_t f = 0; f < kFfn; ++f) s += double(row[f]) * h[f];
            out[i * kHidden + c] += weights[j] * s;
          }
        }
      }
      return out;
    };
    auto relative_error = [](const std::vector<float>& got, const std::vector<double>& want) {
      double worst = 0.0, scale = 0.0;
      for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(got[i] - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
      }
      return worst / std::max(scale, 1e-30);
    };
    const std::vector<float> got = run(down);
    ASSERT_EQ(got.size(), static_cast<size_t>(kRows * kHidden));
    const double err = relative_error(got, reference(down));
    // Measured on lavapipe: <= 3e-7 relative for every type and routing.
    constexpr double kTolerance = 1e-5;
    EXPECT_LE(err, kTolerance) << DTypeName(t);
    std::vector<uint8_t> broken = down;
    const size_t plane = static_cast<size_t>(kHidden) * *RowBytes(t, kFfn);
    for (int64_t e = 0; e < kExperts; ++e) broken[static_cast<size_t>(e) * plane + (Traits(t).block_bytes > 4 ? 5 : 1)] ^= 0x5A;
    EXPECT_GT(relative_error(got, reference(broken)), kTolerance) << DTypeName(t) << ": a flipped byte goes unnoticed";
    std::printf("moe %s (%s): relative error %.3g\n", DTypeName(t), r.gating == MoeGating::kSigmoid ? "deepseek3" : "qwen3moe",
                err);
  }
  EXPECT_EQ(device->validation_messages(), validation0);
}

INSTANTIATE_TEST_SUITE_P(Types, VulkanMoeTest,
                         ::testing::Values(DType::kF16, DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ6_K),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace decoded
