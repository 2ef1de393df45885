// qwen3, qwen3moe, phi3, glm4, llama with Llama 3 RoPE frequency scaling, and
// qwen2 / llama with YaRN (qwen2yarn: HF's default betas and attention
// factor; llamayarn: its own betas and attention factor), through the shared
// driver, against Hugging Face transformers on tiny random-weight models
// (fixtures: tools/make_llama_variant_fixtures.py). Logits are compared over
// the whole prompt (D1, all rows) and every decode step (D2), teacher-forced
// with HF's tokens. Each fixture's own broken variant must exceed the
// tolerance: Qwen3 without its q/k norms, Phi-3 with gate and up swapped or
// without its sliding window, Llama 3 without its frequency factors, the YaRN
// fixtures with YaRN ignored or without the attention factor, llamayarn with
// the default betas instead of the stated ones (what llama.cpp's llama loader
// computes); and for all the other RoPE pairing. D2 logits equal D1's byte for
// byte, both KV-write offset paths agree, and a session builds its graph once.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "gtest/gtest.h"
#include "models/llama_style.h"
#include "tests/common/hf_reference.h"
#include "tests/common/plan_override_model.h"
#include "tests/gguf/gguf_tensor_rewrite.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;

// Measured max |ours - HF| (printed by LogitsMatchTransformersWithinTolerance):
// qwen3 6.3e-6, phi3 2.3e-6, llama3rope 1.3e-5, glm4 3.3e-6 in Release and
// in RelWithDebInfo with the sanitizers (f32 summation order; HF's own cached
// and uncached logits differ by 4.3e-6, 1.9e-6, 8.6e-6 and 3.9e-6). glm4 with
// the other pairing (NeoX inside its rotated half) misses by 2.5. The broken
// variants miss by 3.0 (phi3, gate/up swapped or the other pairing) to 15.2
// (llama3rope, the other pairing); without its frequency factors llama3rope
// misses by 8.4, phi3 without its window by 4.0, qwen3 without q/k norm by 11.4.
constexpr double kTolerance = 5e-5;

struct Case {
  std::string fixture;  // tests/data/<fixture>_tiny.*
  std::string family;   // the family it loads as
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture; }

class LlamaVariantReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaVariantReferenceTest, LogitsMatchTransformersWithinTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam().fixture);
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), GetParam().family);
  const double err = wt::MaxAbsErrorVsHf(*f.model, f.ref);
  std::printf("[ measured ] %s: max |ours - HF| = %.3g over %zu prompt rows + %zu decode steps\n",
              GetParam().fixture.c_str(), err, f.ref["prompt_ids"].size(), f.ref["decode_ids"].size());
  EXPECT_LT(err, kTolerance);
}

TEST_P(LlamaVariantReferenceTest, OtherRopePairingExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam().fixture);
  ASSERT_NE(f.model, nullptr);
  wt::PlanOverrideModel broken = wt::PlanOverrideModel::OtherRopePairing(*f.model);
  ASSERT_NE(broken.rope_plan().pairing(), f.model->rope_plan().pairing());
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] %s with the other RoPE pairing: max err %.6g\n", GetParam().fixture.c_str(), err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST_P(LlamaVariantReferenceTest, HeldPlanIsByteIdenticalToRebuildAndBuildsOnce) {
  // past Phi-3's window of 6 and through Llama 3's scaled positions
  wt::ExpectHeldPlanEqualsRebuildWithOneBuild(wt::LoadHfFixture(GetParam().fixture), /*n=*/12);
}

TEST_P(LlamaVariantReferenceTest, DeviceOffsetAndSymbolPathsGiveIdenticalLogits) {
  wt::HfFixture dev = wt::LoadHfFixture(GetParam().fixture, KvOffsetPath::kDeviceOffset);
  wt::HfFixture sym = wt::LoadHfFixture(GetParam().fixture, KvOffsetPath::kSymbol);
  ASSERT_NE(dev.model, nullptr);
  ASSERT_NE(sym.model, nullptr);
  ASSERT_EQ(dev.model->kv_offset_path(), KvOffsetPath::kDeviceOffset);
  ASSERT_EQ(sym.model->kv_offset_path(), KvOffsetPath::kSymbol);
  CpuExecutor ex(2);
  const DecodeModel& m = *dev.model;
  auto kv_d = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, 32);
  auto kv_s = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, 32);
  DecodeSession sd, ss;
  const std::vector<float> a = wt::DecodeSteps(*dev.model, *kv_d, sd, ex, 1, 12, true);
  const std::vector<float> b = wt::DecodeSteps(*sym.model, *kv_s, ss, ex, 1, 12, true);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 12u * m.dims().vocab);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  drop_decode_session(sd);
  drop_decode_session(ss);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaVariantReferenceTest,
                         ::testing::Values(Case{"qwen3", "qwen3"}, Case{"qwen3moe", "qwen3moe"}, Case{"phi3", "phi3"},
                                           Case{"llama3rope", "llama"}, Case{"glm4", "glm4"},
                                           Case{"qwen2yarn", "qwen2"}, Case{"llamayarn", "llama"}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.fixture; });

