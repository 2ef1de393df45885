// The Llama-style families (llama, qwen2, smollm3) through the shared driver
// against Hugging Face transformers on tiny random-weight models (fixtures:
// tools/make_llama_fixture.py, tools/make_phi2_smollm3_fixtures.py). Logits are compared over the whole prompt
// (D1, all rows) and 10 decode steps (D2), teacher-forced with HF's tokens.
// Deliberately broken variants (the other RoPE pairing; Qwen2's q/k/v biases
// zeroed) must exceed the tolerance. D2 logits equal D1's byte for byte, both
// KV-write offset paths agree, and a session builds its graph once.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/decode_driver.h"
#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/hf_reference.h"
#include "tests/common/model_path.h"
#include "tests/common/plan_override_model.h"

namespace decoded {
namespace {

// Measured max |ours - HF| (printed by LogitsMatchTransformersWithinTolerance):
// llama 1.8e-5, qwen2 4.1e-6, smollm3 8.5e-6 (1.2e-5 in the sanitizer build)
// (f32 summation order; HF's own cached and uncached llama logits differ by
// 1.8e-5). The broken variants miss by 3.7 (qwen2, other pairing or no
// biases) to 15.9 (llama, other pairing); smollm3's other pairing by 15.0.
constexpr double kTolerance = 5e-5;

namespace wt = ::decoded::testing;
using Fixture = wt::HfFixture;

Fixture LoadFixture(const std::string& name, std::optional<KvOffsetPath> offset_path = std::nullopt) {
  return wt::LoadHfFixture(name, offset_path);
}

double MaxAbsError(const DecodeModel& model, const nlohmann::json& ref) {
  return wt::MaxAbsErrorVsHf(model, ref);
}

class LlamaStyleReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaStyleReferenceTest, LogitsMatchTransformersWithinTolerance) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), GetParam());
  const double err = MaxAbsError(*f.model, f.ref);
  std::printf("[ measured ] %s: max |ours - HF| = %.3g over %zu prompt rows + %zu decode steps\n",
              GetParam().c_str(), err, f.ref["prompt_ids"].size(), f.ref["decode_ids"].size());
  EXPECT_LT(err, kTolerance);
}

TEST_P(LlamaStyleReferenceTest, OtherRopePairingExceedsTolerance) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  testing::PlanOverrideModel broken = testing::PlanOverrideModel::OtherRopePairing(*f.model);
  ASSERT_NE(broken.rope_plan().pairing(), f.model->rope_plan().pairing());
  const double err = MaxAbsError(broken, f.ref);
  std::printf("[ measured ] %s with the other RoPE pairing: max err %.3g\n", GetParam().c_str(), err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST_P(LlamaStyleReferenceTest, HeldPlanIsByteIdenticalToRebuildAndBuildsOnce) {
  Fixture f = LoadFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const DecodeModel& m = *f.model;
  CpuExecutor ex(2);
  const std::vector<int32_t> prompt = f.ref["prompt_ids"].get<std::vector<int32_t>>();
  auto kv1 = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, 64);
  auto kv2 = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, 64);
  ASSERT_TRUE(forward_with_kv_context(m, *kv1, prompt, false, ex).ok());
  ASSERT_TRUE(forward_with_kv_context(m, *kv2, prompt, false, ex).ok());
  constexpr int kTokens = 10;
  DecodeSession unused, session;
  const int64_t b0 = GetEngineCounters().graph_builds, o0 = OptimizerRuns();
  const std::vector<float> d1 = wt::DecodeSteps(m, *kv1, unused, ex, 5, kTokens, /*persistent=*/false);
  const int64_t b1 = GetEngineCounters().graph_builds, o1 = OptimizerRuns();
  const std::vector<float> d2 = wt::DecodeSteps(m, *kv2, session, ex, 5, kTokens, /*persistent=*/true);
  const int64_t b2 = GetEngineCounters().graph_builds, o2 = OptimizerRuns();
  ASSERT_EQ(d1.size(), d2.size());
  EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0);
  EXPECT_EQ(b1 - b0, kTokens);  // the control rebuilds every token
  EXPECT_EQ(o1 - o0, kTokens);
  EXPECT_EQ(b2 - b1, 1);
  EXPECT_EQ(o2 - o1, 1);
  drop_decode_session(session);
}

TEST_P(LlamaStyleReferenceTest, DeviceOffsetAndSymbolPathsGiveIdenticalLogits) {
  Fixture dev = LoadFixture(GetParam(), KvOffsetPath::kDeviceOffset);
  Fixture sym = LoadFixture(GetParam(), KvOffsetPath::kSymbol);
  ASSERT_NE(dev.model, nullptr);
  ASSERT_NE(sym.model, nullptr);
  CpuExecutor ex(2);
  const DecodeModel& m = *dev.model;
  auto kv_d = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, 32);
  auto kv_s = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, 32);
  DecodeSession sd, ss;
  const std::vector<float> a = wt::DecodeSteps(*dev.model, *kv_d, sd, ex, 1, 8, true);
  const std::vector<float> b = wt::DecodeSteps(*sym.model, *kv_s, ss, ex, 1, 8, true);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  drop_decode_session(sd);
  drop_decode_session(ss);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaStyleReferenceTest, ::testing::Values("llama", "qwen2", "smollm3"));

// A copy of the qwen2 fixture with every q/k/v bias set to zero: the bytes of
// each bias tensor are found in the file (random floats: unique) and cleared.
TEST(Qwen2BrokenVariantTest, ZeroedQkvBiasesExceedTolerance) {
  Fixture f = LoadFixture("qwen2");
  ASSERT_NE(f.model, nullptr);
  std::ifstream in(testing::TestDataPath("qwen2_tiny.gguf"), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int zeroed = 0;
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    for (const char* b : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) {
      const WeightTensor* t = f.weights->Find("blk." + std::to_string(il) + "." + b);
      ASSERT_NE(t, nullptr);
      const auto* data = reinterpret_cast<const char*>(t->data);
      auto it = std::search(bytes.begin(), bytes.end(), data, data + t->row_bytes);
      ASSERT_NE(it, bytes.end());
      std::fill(it, it + static_cast<std::ptrdiff_t>(t->row_bytes), 0);
      ++zeroed;
    }
  }
  ASSERT_EQ(zeroed, 3 * f.model->dims().n_layers);
  const std::string path = ::testing::TempDir() + "qwen2_tiny_zero_bias.gguf";
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Fixture broken = wt::LoadHfGguf(path, "qwen2_tiny.json");
  ASSERT_NE(broken.model, nullptr);
  const double err = MaxAbsError(*broken.model, broken.ref);
  std::printf("[ measured ] qwen2 without q/k/v biases: max err %.3g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace decoded
