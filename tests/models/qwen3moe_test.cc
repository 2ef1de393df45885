// qwen3moe beyond what the shared llama-style reference suite checks
// (llama_variants_reference_test runs its fixture for tolerance, D2 == D1,
// one build per session and both KV-write offset paths): the routing the
// fixture exercises, the broken routings that must miss HF's logits, the
// structural hash's dependence on k, and malformed or unsupported files
// refused naming the key or tensor. Fixture: tools/make_llama_variant_fixtures.py.
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/model_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/hf_reference.h"
#include "tests/gguf/gguf_tensor_rewrite.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

// The tolerance of llama_variants_reference_test (measured there: 2.1e-6).
constexpr double kTolerance = 5e-5;

std::vector<uint8_t> FixtureBytes() { return wt::ReadFileBytes(wt::TestDataPath("qwen3moe_tiny.gguf")); }

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadBytes(const std::vector<uint8_t>& bytes) {
  EXPECT_FALSE(bytes.empty());
  auto file = wt::OpenBytes(bytes, "qwen3moe");
  if (!file.ok()) return file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  if (!weights.ok()) return weights.status();
  return CreateFamily(*weights);
}

wt::KvEdit U32(const std::string& key, uint32_t v) { return {"qwen3moe." + key, wt::kU32, wt::Enc<uint32_t>(v)}; }
wt::KvEdit Bool(const std::string& key, bool v) {
  return {"qwen3moe." + key, wt::kBool, wt::Enc<uint8_t>(v ? 1 : 0)};
}

// Max error against the HF logits of the fixture rewritten by `edits` (and
// `data` overwrites); 1e9 if the file is refused.
double MaxErrorWith(const std::vector<wt::KvEdit>& edits,
                    const std::vector<std::pair<std::string, std::string>>& data = {}) {
  std::vector<uint8_t> bytes = wt::RewriteKvs(FixtureBytes(), edits);
  for (const auto& [name, d] : data) EXPECT_TRUE(wt::OverwriteTensorData(bytes, name, d));
  const std::string path = wt::WriteTempFile(bytes, "qwen3moe_broken");
  wt::HfFixture f = wt::LoadHfGguf(path, "qwen3moe_tiny.json");
  std::remove(path.c_str());
  return f.model == nullptr ? 1e9 : wt::MaxAbsErrorVsHf(*f.model, f.ref);
}

TEST(Qwen3MoeFixtureTest, LoadsWithItsRoutingAndItsTokensRouteDifferently) {
  wt::HfFixture f = wt::LoadHfFixture("qwen3moe");
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), "qwen3moe");
  EXPECT_EQ(f.model->rope_plan().pairing(), RopePairing::kNeox);
  // HF's choices per layer and position: consecutive tokens pick different
  // expert sets, so one held plan must follow data-dependent routing.
  const auto routing = f.ref["config"]["router_indices"];
  for (const auto& layer : routing) {
    int changes = 0;
    for (size_t pos = 1; pos < layer.size(); ++pos) {
      const auto a = layer[pos - 1].get<std::vector<int>>(), b = layer[pos].get<std::vector<int>>();
      changes += std::set<int>(a.begin(), a.end()) != std::set<int>(b.begin(), b.end());
    }
    EXPECT_GE(changes, static_cast<int>(layer.size()) / 2);
  }
}

TEST(Qwen3MoeBrokenVariantTest, TopKWithoutRenormalizationExceedsTolerance) {
  const double err = MaxErrorWith({Bool("expert_weights_norm", false)});
  std::printf("[ measured ] qwen3moe without renormalized top-k weights: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
  EXPECT_LT(err, 1e9);
}

TEST(Qwen3MoeBrokenVariantTest, OneExpertFewerExceedsTolerance) {
  const double err = MaxErrorWith({U32("expert_used_count", 1)});
  std::printf("[ measured ] qwen3moe with k - 1 = 1 expert: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
  EXPECT_LT(err, 1e9);
}

// A zero router gives every expert probability 1 / n_expert; with k =
// n_expert the FFN is the plain average of all experts.
TEST(Qwen3MoeBrokenVariantTest, DenseAverageOfAllExpertsExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture("qwen3moe");
  ASSERT_NE(f.model, nullptr);
  std::vector<std::pair<std::string, std::string>> zero_routers;
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    const std::string name = "blk." + std::to_string(il) + ".ffn_gate_inp.weight";
    const WeightTensor* t = f.weights->Find(name);
    ASSERT_NE(t, nullptr);
    zero_routers.push_back({name, std::string(t->row_bytes * static_cast<size_t>(t->rows), '\0')});
  }
  const double err = MaxErrorWith({U32("expert_used_count", 8)}, zero_routers);
  std::printf("[ measured ] qwen3moe as the dense average of all experts: max err %.6g\n", err);
  EXPECT_GT(err, 10 * kTolerance);
  EXPECT_LT(err, 1e9);
}

TEST(Qwen3MoeLoaderTest, StructuralHashDependsOnK) {
  auto base = LoadBytes(FixtureBytes());
  auto k1 = LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_used_count", 1)}));
  auto unnormed = LoadBytes(wt::RewriteKvs(FixtureBytes(), {Bool("expert_weights_norm", false)}));
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(k1.ok()) << k1.status();
  ASSERT_TRUE(unnormed.ok()) << unnormed.status();
  EXPECT_NE((*base)->structural_hash(), (*k1)->structural_hash());
  EXPECT_NE((*base)->structural_hash(), (*unnormed)->structural_hash());
}

void ExpectRefused(const absl::StatusOr<std::unique_ptr<DecodeModel>>& m, absl::StatusCode code,
                   const std::vector<std::string>& substrings) {
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status();
  for (const std::string& s : substrings) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(s)) << m.status();
}

