#include "engine/decode_plans.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "engine/decode_token_host.h"
#include "engine/rope_yarn.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

TEST(MaskPlanTest, UniformLayersCollapseToOneVariant) {
  auto plan = MaskPlan::Create(std::vector<int32_t>{0, 0, 0});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->n_variants(), 1);
  EXPECT_EQ(plan->variant_of(2), 0);
}

TEST(MaskPlanTest, LocalGlobalPatternHasTwoVariants) {
  auto plan = MaskPlan::Create(std::vector<int32_t>{512, 512, 512, 512, 512, 0});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->n_variants(), 2);
  EXPECT_EQ(plan->window(plan->variant_of(0)), 512);
  EXPECT_EQ(plan->window(plan->variant_of(5)), 0);
}

TEST(MaskPlanTest, NegativeWindowNamesTheLayer) {
  auto plan = MaskPlan::Create(std::vector<int32_t>{4, -1});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("layer 1"), std::string::npos);
}

TEST(RopePlanTest, DistinctBasesAreDistinctVariantsAndNoPeLayersHaveNone) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0}, {true, 1e6, 1.0}, {false, 0, 0}, {true, 1e4, 1.0}};
  auto plan = RopePlan::Create(layers, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->n_variants(), 2);
  EXPECT_EQ(plan->variant_of(0), plan->variant_of(3));
  EXPECT_NE(plan->variant_of(0), plan->variant_of(1));
  EXPECT_EQ(plan->variant_of(2), -1);
  // inv_freq[i] = base^(-2i/d) (RoFormer eq. 15).
  EXPECT_FLOAT_EQ(plan->inv_freq(0)[0], 1.0f);
  EXPECT_NEAR(plan->inv_freq(0)[1], 1.0 / std::pow(1e4, 2.0 / 8.0), 1e-7);
  EXPECT_NEAR(plan->inv_freq(1)[3], 1.0 / std::pow(1e6, 6.0 / 8.0), 1e-9);
}

TEST(RopePlanTest, CarriesTheFamilysPairing) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0}};
  EXPECT_EQ(RopePlan::Create(layers, 8)->pairing(), RopePairing::kNeox);
  EXPECT_EQ(RopePlan::Create(layers, 8, RopePairing::kAdjacent)->pairing(), RopePairing::kAdjacent);
}

TEST(RopePlanTest, RejectsBadBaseNamingTheLayer) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0}, {true, -3, 1.0}};
  auto plan = RopePlan::Create(layers, 8);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("layer 1"), std::string::npos);
}

// HF's partial rotary (Phi: rotary_ndims = head_dim * partial_rotary_factor)
// computes inv_freq over the rotated dimensions only: 1 / base^(2i / rot).
TEST(RopePlanTest, PartialRotarySpreadsFrequenciesOverTheRotatedDims) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0}};
  auto plan = RopePlan::Create(layers, 16, RopePairing::kNeox, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->head_dim(), 16);
  EXPECT_EQ(plan->rot_dims(), 8);
  ASSERT_EQ(plan->inv_freq(0).size(), 4u);
  EXPECT_NEAR(plan->inv_freq(0)[3], 1.0 / std::pow(1e4, 6.0 / 8.0), 1e-9);
  EXPECT_EQ(RopePlan::Create(layers, 16)->rot_dims(), 16);  // 0: the whole head
}

TEST(RopePlanTest, RotatedDimsMustBeEvenAndWithinTheHead) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0}};
  for (int32_t rot : {7, 18, -2}) {
    auto plan = RopePlan::Create(layers, 16, RopePairing::kNeox, rot);
    ASSERT_FALSE(plan.ok()) << rot;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("rot_dims"), std::string::npos) << plan.status();
  }
}

TEST(DecodeTokenHostTest, PartialRotaryTablesHaveRotDimsOverTwoColumns) {
  auto rope = RopePlan::Create(std::vector<RopeLayer>{{true, 1e4, 1.0}}, 16, RopePairing::kNeox, 4);
  auto mask = MaskPlan::Create(std::vector<int32_t>{0});
  ASSERT_TRUE(rope.ok() && mask.ok());
  DecodeTokenHost host;
  ASSERT_TRUE(compute_decode_token_host(*mask, *rope, std::vector<int32_t>{1, 2, 3}, 5, &host).ok());
  ASSERT_EQ(host.rope_cos.size(), 3u * 2u);
  // token 2 (position 7), frequency index 1: 1e4^(-2/4).
  EXPECT_NEAR(host.rope_sin[2 * 2 + 1], std::sin(7 * std::pow(1e4, -0.5)), 1e-6);
}

