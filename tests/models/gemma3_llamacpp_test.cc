// The real model (Gemma 3 270M Q4_K_M) against llama.cpp on the same file
// (tests/data/gemma3_270m_llamacpp.json, from tools/gen_llamacpp_reference.py).
//
// Why not "identical greedy continuations": both engines quantize every
// matmul's activations to 8 bits (Q8_0 / Q8_K), and on this model that makes
// logits chaotic: nudging the input embeddings by 1e-6 (relative) moves a top
// logit by up to +-0.5 in llama.cpp's own arithmetic, and llama.cpp with and
// without its weight repacking differs by 0.1 (docs/reference-data.md,
// "llama.cpp agreement"); llama.cpp with repacking off, or on 1 thread instead
// of 2, reproduces only 4 of its own 7 greedy continuations
// (tools/llamacpp_self_consistency.py). Two correct implementations that sum in a different
// order therefore agree on the argmax only where the top-2 gap exceeds that
// noise. The test asserts exactly that, teacher-forced on llama.cpp's 32
// tokens for every prompt:
//   - wherever llama.cpp's top1-top2 gap exceeds kNoise, our argmax is its token;
//   - everywhere, llama.cpp's token is within kNoise of our best logit;
//   - the first 4 steps' top-40 logits agree within measured bounds;
// and a deliberately broken model (local/global RoPE bases swapped) fails.
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
#include "tests/common/llamacpp_agreement.h"
#include "tests/common/plan_override_model.h"

namespace decoded {
namespace {

// Noise floor of 8-bit-activation arithmetic on this model (see above).
constexpr double kNoise = 0.5;
// Bounds on |ours - llama.cpp| over the top-40 logits of the first 4 steps of
// every prompt. Measured: mean 0.27, max 1.2 (a low-ranked entry); the broken
// model below measures mean 1.25.
constexpr double kMeanLogitTolerance = 0.45;
constexpr double kMaxLogitTolerance = 2.5;

using testing::Agreement;
using testing::LlamaCppComparator;

class LlamaCppReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DECODED_REQUIRE_REAL_MODEL();
    std::ifstream in(testing::TestDataPath("gemma3_270m_llamacpp.json"));
    ASSERT_TRUE(in.good());
    ref_ = nlohmann::json::parse(in);
    auto file = GgufFile::Open(testing::RealModelPath());
    ASSERT_TRUE(file.ok()) << file.status();
    auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
    ASSERT_TRUE(weights.ok());
    weights_ = *weights;
    auto model = CreateFamily(weights_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  nlohmann::json ref_;
  std::shared_ptr<const Weights> weights_;
  std::unique_ptr<DecodeModel> model_;
};

TEST_F(LlamaCppReferenceTest, GreedyTokensAndLogitsAgreeWithinTheQuantizationNoise) {
  ASSERT_GE(ref_["cases"].size(), 5u);
  const Agreement a = LlamaCppComparator(*model_, ref_, kNoise).Run();
  std::printf("[ measured ] %d teacher-forced steps over %zu prompts: argmax equal at %d; top-40 logits of steps 0-3: "
              "mean |d| %.3f, max |d| %.3f\n",
              a.steps, ref_["cases"].size(), a.exact_argmax, a.mean_abs, a.max_abs);
  for (const auto& n : a.notes) std::printf("             %s\n", n.c_str());
  EXPECT_EQ(a.steps, 32 * static_cast<int>(ref_["cases"].size()));
  EXPECT_EQ(a.violations, 0);
  EXPECT_LT(a.mean_abs, kMeanLogitTolerance);
  EXPECT_LT(a.max_abs, kMaxLogitTolerance);
}

TEST_F(LlamaCppReferenceTest, BrokenRopeIsFarOutsideTheTolerances) {
  testing::PlanOverrideModel broken = testing::PlanOverrideModel::SwappedRopeBases(*model_);
  const Agreement a = LlamaCppComparator(broken, ref_, kNoise).Run();
  std::printf("[ measured ] swapped RoPE bases: argmax equal at %d of %d, violations %d, mean |d| %.3f\n",
              a.exact_argmax, a.steps, a.violations, a.mean_abs);
  EXPECT_GT(a.violations, 0);
  EXPECT_GT(a.mean_abs, kMeanLogitTolerance);
}

}  // namespace
}  // namespace decoded