TEST(Qwen3MoeLoaderTest, ExpertCountsOutOfRangeAreRefusedNamingTheKey) {
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_used_count", 0)})),
                absl::StatusCode::kInvalidArgument, {"qwen3moe.expert_used_count = 0", "out of range [1, 8]"});
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_used_count", 9)})),
                absl::StatusCode::kInvalidArgument, {"qwen3moe.expert_used_count = 9", "qwen3moe.expert_count"});
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {{"qwen3moe.expert_used_count", wt::kU32, "", true}})),
                absl::StatusCode::kInvalidArgument, {"qwen3moe.expert_used_count"});
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_count", 7)})),
                absl::StatusCode::kInvalidArgument,
                {"blk.0.ffn_gate_inp.weight", "qwen3moe.expert_count = 7", "requires 7 rows"});
}

TEST(Qwen3MoeLoaderTest, ExpertTensorShapesAreCheckedAgainstTheKeys) {
  // ffn_gate_exps with 7 planes of the 8 expert_count states.
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.1.ffn_gate_exps.weight", std::nullopt,
                                                               std::vector<uint64_t>{32, 16, 7}}})),
                absl::StatusCode::kInvalidArgument,
                {"blk.1.ffn_gate_exps.weight", "[7, 16, 32]", "qwen3moe.expert_count = 8", "planes"});
  // ffn_up_exps rows other than expert_feed_forward_length.
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.0.ffn_up_exps.weight", std::nullopt,
                                                               std::vector<uint64_t>{32, 8, 8}}})),
                absl::StatusCode::kInvalidArgument,
                {"blk.0.ffn_up_exps.weight", "qwen3moe.expert_feed_forward_length = 16", "rows"});
  // ffn_down_exps stored as gate/up are ([expert_ffn, hidden] per expert).
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.0.ffn_down_exps.weight", std::nullopt,
                                                               std::vector<uint64_t>{32, 16, 8}}})),
                absl::StatusCode::kInvalidArgument, {"blk.0.ffn_down_exps.weight", "qwen3moe.embedding_length"});
  // A 2-D tensor where the experts belong.
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.0.ffn_gate_exps.weight", std::nullopt,
                                                               std::vector<uint64_t>{32, 16}}})),
                absl::StatusCode::kInvalidArgument, {"blk.0.ffn_gate_exps.weight", "planes"});
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.1.ffn_down_exps.weight",
                                                               std::string("blk.1.ffn_down.weight"), std::nullopt}})),
                absl::StatusCode::kInvalidArgument, {"blk.1.ffn_down.weight", "routed experts"});
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.1.ffn_gate_inp.weight",
                                                               std::string("blk.1.router.weight"), std::nullopt}})),
                absl::StatusCode::kNotFound, {"blk.1.ffn_gate_inp.weight"});
}

TEST(Qwen3MoeLoaderTest, UnsupportedRoutingIsUnimplementedNamingTheKeyOrTensor) {
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_gating_func", 3)})),
                absl::StatusCode::kUnimplemented, {"qwen3moe.expert_gating_func = 3"});
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_shared_feed_forward_length", 16)})),
                absl::StatusCode::kUnimplemented, {"qwen3moe.expert_shared_feed_forward_length"});
  // Qwen2-MoE's sigmoid-gated shared expert.
  ExpectRefused(LoadBytes(wt::RewriteTensors(FixtureBytes(), {{"blk.0.ffn_gate_inp.weight",
                                                               std::string("blk.0.ffn_gate_inp_shexp.weight"),
                                                               std::nullopt}})),
                absl::StatusCode::kUnimplemented, {"blk.0.ffn_gate_inp_shexp.weight", "gated shared expert"});
}

// The shared routing keys (models/moe_ffn.h) hold for qwen3moe as for every
// MoE family: shared experts need their tensors, groups must divide.
TEST(Qwen3MoeLoaderTest, SharedExpertsAndGroupsAreCheckedAgainstTheTensors) {
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_shared_count", 1)})),
                absl::StatusCode::kNotFound, {"blk.0.ffn_gate_shexp.weight"});
  ExpectRefused(LoadBytes(wt::RewriteKvs(FixtureBytes(), {U32("expert_group_count", 3)})),
                absl::StatusCode::kInvalidArgument, {"qwen3moe.expert_group_count = 3", "does not divide"});
}

}  // namespace
}  // namespace decoded
