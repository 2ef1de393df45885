// What SmolLM3 adds to the Llama layer, against Hugging Face transformers
// (SmolLM3ForCausalLM, tools/make_phi2_smollm3_fixtures.py, 5 layers): no
// RoPE on every 4th layer. The family states it as a RopePlan whose NoPE
// layers have no variant, so those layers build no RoPE node; rotating them
// anyway must exceed the tolerance. The Llama-layer checks (tolerance, other
// pairing, D2 == D1, one build per session, both offset paths) run on this
// fixture in llama_reference_test.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/decode_driver.h"
#include "gtest/gtest.h"
#include "tests/common/hf_reference.h"
#include "tests/common/plan_override_model.h"

namespace decoded {
namespace {

using testing::HfFixture;

// As llama_reference_test (measured there for smollm3: 8.5e-6 in Release,
// 1.2e-5 in RelWithDebInfo with the sanitizers).
constexpr double kTolerance = 5e-5;

HfFixture LoadSmolLM3() {
  return testing::LoadHfFixture("smollm3");
}

TEST(SmolLM3Test, EveryFourthLayerIsNoPeAsTransformersConfiguresIt) {
  HfFixture f = LoadSmolLM3();
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), "smollm3");
  const RopePlan& rp = f.model->rope_plan();
  const std::vector<int32_t> hf = f.ref["config"]["no_rope_layers"].get<std::vector<int32_t>>();  // 1: RoPE
  ASSERT_EQ(static_cast<int32_t>(hf.size()), f.model->dims().n_layers);
  ASSERT_GE(hf.size(), 5u);  // a NoPE layer with a rotating layer after it
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    EXPECT_EQ(rp.variant_of(il) >= 0, hf[static_cast<size_t>(il)] == 1) << "layer " << il;
    EXPECT_EQ(rp.variant_of(il) < 0, (il + 1) % 4 == 0) << "layer " << il;
  }
  EXPECT_EQ(rp.n_variants(), 1);
  EXPECT_EQ(rp.pairing(), RopePairing::kAdjacent);
}

TEST(SmolLM3Test, NoPeLayersBuildNoRopeNode) {
  HfFixture f = LoadSmolLM3();
  ASSERT_NE(f.model, nullptr);
  DecodeTokenHost host;
  ASSERT_TRUE(compute_decode_token_host(f.model->mask_plan(), f.model->rope_plan(), std::vector<int32_t>{1, 2}, 0,
                                        &host)
                  .ok());
  const Graph g = build_decode_graph(*f.model, host, DataMode::kBaked, false);
  std::vector<int> ropes(static_cast<size_t>(f.model->dims().n_layers), 0);
  for (const Node& n : g.nodes()) {
    if (n.op != Op::kRope) continue;
    for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
      if (n.name.rfind(absl::StrCat("blk.", il, "."), 0) == 0) ++ropes[static_cast<size_t>(il)];
    }
  }
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    EXPECT_EQ(ropes[static_cast<size_t>(il)], (il + 1) % 4 == 0 ? 0 : 2) << "layer " << il;  // q and k
  }
}

TEST(SmolLM3BrokenVariantTest, RopeOnTheNoPeLayersExceedsTolerance) {
  HfFixture f = LoadSmolLM3();
  ASSERT_NE(f.model, nullptr);
  testing::PlanOverrideModel broken = testing::PlanOverrideModel::RopeOnEveryLayer(*f.model);
  ASSERT_GE(broken.rope_plan().variant_of(3), 0);
  const double ok = testing::MaxAbsErrorVsHf(*f.model, f.ref);
  const double err = testing::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] smollm3: %.3g; with RoPE on the NoPE layer: max err %.3g\n", ok, err);
  EXPECT_LT(ok, kTolerance);
  EXPECT_GT(err, 10 * kTolerance);
}

}  // namespace
}  // namespace decoded