// Llama 3.1 / llama.cpp rope_freqs: frequency i is divided by factor i, and
// layers that differ only in their factors are distinct variants.
TEST(RopePlanTest, FrequencyFactorsDivideTheirFrequencies) {
  RopeLayer plain{true, 1e4, 1.0};
  RopeLayer scaled{true, 1e4, 1.0, {1.0f, 2.0f, 8.0f, 8.0f}};
  auto plan = RopePlan::Create(std::vector<RopeLayer>{plain, scaled, scaled}, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->n_variants(), 2);
  EXPECT_EQ(plan->variant_of(1), plan->variant_of(2));
  const int32_t p = plan->variant_of(0), s = plan->variant_of(1);
  EXPECT_EQ(plan->inv_freq(s)[0], plan->inv_freq(p)[0]);
  EXPECT_EQ(plan->inv_freq(s)[1], plan->inv_freq(p)[1] / 2.0f);
  EXPECT_EQ(plan->inv_freq(s)[3], plan->inv_freq(p)[3] / 8.0f);
  EXPECT_NEAR(plan->inv_freq(s)[2], std::pow(1e4, -4.0 / 8.0) / 8.0, 1e-9);
}

TEST(RopePlanTest, RejectsBadFrequencyFactorsNamingTheLayer) {
  const std::vector<std::vector<float>> bad = {
      {1.0f, 2.0f},                                                // rot_dims 8 (the whole head) needs 4
      {1.0f, 0.0f, 1.0f, 1.0f},                                    // zero
      {1.0f, -2.0f, 1.0f, 1.0f},                                   // negative
      {1.0f, 1.0f, std::numeric_limits<float>::infinity(), 1.0f},  // not finite
      {1.0f, 1.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()},
  };
  for (const std::vector<float>& factors : bad) {
    std::vector<RopeLayer> layers = {{true, 1e4, 1.0}, {true, 1e4, 1.0, factors}};
    auto plan = RopePlan::Create(layers, 8);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("layer 1"), std::string::npos) << plan.status();
  }
}

// Partial rotary and frequency factors together: the factors cover the
// rotated dimensions only (llama.cpp's rope_freqs has n_rot / 2 entries).
TEST(RopePlanTest, FrequencyFactorsCoverTheRotatedDimsUnderPartialRotary) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0, {1.0f, 4.0f}}};
  auto plan = RopePlan::Create(layers, 16, RopePairing::kNeox, 4);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->inv_freq(0).size(), 2u);
  EXPECT_NEAR(plan->inv_freq(0)[0], 1.0, 1e-9);
  EXPECT_NEAR(plan->inv_freq(0)[1], std::pow(1e4, -2.0 / 4.0) / 4.0, 1e-9);

  // head_dim / 2 factors are the wrong length once only 4 dimensions rotate.
  std::vector<RopeLayer> whole_head = {{true, 1e4, 1.0, std::vector<float>(8, 1.0f)}};
  auto bad = RopePlan::Create(whole_head, 16, RopePairing::kNeox, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("layer 0"), std::string::npos) << bad.status();
}