// The fixture's model with every rotating layer's RoPE entry edited.
wt::PlanOverrideModel WithRopeEdited(const DecodeModel& base, void (*edit)(RopeLayer&)) {
  const RopePlan& rp = base.rope_plan();
  std::vector<RopeLayer> layers;
  for (int32_t il = 0; il < base.dims().n_layers; ++il) {
    const int32_t v = rp.variant_of(il);
    RopeLayer r = v < 0 ? RopeLayer{false, 0, 0} : rp.variant(v);
    if (v >= 0) edit(r);
    layers.push_back(std::move(r));
  }
  return wt::PlanOverrideModel(base, std::nullopt,
                               *RopePlan::Create(layers, rp.head_dim(), rp.pairing(), rp.rot_dims()));
}

class YarnTest : public ::testing::TestWithParam<std::string> {};

// The plan holds what the file states, as HF reads the same config.
TEST_P(YarnTest, PlanHoldsTheConfigsYarn) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const nlohmann::json& rp = f.ref["config"]["rope_parameters"];
  ASSERT_EQ(rp["rope_type"], "yarn");
  ASSERT_EQ(f.model->rope_plan().n_variants(), 1);
  const RopeLayer& r = f.model->rope_plan().variant(0);
  ASSERT_TRUE(r.yarn.has_value());
  const double factor = rp["factor"];
  EXPECT_EQ(r.yarn->factor, factor);
  EXPECT_EQ(r.yarn->original_context, rp["original_max_position_embeddings"].get<int32_t>());
  EXPECT_FLOAT_EQ(r.yarn->beta_fast, rp.value("beta_fast", 32.0));
  EXPECT_FLOAT_EQ(r.yarn->beta_slow, rp.value("beta_slow", 1.0));
  EXPECT_FLOAT_EQ(r.attention_factor, rp.value("attention_factor", 0.1 * std::log(factor) + 1.0));
  // The test runs past the original context.
  EXPECT_GT(f.ref["prompt_ids"].size() + f.ref["decode_ids"].size(), rp["original_max_position_embeddings"]);
}

TEST_P(YarnTest, IgnoringYarnExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const wt::PlanOverrideModel broken = WithRopeEdited(*f.model, [](RopeLayer& r) {
    r.yarn.reset();
    r.attention_factor = 1.0;
  });
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] %s without YaRN: max err %.6g\n", GetParam().c_str(), err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST_P(YarnTest, DroppingTheAttentionFactorExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  ASSERT_NE(f.model->rope_plan().variant(0).attention_factor, 1.0);
  const wt::PlanOverrideModel broken = WithRopeEdited(*f.model, [](RopeLayer& r) { r.attention_factor = 1.0; });
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] %s without the attention factor: max err %.6g\n", GetParam().c_str(), err);
  EXPECT_GT(err, 10 * kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, YarnTest, ::testing::Values("qwen2yarn", "llamayarn"),
                         [](const auto& info) { return info.param; });

// llamayarn states beta_fast 2 / beta_slow 0.1; llama.cpp's llama loader
// does not read those keys and ramps between HF's defaults 32 / 1 instead.
TEST(YarnBetaTest, DefaultBetasInsteadOfTheStatedOnesExceedTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("llamayarn");
  ASSERT_NE(f.model, nullptr);
  ASSERT_NE(f.model->rope_plan().variant(0).yarn->beta_fast, 32.0);
  const wt::PlanOverrideModel broken = WithRopeEdited(*f.model, [](RopeLayer& r) {
    r.yarn->beta_fast = 32.0;
    r.yarn->beta_slow = 1.0;
  });
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] llamayarn with the default betas: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

