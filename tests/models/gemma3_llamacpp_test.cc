// The real model (Gemma 3 270M Q4_K_M) against llama.cpp on the same file
// (tests/data/gemma3_270m_llamacpp.json from tools/gen_llamacpp_reference.py):
// free-running greedy continuations of every prompt, 32 tokens, must be
// identical, and the raw logits of the first steps (top 40 of llama.cpp's
// row) must agree within a measured tolerance. Both engines quantize
// activations to Q8_0/Q8_K the same way; they differ in summation order and
// in llama.cpp's f16 GELU table, hence a tolerance rather than equality.
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

namespace decoded {
namespace {

// Measured max |ours - llama.cpp| over the top-40 logits of the first 4
// steps of all prompts: printed by the test ("[ measured ]"). The tolerance
// leaves headroom over that; a broken model (see the HF tests) misses by > 0.5.
constexpr double kLogitTolerance = 0.05;

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

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

TEST_F(LlamaCppReferenceTest, GreedyContinuationsAndFirstLogitsMatch) {
  CpuExecutor ex(2);
  double worst = 0;
  int cases = 0;
  for (const auto& c : ref_["cases"]) {
    const std::string name = c["name"];
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    const DecodeDims& d = model_->dims();
    auto kv = KvCache::Create(model_->backend(), d.n_layers, d.n_kv_heads, d.head_dim, 128);
    ASSERT_TRUE(kv.ok());
    auto first = forward_with_kv_context(*model_, **kv, prompt, false, ex);
    ASSERT_TRUE(first.ok()) << first.status();
    std::vector<float> logits = *first;
    std::vector<int32_t> got;
    DecodeSession session;
    for (size_t step = 0; step < want.size(); ++step) {
      if (step < c["top_logits"].size()) {
        for (const auto& pair : c["top_logits"][step]["top"]) {
          const int32_t id = pair[0];
          worst = std::max(worst, std::abs(static_cast<double>(logits[static_cast<size_t>(id)]) -
                                           pair[1].get<double>()));
        }
      }
      const int32_t tok = Argmax(logits);
      got.push_back(tok);
      if (step + 1 == want.size()) break;
      auto next = forward_with_kv_context_persistent(*model_, **kv, session, tok, ex);
      ASSERT_TRUE(next.ok()) << next.status();
      logits.assign(next->begin(), next->end());
    }
    EXPECT_EQ(got, want) << "greedy continuation of '" << name << "' differs from llama.cpp";
    ++cases;
  }
  std::printf("[ measured ] %d prompts x 32 tokens; max |ours - llama.cpp| over top-40 logits of steps 0-3: %.4g\n",
              cases, worst);
  EXPECT_GE(cases, 5);
  EXPECT_LT(worst, kLogitTolerance);
}

}  // namespace
}  // namespace decoded
