// Gemma 3 through the shared driver against Hugging Face transformers on tiny
// random-weight models (fixtures: tools/make_gemma3_fixture.py). Logits are
// compared over the whole prompt (D1, all rows) and 10 decode steps (D2),
// teacher-forced with HF's tokens; the windows cross window-1, window,
// window+1 and 2*window. Deliberately broken variants (window off by one,
// local/global RoPE bases swapped, wrong attention scale) must exceed the
// tolerance, so the tolerance is known to catch those bugs.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/decode_driver.h"
#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model_path.h"
#include "tests/common/plan_override_model.h"

namespace decoded {
namespace {

// Measured max |ours - HF| (printed by LogitsMatchTransformersWithinTolerance):
// swa 6.7e-6, softcap 4.5e-6, f16 4.8e-6 (f32 summation order). The tolerance
// leaves ~7x headroom; the broken variants miss by 0.7 to 6.4.
constexpr double kTolerance = 5e-5;

struct Fixture {
  nlohmann::json ref;
  std::shared_ptr<const Weights> weights;
  std::unique_ptr<DecodeModel> model;
};

Fixture LoadFixture(const std::string& name) {
  Fixture f;
  std::ifstream in(testing::TestDataPath("gemma3_tiny_" + name + ".json"));
  EXPECT_TRUE(in.good()) << name;
  f.ref = nlohmann::json::parse(in);
  auto file = GgufFile::Open(testing::TestDataPath("gemma3_tiny_" + name + ".gguf"));
  EXPECT_TRUE(file.ok()) << file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok());
  f.weights = *weights;
  auto model = CreateFamily(f.weights);
  EXPECT_TRUE(model.ok()) << model.status();
  f.model = *std::move(model);
  return f;
}

using testing::PlanOverrideModel;

// Max |ours - reference| over prefill rows and every decode step.
double MaxAbsError(const DecodeModel& model, const nlohmann::json& ref) {
  CpuExecutor ex(2);
  const std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> forced = ref["decode_ids"].get<std::vector<int32_t>>();
  const auto& prefill_ref = ref["prefill_logits"];
  const auto& step_ref = ref["logits"];
  const int32_t vocab = model.dims().vocab;
  auto kv = KvCache::Create(model.backend(), model.dims().n_layers, model.dims().n_kv_heads, model.dims().head_dim,
                            64);
  EXPECT_TRUE(kv.ok());
  double worst = 0;
  auto compare = [&](absl::Span<const float> got, const nlohmann::json& want) {
    EXPECT_EQ(static_cast<int32_t>(want.size()), vocab);
    for (int32_t i = 0; i < vocab; ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got[static_cast<size_t>(i)]) - want[i].get<double>()));
    }
  };
  auto prefill = forward_with_kv_context(model, **kv, prompt, /*all_logits=*/true, ex);
  EXPECT_TRUE(prefill.ok()) << prefill.status();
  if (!prefill.ok()) return 1e9;
  for (size_t row = 0; row < prompt.size(); ++row) {
    compare(absl::MakeConstSpan(*prefill).subspan(row * vocab, vocab), prefill_ref[row]);
  }
  compare(absl::MakeConstSpan(*prefill).subspan((prompt.size() - 1) * vocab, vocab), step_ref[0]);
  DecodeSession session;
  for (size_t k = 0; k < forced.size(); ++k) {
    auto step = forward_with_kv_context_persistent(model, **kv, session, forced[k], ex);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return 1e9;
    compare(*step, step_ref[k + 1]);
  }
  return worst;
}

class Gemma3ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Gemma3ReferenceTest, LogitsMatchTransformersWithinTolerance) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const double err = MaxAbsError(*f.model, f.ref);
  std::printf("[ measured ] %s: max |ours - HF| = %.3g over %zu prompt rows + %zu decode steps\n",
              GetParam().c_str(), err, f.ref["prompt_ids"].size(), f.ref["decode_ids"].size());
  EXPECT_LT(err, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Gemma3ReferenceTest, ::testing::Values("swa", "softcap", "f16"));

TEST(Gemma3BrokenVariantTest, WindowOffByOneExceedsTolerance) {
  Fixture f = LoadFixture("swa");
  ASSERT_NE(f.model, nullptr);
  std::vector<int32_t> windows;
  const MaskPlan& mp = f.model->mask_plan();
  for (int32_t il = 0; il < mp.n_layers(); ++il) {
    const int32_t w = mp.window(mp.variant_of(il));
    windows.push_back(w == 0 ? 0 : w + 1);
  }
  PlanOverrideModel broken(*f.model, *MaskPlan::Create(windows), std::nullopt);
  const double err = MaxAbsError(broken, f.ref);
  std::printf("[ measured ] window+1: max err %.3g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST(Gemma3BrokenVariantTest, SwappedRopeBasesExceedTolerance) {
  Fixture f = LoadFixture("swa");
  ASSERT_NE(f.model, nullptr);
  ASSERT_EQ(f.model->rope_plan().n_variants(), 2);
  PlanOverrideModel broken = PlanOverrideModel::SwappedRopeBases(*f.model);
  const double err = MaxAbsError(broken, f.ref);
  std::printf("[ measured ] swapped RoPE bases: max err %.3g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST(Gemma3BrokenVariantTest, GlobalOnlyAttentionExceedsTolerance) {
  Fixture f = LoadFixture("swa");
  ASSERT_NE(f.model, nullptr);
  PlanOverrideModel broken(*f.model, *MaskPlan::Create(std::vector<int32_t>(f.model->dims().n_layers, 0)),
                           std::nullopt);
  const double err = MaxAbsError(broken, f.ref);
  std::printf("[ measured ] no sliding window: max err %.3g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

}  // namespace
}  // namespace decoded
