// deepseek2 with YaRN RoPE scaling against Hugging Face transformers on tiny
// random-weight models (fixtures: tools/make_deepseek2_fixtures.py, factor 4
// over an original context of 32, prompt + decode running past it):
//   deepseek2yarn      DeepSeek-V2's own parameters (mscale = mscale_all_dim
//                      = 0.707, in the file as yarn_log_multiplier): cos/sin
//                      unscaled, softmax scale x mscale(4, 0.707)^2;
//   deepseek2liteyarn  factor and original context only: cos/sin x
//                      (0.1 ln 4 + 1), softmax scale unchanged.
// Logits over the whole prompt (D1, all rows) and every decode step (D2),
// teacher-forced; broken variants exceed the tolerance: YaRN ignored, the
// file's yarn_log_multiplier dropped (the softmax mscale lost and cos/sin
// scaled instead), the attention factor dropped. D2 equals D1 byte for byte,
// both KV-write offset paths agree, and a session builds its graph once.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "gtest/gtest.h"
#include "tests/common/edited_fixture.h"
#include "tests/common/hf_reference.h"
#include "tests/common/plan_override_model.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;

// Measured max |ours - HF| (printed below): see docs/families.md; the broken
// variants miss by orders of magnitude more.
constexpr double kTolerance = 5e-5;

// The fixture's model with every layer's RoPE entry edited.
wt::PlanOverrideModel WithRopeEdited(const DecodeModel& base, void (*edit)(RopeLayer&)) {
  const RopePlan& rp = base.rope_plan();
  std::vector<RopeLayer> layers;
  for (int32_t il = 0; il < base.dims().n_layers; ++il) {
    RopeLayer r = rp.variant(rp.variant_of(il));
    edit(r);
    layers.push_back(std::move(r));
  }
  return wt::PlanOverrideModel(base, std::nullopt,
                               *RopePlan::Create(layers, rp.head_dim(), rp.pairing(), rp.rot_dims()));
}

class Deepseek2YarnTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Deepseek2YarnTest, LogitsMatchTransformersWithinTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), "deepseek2");
  const nlohmann::json& rp = f.ref["config"]["rope_parameters"];
  ASSERT_EQ(rp["rope_type"], "yarn");
  EXPECT_GT(f.ref["prompt_ids"].size() + f.ref["decode_ids"].size(), rp["original_max_position_embeddings"]);
  const double err = wt::MaxAbsErrorVsHf(*f.model, f.ref);
  std::printf("[ measured ] %s: max |ours - HF| = %.3g over %zu prompt rows + %zu decode steps\n", GetParam().c_str(),
              err, f.ref["prompt_ids"].size(), f.ref["decode_ids"].size());
  EXPECT_LT(err, kTolerance);
}

// The plan holds the config's YaRN over the rope parts (qk_rope_head_dim
// wide), with HF's cos/sin factor.
TEST_P(Deepseek2YarnTest, PlanHoldsTheConfigsYarn) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const nlohmann::json& rp = f.ref["config"]["rope_parameters"];
  const RopePlan& plan = f.model->rope_plan();
  ASSERT_EQ(plan.n_variants(), 1);
  EXPECT_EQ(plan.rot_dims(), f.ref["config"]["qk_rope_head_dim"].get<int32_t>());
  const RopeLayer& r = plan.variant(0);
  ASSERT_TRUE(r.yarn.has_value());
  const double factor = rp["factor"];
  EXPECT_EQ(r.yarn->factor, factor);
  EXPECT_EQ(r.yarn->original_context, rp["original_max_position_embeddings"].get<int32_t>());
  EXPECT_EQ(r.yarn->beta_fast, rp.value("beta_fast", 32.0));
  EXPECT_EQ(r.yarn->beta_slow, rp.value("beta_slow", 1.0));
  const double want = rp.contains("mscale_all_dim") ? 1.0 : 0.1 * std::log(factor) + 1.0;
  EXPECT_DOUBLE_EQ(r.attention_factor, want);
}

TEST_P(Deepseek2YarnTest, IgnoringYarnExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const wt::PlanOverrideModel broken = WithRopeEdited(*f.model, [](RopeLayer& r) {
    r.yarn.reset();
    r.attention_factor = 1.0;
  });
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] %s without YaRN frequencies: max err %.6g\n", GetParam().c_str(), err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST_P(Deepseek2YarnTest, HeldPlanIsByteIdenticalToRebuildAndBuildsOnce) {
  // positions 28 .. 39, past the original context of 32
  wt::ExpectHeldPlanEqualsRebuildWithOneBuild(wt::LoadHfFixture(GetParam()), /*n=*/12);
}

TEST_P(Deepseek2YarnTest, DeviceOffsetAndSymbolPathsGiveIdenticalLogits) {
  wt::HfFixture dev = wt::LoadHfFixture(GetParam(), KvOffsetPath::kDeviceOffset);
  wt::HfFixture sym = wt::LoadHfFixture(GetParam(), KvOffsetPath::kSymbol);
  ASSERT_NE(dev.model, nullptr);
  ASSERT_NE(sym.model, nullptr);
  CpuExecutor ex(2);
  const DecodeModel& m = *dev.model;
  auto kv_d = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), 64);
  auto kv_s = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), 64);
  DecodeSession sd, ss;
  // 40 tokens from position 0: through and past the original context.
  const std::vector<float> a = wt::DecodeSteps(*dev.model, *kv_d, sd, ex, 1, 40, true);
  const std::vector<float> b = wt::DecodeSteps(*sym.model, *kv_s, ss, ex, 1, 40, true);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 40u * m.dims().vocab);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  drop_decode_session(sd);
  drop_decode_session(ss);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Deepseek2YarnTest, ::testing::Values("deepseek2yarn", "deepseek2liteyarn"),
                         [](const auto& info) { return info.param; });

// deepseek2yarn without its yarn_log_multiplier: read as a config without
// mscale_all_dim, the softmax scale loses mscale(4, 0.707)^2 and cos/sin take
// 0.1 ln 4 + 1 instead.
TEST(Deepseek2YarnMscaleTest, DroppingTheLogMultiplierExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("deepseek2yarn");
  ASSERT_NE(f.model, nullptr);
  auto broken = wt::LoadEditedFixture("deepseek2yarn_tiny.gguf",
                                      {{"deepseek2.rope.scaling.yarn_log_multiplier", wt::kF32, "", true}});
  ASSERT_TRUE(broken.ok()) << broken.status();
  EXPECT_NE((*broken)->rope_plan().variant(0).attention_factor, f.model->rope_plan().variant(0).attention_factor);
  EXPECT_NE((*broken)->structural_hash(), f.model->structural_hash());
  const double err = wt::MaxAbsErrorVsHf(**broken, f.ref);
  std::printf("[ measured ] deepseek2yarn without yarn_log_multiplier: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

// deepseek2liteyarn's cos/sin factor 0.1 ln 4 + 1 set to 1.
TEST(Deepseek2YarnMscaleTest, DroppingTheAttentionFactorExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("deepseek2liteyarn");
  ASSERT_NE(f.model, nullptr);
  ASSERT_NE(f.model->rope_plan().variant(0).attention_factor, 1.0);
  const wt::PlanOverrideModel broken = WithRopeEdited(*f.model, [](RopeLayer& r) { r.attention_factor = 1.0; });
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] deepseek2liteyarn without the attention factor: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

}  // namespace
}  // namespace decoded