// YaRN against Hugging Face's own init (tools/gen_rope_yarn_reference.py):
// the plan's frequencies equal HF's float32 inv_freq to within an ulp or two
// (pow and the blend rounded in another order), and YarnMscale gives HF's
// attention factor (mscale ratio when a case states mscale and
// mscale_all_dim) and DeepSeek-V2's softmax multiplier.
TEST(RopePlanYarnTest, FrequenciesAndFactorsMatchTransformers) {
  std::ifstream in(testing::TestDataPath("rope_yarn_reference.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_GE(ref["cases"].size(), 6u);
  for (const nlohmann::json& c : ref["cases"]) {
    const nlohmann::json& p = c["rope_parameters"];
    const std::string name = c["name"];
    YarnScaling y;
    y.factor = p["factor"];
    y.original_context = p["original_max_position_embeddings"];
    if (p.contains("beta_fast")) y.beta_fast = p["beta_fast"];
    if (p.contains("beta_slow")) y.beta_slow = p["beta_slow"];
    const int32_t rot = c["rot_dims"];
    RopeLayer layer{true, p["rope_theta"].get<double>(), 1.0};
    layer.yarn = y;
    // Partial rotary: the head is wider than the rotated dimensions.
    auto plan = RopePlan::Create(std::vector<RopeLayer>{layer}, 2 * rot, RopePairing::kNeox, rot);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status();
    const std::vector<float>& inv = plan->inv_freq(0);
    ASSERT_EQ(inv.size(), c["inv_freq"].size()) << name;
    double worst = 0;
    for (size_t i = 0; i < inv.size(); ++i) {
      const double want = std::stod(c["inv_freq"][i].get<std::string>());
      const double rel = std::abs(inv[i] - want) / want;
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 3e-7) << name << " inv_freq[" << i << "] = " << inv[i] << ", HF " << want;
    }
    std::printf("[ measured ] %s: max relative |inv_freq - HF| = %.3g over %zu frequencies\n", name.c_str(), worst,
                inv.size());
    double attention = YarnMscale(y.factor);
    if (p.contains("attention_factor")) {
      attention = p["attention_factor"];
    } else if (p.contains("mscale") && p.contains("mscale_all_dim")) {
      attention = YarnMscale(y.factor, p["mscale"]) / YarnMscale(y.factor, p["mscale_all_dim"]);
    }
    EXPECT_NEAR(attention, c["attention_factor"].get<double>(), 1e-12) << name;
    const double m = p.contains("mscale_all_dim") ? YarnMscale(y.factor, p["mscale_all_dim"]) : 1.0;
    EXPECT_NEAR(m * m, c["deepseek_v2_softmax_scale_factor"].get<double>(), 1e-12) << name;
  }
}

// The blend's ends: factor 1 is plain RoPE; frequencies below the ramp are
// kept and above it divided by the factor.
TEST(RopePlanYarnTest, FactorOneIsPlainRopeAndTheEndsAreKeptOrDivided) {
  RopeLayer plain{true, 1e4, 1.0};
  RopeLayer same = plain;
  same.yarn = YarnScaling{.factor = 1.0, .original_context = 64};
  auto a = RopePlan::Create(std::vector<RopeLayer>{plain, same}, 32);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->n_variants(), 2);  // YaRN or not is part of the variant
  for (size_t i = 0; i < a->inv_freq(0).size(); ++i) {
    // inter * ramp + extra * (1 - ramp) with inter == extra: exact up to the
    // blend's rounding.
    EXPECT_NEAR(a->inv_freq(1)[i], a->inv_freq(0)[i], 2e-7 * a->inv_freq(0)[i]) << i;
  }

  RopeLayer yarn = plain;
  yarn.yarn = YarnScaling{.factor = 8.0, .original_context = 4096};
  auto b = RopePlan::Create(std::vector<RopeLayer>{plain, yarn}, 64);
  ASSERT_TRUE(b.ok()) << b.status();
  // d = 64, base 1e4, L = 4096: ramp from floor(10.5) = 10 to ceil(22.5) = 23.
  EXPECT_NEAR(YarnCorrectionDim(64, 1e4, 4096, 32), 10.5, 0.05);
  EXPECT_NEAR(YarnCorrectionDim(64, 1e4, 4096, 1), 22.5, 0.05);
  for (int i : {0, 5, 10}) EXPECT_EQ(b->inv_freq(1)[i], b->inv_freq(0)[i]) << i;
  for (int i : {23, 31}) EXPECT_NEAR(b->inv_freq(1)[i], b->inv_freq(0)[i] / 8.0, 1e-6 * b->inv_freq(0)[i]) << i;
  EXPECT_LT(b->inv_freq(1)[16], b->inv_freq(0)[16]);
  EXPECT_GT(b->inv_freq(1)[16], b->inv_freq(0)[16] / 8.0f);
}

TEST(RopePlanYarnTest, RejectsBadYarnOrMixedScalingNamingTheLayer) {
  const RopeLayer ok = [] {
    RopeLayer r{true, 1e4, 1.0};
    r.yarn = YarnScaling{.factor = 4.0, .original_context = 32};
    return r;
  }();
  for (auto edit : std::vector<void (*)(RopeLayer&)>{
           [](RopeLayer& r) { r.yarn->factor = 0; },
           [](RopeLayer& r) { r.yarn->original_context = 0; },
           [](RopeLayer& r) { r.yarn->beta_fast = -1; },
           [](RopeLayer& r) { r.yarn->beta_slow = std::numeric_limits<double>::quiet_NaN(); },
           [](RopeLayer& r) { r.freq_factors = {1.0f, 2.0f, 4.0f, 4.0f}; },
           [](RopeLayer& r) { r.freq_scale = 0.5; },
           [](RopeLayer& r) { r.attention_factor = 0; },
           [](RopeLayer& r) { r.attention_factor = std::numeric_limits<double>::infinity(); },
       }) {
    RopeLayer r = ok;
    edit(r);
    auto plan = RopePlan::Create(std::vector<RopeLayer>{ok, r}, 8);
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("layer 1"), std::string::npos) << plan.status();
  }
  EXPECT_TRUE(RopePlan::Create(std::vector<RopeLayer>{ok}, 8).ok());
}

