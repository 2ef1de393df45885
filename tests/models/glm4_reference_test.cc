// What GLM-4 adds to the Llama layer, against Hugging Face transformers
// (Glm4ForCausalLM, tools/make_llama_variant_fixtures.py, fixture glm4_tiny:
// 3 layers, head size 16 of which 8 rotate, GQA 2:1, q/k/v biases): partial
// rotary with adjacent pairs inside the rotated part, and sandwich norms on
// the attention and FFN outputs. Each must matter: the same model rotating
// whole heads, or without its post norms, exceeds the tolerance. The
// Llama-layer checks (tolerance, other pairing, D2 == D1 byte for byte, one
// build per session, both offset paths) run on this fixture in
// llama_variants_reference_test (Fixtures/*/glm4).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/decode_driver.h"
#include "gtest/gtest.h"
#include "models/llama_style.h"
#include "tests/common/hf_reference.h"
#include "tests/common/plan_override_model.h"
#include "tests/gguf/gguf_tensor_rewrite.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;

// As llama_variants_reference_test, where glm4's own error is measured.
constexpr double kTolerance = 5e-5;

TEST(Glm4Test, RotatesHalfOfEachHeadInAdjacentPairsAsTransformersDoes) {
  wt::HfFixture f = wt::LoadHfFixture("glm4");
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), "glm4");
  const RopePlan& rp = f.model->rope_plan();
  EXPECT_EQ(rp.head_dim(), 16);
  EXPECT_EQ(rp.rot_dims(), 8);  // partial_rotary_factor 0.5
  EXPECT_EQ(rp.pairing(), RopePairing::kAdjacent);
  EXPECT_EQ(rp.n_variants(), 1);
  ASSERT_EQ(rp.inv_freq(0).size(), 4u);
  EXPECT_FLOAT_EQ(rp.inv_freq(0)[1], 0.1f);  // 10000^(-2/8): spread over the rotated 8 dims, not the head's 16
  EXPECT_EQ(f.model->dims().n_heads * f.model->dims().head_dim, 64);  // q wider than hidden 32
}

TEST(Glm4BrokenVariantTest, RotatingWholeHeadsExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("glm4");
  ASSERT_NE(f.model, nullptr);
  wt::PlanOverrideModel broken = wt::PlanOverrideModel::FullRotary(*f.model);
  ASSERT_EQ(broken.rope_plan().rot_dims(), 16);
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] glm4 rotating whole heads: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

// The same file with the post norms moved out of the layer's reach, loaded as
// the GLM-4 layer without them.
TEST(Glm4BrokenVariantTest, SkippingSandwichNormsExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("glm4");
  ASSERT_NE(f.model, nullptr);
  std::vector<wt::TensorEdit> edits;
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    for (const char* norm : {"post_attention_norm", "post_ffw_norm"}) {
      const std::string name = absl::StrCat("blk.", il, ".", norm);
      edits.push_back({name + ".weight", name + "_unused.weight", std::nullopt});
    }
  }
  const std::vector<uint8_t> bytes = wt::RewriteTensors(wt::ReadFileBytes(wt::TestDataPath("glm4_tiny.gguf")), edits);
  ASSERT_FALSE(bytes.empty());
  const std::string path = wt::WriteTempFile(bytes, "glm4_no_post_norms");
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  ASSERT_TRUE(weights.ok()) << weights.status();
  const LlamaStyleSpec no_post_norms{.arch = "glm4",
                                     .rope_pairing = RopePairing::kAdjacent,
                                     .fused_gate_up = true,
                                     .partial_rotary = true,
                                     .post_norms = false};
  auto model = CreateLlamaStyle(no_post_norms, *weights, FamilyOptions{});
  ASSERT_TRUE(model.ok()) << model.status();
  const double err = wt::MaxAbsErrorVsHf(**model, f.ref);
  std::remove(path.c_str());
  std::printf("[ measured ] glm4 without its sandwich norms: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
}

TEST(Glm4Test, PostNormsAreInTheGraphUnderTheirGgufNames) {
  wt::HfFixture f = wt::LoadHfFixture("glm4");
  ASSERT_NE(f.model, nullptr);
  DecodeTokenHost host;
  ASSERT_TRUE(compute_decode_token_host(f.model->mask_plan(), f.model->rope_plan(), std::vector<int32_t>{1, 2}, 0,
                                        &host)
                  .ok());
  const Graph g = build_decode_graph(*f.model, host, DataMode::kBaked, false);
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    for (const char* norm : {"post_attention_norm", "post_ffw_norm"}) {
      const std::string name = absl::StrCat("blk.", il, ".", norm);
      int found = 0;
      for (const Node& n : g.nodes()) found += n.name == name && n.op == Op::kRmsNorm;
      EXPECT_EQ(found, 1) << name;
    }
  }
}

}  // namespace
}  // namespace decoded