// Writes `bytes` to a temporary GGUF, loads it as `spec` (or through the
// registry when spec is null) and returns its max error against the
// fixture's reference.
double MaxErrorOfEditedFile(const std::string& fixture, const std::vector<uint8_t>& bytes,
                            const LlamaStyleSpec* spec) {
  const std::string path = wt::WriteTempFile(bytes, fixture + "_broken");
  double err = 1e9;
  if (spec == nullptr) {
    wt::HfFixture broken = wt::LoadHfGguf(path, fixture + "_tiny.json");
    if (broken.model != nullptr) err = wt::MaxAbsErrorVsHf(*broken.model, broken.ref);
  } else {
    wt::HfFixture ref = wt::LoadHfFixture(fixture);  // for the JSON
    auto file = GgufFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) {
      auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
      EXPECT_TRUE(weights.ok()) << weights.status();
      auto model = CreateLlamaStyle(*spec, *weights, FamilyOptions{});
      EXPECT_TRUE(model.ok()) << model.status();
      if (model.ok()) err = wt::MaxAbsErrorVsHf(**model, ref.ref);
    }
  }
  std::remove(path.c_str());
  return err;
}

// The same file with the q/k norms moved out of the layer's reach and loaded
// as the Qwen3 layer without them.
TEST(Qwen3BrokenVariantTest, SkippingQkNormExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("qwen3");
  ASSERT_NE(f.model, nullptr);
  std::vector<wt::TensorEdit> edits;
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    for (const char* norm : {"attn_q_norm", "attn_k_norm"}) {
      const std::string name = "blk." + std::to_string(il) + "." + norm;
      edits.push_back({name + ".weight", name + "_unused.weight", std::nullopt});
    }
  }
  const std::vector<uint8_t> bytes = wt::RewriteTensors(wt::ReadFileBytes(wt::TestDataPath("qwen3_tiny.gguf")), edits);
  ASSERT_FALSE(bytes.empty());
  const LlamaStyleSpec no_norm{.arch = "qwen3", .rope_pairing = RopePairing::kNeox, .qk_norm = false};
  const double err = MaxErrorOfEditedFile("qwen3", bytes, &no_norm);
  std::printf("[ measured ] qwen3 without q/k norm: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

// ffn_up holds [gate; up]: the same file with the halves exchanged.
TEST(Phi3BrokenVariantTest, SwappedGateUpHalvesExceedTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("phi3");
  ASSERT_NE(f.model, nullptr);
  std::vector<uint8_t> bytes = wt::ReadFileBytes(wt::TestDataPath("phi3_tiny.gguf"));
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    const std::string name = "blk." + std::to_string(il) + ".ffn_up.weight";
    const WeightTensor* t = f.weights->Find(name);
    ASSERT_NE(t, nullptr);
    const size_t half = static_cast<size_t>(t->rows / 2) * t->row_bytes;
    const auto* data = reinterpret_cast<const char*>(t->data);
    const std::string swapped = std::string(data + half, half) + std::string(data, half);
    ASSERT_TRUE(wt::OverwriteTensorData(bytes, name, swapped));
  }
  const double err = MaxErrorOfEditedFile("phi3", bytes, nullptr);
  std::printf("[ measured ] phi3 with gate and up swapped: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST(Phi3BrokenVariantTest, NoSlidingWindowExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("phi3");
  ASSERT_NE(f.model, nullptr);
  ASSERT_EQ(f.model->mask_plan().window(0), f.ref["config"]["sliding_window"].get<int32_t>());
  wt::PlanOverrideModel broken(*f.model, *MaskPlan::Create(std::vector<int32_t>(f.model->dims().n_layers, 0)),
                               std::nullopt);
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] phi3 without its sliding window: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST(Llama3RopeTest, FrequencyFactorsAreTheConvertersRopeFreqs) {
  wt::HfFixture f = wt::LoadHfFixture("llama3rope");
  ASSERT_NE(f.model, nullptr);
  const RopePlan& rp = f.model->rope_plan();
  ASSERT_EQ(rp.n_variants(), 1);
  EXPECT_EQ(rp.variant(0).freq_factors, f.ref["config"]["rope_freqs"].get<std::vector<float>>());
}

TEST(Llama3RopeTest, IgnoringFrequencyFactorsExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("llama3rope");
  ASSERT_NE(f.model, nullptr);
  const RopePlan& rp = f.model->rope_plan();
  RopeLayer plain = rp.variant(0);
  ASSERT_FALSE(plain.freq_factors.empty());
  plain.freq_factors.clear();
  wt::PlanOverrideModel broken(
      *f.model, std::nullopt,
      *RopePlan::Create(std::vector<RopeLayer>(f.model->dims().n_layers, plain), rp.head_dim(), rp.pairing()));
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] llama3rope without its frequency factors: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

}  // namespace
}  // namespace decoded