// cos and sin both carry the variant's attention factor (HF multiplies
// emb.cos() and emb.sin() by attention_scaling).
TEST(DecodeTokenHostTest, AttentionFactorScalesCosAndSin) {
  RopeLayer plain{true, 1e4, 1.0};
  RopeLayer scaled = plain;
  scaled.attention_factor = 1.25;
  auto rope = RopePlan::Create(std::vector<RopeLayer>{plain, scaled}, 8);
  auto mask = MaskPlan::Create(std::vector<int32_t>{0, 0});
  ASSERT_TRUE(rope.ok() && mask.ok());
  ASSERT_EQ(rope->n_variants(), 2);
  DecodeTokenHost host;
  ASSERT_TRUE(compute_decode_token_host(*mask, *rope, std::vector<int32_t>{1, 2}, 40, &host).ok());
  const size_t per_variant = 2 * 4;
  for (size_t i = 0; i < per_variant; ++i) {
    EXPECT_EQ(host.rope_cos[per_variant + i], host.rope_cos[i] * 1.25f) << i;
    EXPECT_EQ(host.rope_sin[per_variant + i], host.rope_sin[i] * 1.25f) << i;
  }
}

// The mask bounds against a dense reference built straight from the seed's
// definition (query i sees key j iff i - w < j <= i), at the lengths where
// sliding windows go wrong: w-1, w, w+1, 2w.
TEST(DecodeMaskTest, BoundsMatchDenseDefinitionAroundTheWindow) {
  const int32_t w = 4;
  auto plan = MaskPlan::Create(std::vector<int32_t>{w, 0});
  ASSERT_TRUE(plan.ok());
  for (int32_t len : {w - 1, w, w + 1, 2 * w, 2 * w + 1}) {
    for (int32_t seq : {1, 3}) {
      const int32_t pos0 = len;  // queries at positions len .. len+seq-1
      std::vector<int32_t> bounds(static_cast<size_t>(plan->n_variants()) * seq * 2);
      std::vector<int32_t> positions(static_cast<size_t>(seq));
      for (int32_t i = 0; i < seq; ++i) positions[static_cast<size_t>(i)] = pos0 + i;
      build_decode_mask_variants(*plan, positions, bounds.data());
      for (int32_t v = 0; v < plan->n_variants(); ++v) {
        const int32_t win = plan->window(v);
        for (int32_t i = 0; i < seq; ++i) {
          const int32_t p = pos0 + i;
          const int32_t lo = bounds[(v * seq + i) * 2], hi = bounds[(v * seq + i) * 2 + 1];
          for (int32_t j = 0; j < p + 4; ++j) {
            const bool dense = j <= p && (win == 0 || p - win < j);
            EXPECT_EQ(dense, j >= lo && j < hi) << "len=" << len << " v=" << v << " i=" << i << " j=" << j;
          }
        }
      }
    }
  }
}

TEST(DecodeTokenHostTest, RopeTablesFollowTheFormulaPerVariant) {
  std::vector<RopeLayer> layers = {{true, 1e4, 1.0}, {true, 1e6, 0.5}};
  auto rope = RopePlan::Create(layers, 4);
  auto mask = MaskPlan::Create(std::vector<int32_t>{0, 0});
  ASSERT_TRUE(rope.ok() && mask.ok());
  DecodeTokenHost host;
  const std::vector<int32_t> tokens = {5, 6};
  ASSERT_TRUE(compute_decode_token_host(*mask, *rope, tokens, 7, &host).ok());
  EXPECT_EQ(host.positions, (std::vector<int32_t>{7, 8}));
  ASSERT_EQ(host.rope_cos.size(), 2u * 2u * 2u);
  // variant 1, token 1 (position 8, scaled to 4), frequency index 1: 1e6^(-2/4).
  const double angle = 8 * 0.5 * std::pow(1e6, -0.5);
  EXPECT_NEAR(host.rope_cos[(1 * 2 + 1) * 2 + 1], std::cos(angle), 1e-6);
  EXPECT_NEAR(host.rope_sin[(1 * 2 + 1) * 2 + 1], std::sin(angle), 1e-6);
}

TEST(DecodeTokenHostTest, EmptyStepIsInvalid) {
  auto rope = RopePlan::Create(std::vector<RopeLayer>{{true, 1e4, 1.0}}, 4);
  auto mask = MaskPlan::Create(std::vector<int32_t>{0});
  DecodeTokenHost host;
  EXPECT_EQ(compute_decode_token_host(*mask, *rope, {}, 0, &host).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace decoded
