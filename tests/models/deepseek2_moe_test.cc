// deepseek2's DeepSeekMoE layers beyond what deepseek2_reference_test checks
// for every deepseek2 fixture (tolerance, D2 == D1, one build per session,
// both offset paths): the routing the MoE fixtures exercise, broken routings
// that must miss HF's logits, the structural hash's dependence on the
// routing keys, and malformed routing refused naming the key or tensor.
// Fixtures (tools/make_deepseek2_fixtures.py), both 3 layers, the first
// dense, then 8 routed experts of 16 in 4 groups, 2 groups kept, 3 used,
// routed_scaling_factor 2.5:
//   deepseek2moe_tiny  HF DeepseekV2ForCausalLM: softmax, groups scored by
//                      their best expert, no renormalization, 2 shared
//                      experts;
//   deepseek3_tiny     HF DeepseekV3ForCausalLM: sigmoid, exp_probs_b
//                      selection bias, groups scored by their best two,
//                      renormalized, 1 shared expert.
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/edited_fixture.h"
#include "tests/common/hf_reference.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

// deepseek2_reference_test's tolerance.
constexpr double kTolerance = 5e-5;

constexpr char kV2[] = "deepseek2moe";
constexpr char kV3[] = "deepseek3";

std::string GgufName(const std::string& fixture) { return fixture + "_tiny.gguf"; }

wt::KvEdit U32(const std::string& key, uint32_t v) { return {"deepseek2." + key, wt::kU32, wt::Enc<uint32_t>(v)}; }
wt::KvEdit F32(const std::string& key, float v) { return {"deepseek2." + key, wt::kF32, wt::Enc<float>(v)}; }
wt::KvEdit Bool(const std::string& key, bool v) {
  return {"deepseek2." + key, wt::kBool, wt::Enc<uint8_t>(v ? 1 : 0)};
}
wt::KvEdit Removed(const std::string& key) { return {"deepseek2." + key, wt::kU32, "", true}; }

// Zeroed data for every MoE layer's tensor `suffix` (e.g. "ffn_down_shexp.weight").
std::vector<std::pair<std::string, std::string>> Zeroed(const wt::HfFixture& f, const std::string& suffix) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int32_t il = 0; il < f.model->dims().n_layers; ++il) {
    const std::string name = "blk." + std::to_string(il) + "." + suffix;
    const WeightTensor* t = f.weights->Find(name);
    if (t == nullptr) continue;
    out.push_back({name, std::string(t->row_bytes * static_cast<size_t>(t->rows * t->planes), '\0')});
  }
  EXPECT_FALSE(out.empty()) << suffix;
  return out;
}

// Max error against the HF logits of `fixture` rewritten by `edits` (and
// `data` overwrites); 1e9 if the file is refused.
double MaxErrorWith(const std::string& fixture, const std::vector<wt::KvEdit>& edits,
                    const std::vector<std::pair<std::string, std::string>>& data = {}) {
  std::vector<uint8_t> bytes = wt::RewriteKvs(wt::ReadFileBytes(wt::TestDataPath(GgufName(fixture))), edits);
  for (const auto& [name, d] : data) EXPECT_TRUE(wt::OverwriteTensorData(bytes, name, d));
  const std::string path = wt::WriteTempFile(bytes, fixture + "_broken");
  wt::HfFixture f = wt::LoadHfGguf(path, fixture + "_tiny.json");
  std::remove(path.c_str());
  return f.model == nullptr ? 1e9 : wt::MaxAbsErrorVsHf(*f.model, f.ref);
}

void ExpectExceeds(const std::string& what, double err) {
  std::printf("[ measured ] %s: max err %.6g\n", what.c_str(), err);
  EXPECT_GT(err, 10 * kTolerance) << what;
  EXPECT_LT(err, 1e9) << what << ": the edited file was refused";
}

class Deepseek2MoeFixtureTest : public ::testing::TestWithParam<std::string> {};

// The generator's routing report (checked there against HF's router): the
// group limit and the group-scoring rule decide some choices, consecutive
// tokens mostly pick different experts.
TEST_P(Deepseek2MoeFixtureTest, RoutingIsNotDegenerate) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const auto& cfg = f.ref["config"];
  EXPECT_GT(cfg["group_limit_changes"].get<int>(), 0);
  EXPECT_GT(cfg["other_group_rule_changes"].get<int>(), 0);
  EXPECT_GE(cfg["consecutive_changes"].get<int>(), cfg["tokens"].get<int>() / 2);
  if (GetParam() == kV3) EXPECT_GT(cfg["bias_changes"].get<int>(), 0);
  // Per MoE layer and position, HF's k distinct experts.
  for (const auto& layer : cfg["router_indices"]) {
    for (const auto& pos : layer) {
      const auto e = pos.get<std::vector<int>>();
      EXPECT_EQ(std::set<int>(e.begin(), e.end()).size(), 3u);
    }
  }
}

TEST_P(Deepseek2MoeFixtureTest, IgnoringTheGroupsExceedsTolerance) {
  ExpectExceeds(GetParam() + " without expert groups",
                MaxErrorWith(GetParam(), {U32("expert_group_count", 1), U32("expert_group_used_count", 1)}));
}

// The family's layers with every MoE node's group scoring swapped (best
// expert <-> sum of the best two): the rule the GGUF does not state, which
// decoded derives from the gating function (models/moe_ffn.h).
class OtherGroupRule final : public DecodeModel {
 public:
  explicit OtherGroupRule(const DecodeModel& base) : base_(base) {}

  NodeId decode_apply_layer(const DecodeLayerInputs& in) const override {
    const NodeId out = base_.decode_apply_layer(in);
    for (Node& n : in.graph.mutable_nodes()) {
      if (n.op != Op::kMoeFfn || n.name.rfind("blk." + std::to_string(in.layer) + ".", 0) != 0) continue;
      n.moe.group_score =
          n.moe.group_score == MoeGroupScore::kMax ? MoeGroupScore::kTop2Sum : MoeGroupScore::kMax;
    }
    return out;
  }

  const std::string& family() const override { return base_.family(); }
  uint64_t structural_hash() const override { return base_.structural_hash() ^ 0x5157; }
  const Weights& weights() const override { return base_.weights(); }
  Backend& backend() const override { return base_.backend(); }
  int32_t trained_context_length() const override { return base_.trained_context_length(); }
  const DecodeDims& dims() const override { return base_.dims(); }
  const MaskPlan& mask_plan() const override { return base_.mask_plan(); }
  const RopePlan& rope_plan() const override { return base_.rope_plan(); }
  NodeId embed(Graph& g, NodeId ids) const override { return base_.embed(g, ids); }
  NodeId output_logits(Graph& g, NodeId h) const override { return base_.output_logits(g, h); }
  KvOffsetPath kv_offset_path() const override { return base_.kv_offset_path(); }

 private:
  const DecodeModel& base_;
};

TEST_P(Deepseek2MoeFixtureTest, OtherGroupScoringRuleExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  ExpectExceeds(GetParam() + " with the other group-scoring rule",
                wt::MaxAbsErrorVsHf(OtherGroupRule(*f.model), f.ref));
}

TEST_P(Deepseek2MoeFixtureTest, UnscaledRoutedWeightsExceedTolerance) {
  ExpectExceeds(GetParam() + " with routed_scaling_factor 1",
                MaxErrorWith(GetParam(), {F32("expert_weights_scale", 1.0f)}));
}

TEST_P(Deepseek2MoeFixtureTest, DroppingTheSharedExpertsExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  ExpectExceeds(GetParam() + " without the shared experts",
                MaxErrorWith(GetParam(), {}, Zeroed(f, "ffn_down_shexp.weight")));
}

TEST_P(Deepseek2MoeFixtureTest, OtherRenormalizationExceedsTolerance) {
  const bool norm = GetParam() == kV3;
  ExpectExceeds(GetParam() + (norm ? " without" : " with") + " renormalized weights",
                MaxErrorWith(GetParam(), {Bool("expert_weights_norm", !norm)}));
}

TEST_P(Deepseek2MoeFixtureTest, OtherGatingFunctionExceedsTolerance) {
  const bool sigmoid = GetParam() == kV3;
  ExpectExceeds(GetParam() + (sigmoid ? " with softmax" : " with sigmoid") + " gating",
                MaxErrorWith(GetParam(), {U32("expert_gating_func", sigmoid ? 1 : 2)}));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Deepseek2MoeFixtureTest, ::testing::Values(kV2, kV3),
                         [](const auto& info) { return info.param; });

TEST(Deepseek2MoeV3Test, DroppingTheSelectionBiasExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(kV3);
  ASSERT_NE(f.model, nullptr);
  ExpectExceeds("deepseek3 without exp_probs_b", MaxErrorWith(kV3, {}, Zeroed(f, "exp_probs_b.bias")));
}

TEST(Deepseek2MoeLoaderTest, StructuralHashDependsOnTheRouting) {
  auto base = wt::LoadEditedFixture(GgufName(kV2), {});
  ASSERT_TRUE(base.ok()) << base.status();
  for (const std::vector<wt::KvEdit>& edits :
       std::vector<std::vector<wt::KvEdit>>{{F32("expert_weights_scale", 1.0f)},
                                            {U32("expert_group_used_count", 3)},
                                            {Bool("expert_weights_norm", true)},
                                            {U32("expert_gating_func", 2)},
                                            {U32("expert_used_count", 2)}}) {
    auto other = wt::LoadEditedFixture(GgufName(kV2), edits);
    ASSERT_TRUE(other.ok()) << edits[0].key << ": " << other.status();
    EXPECT_NE((*base)->structural_hash(), (*other)->structural_hash()) << edits[0].key;
  }
}

struct Case {
  std::string name;
  std::string fixture;
  std::vector<wt::KvEdit> edits;
  std::vector<wt::TensorEdit> tensors;
  absl::StatusCode code;
  std::vector<std::string> want;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Deepseek2MoeMalformedTest : public ::testing::TestWithParam<Case> {};

TEST_P(Deepseek2MoeMalformedTest, IsRefusedNamingTheCause) {
  const Case& c = GetParam();
  auto m = wt::LoadEditedFixture(GgufName(c.fixture), c.edits, c.tensors);
  ASSERT_FALSE(m.ok()) << c.name;
  std::printf("[ refused  ] %s: %s\n", c.name.c_str(), m.status().ToString().c_str());
  EXPECT_EQ(m.status().code(), c.code) << m.status();
  for (const std::string& w : c.want) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(w));
}

const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    Fixtures, Deepseek2MoeMalformedTest,
    ::testing::Values(
        Case{"KAboveExperts", kV2, {U32("expert_used_count", 9)}, {}, kInvalid,
             {"deepseek2.expert_used_count = 9", "deepseek2.expert_count"}},
        Case{"KZero", kV2, {U32("expert_used_count", 0)}, {}, kInvalid, {"deepseek2.expert_used_count = 0"}},
        Case{"KMissing", kV2, {Removed("expert_used_count")}, {}, kInvalid, {"deepseek2.expert_used_count"}},
        Case{"ExpertCountMissing", kV2, {Removed("expert_count")}, {}, kInvalid, {"deepseek2.expert_count"}},
        Case{"GroupsNotDividingExperts", kV2, {U32("expert_group_count", 3)}, {}, kInvalid,
             {"deepseek2.expert_group_count = 3", "does not divide", "deepseek2.expert_count = 8"}},
        Case{"MoreGroupsThanExperts", kV2, {U32("expert_group_count", 16)}, {}, kInvalid,
             {"deepseek2.expert_group_count = 16", "deepseek2.expert_count"}},
        Case{"MoreKeptGroupsThanGroups", kV2, {U32("expert_group_used_count", 5)}, {}, kInvalid,
             {"deepseek2.expert_group_used_count = 5", "deepseek2.expert_group_count"}},
        Case{"KeptGroupsZero", kV2, {U32("expert_group_used_count", 0)}, {}, kInvalid,
             {"deepseek2.expert_group_used_count = 0"}},
        Case{"KeptGroupsMissing", kV2, {Removed("expert_group_used_count")}, {}, kInvalid,
             {"deepseek2.expert_group_used_count", "missing", "deepseek2.expert_group_count = 4"}},
        Case{"KAboveTheKeptGroupsExperts", kV2, {U32("expert_used_count", 5)}, {}, kInvalid,
             {"deepseek2.expert_used_count = 5", "exceeds the 4 experts", "deepseek2.expert_group_used_count = 2"}},
        Case{"SigmoidGroupsOfOne", kV3, {U32("expert_group_count", 8), U32("expert_group_used_count", 4)}, {},
             kInvalid, {"deepseek2.expert_group_count = 8", "groups of one expert"}},
        Case{"NegativeScale", kV2, {F32("expert_weights_scale", -2.5f)}, {}, kInvalid,
             {"deepseek2.expert_weights_scale"}},
        Case{"SoftmaxWeightGating", kV2, {U32("expert_gating_func", 3)}, {}, absl::StatusCode::kUnimplemented,
             {"deepseek2.expert_gating_func = 3"}},
        Case{"SharedCountDisagreesWithTheTensors", kV2, {U32("expert_shared_count", 3)}, {}, kInvalid,
             {"blk.1.ffn_gate_shexp.weight", "deepseek2.expert_shared_count = 3"}},
        Case{"SharedTensorsWithoutSharedCount", kV2, {U32("expert_shared_count", 0)}, {}, kInvalid,
             {"blk.1.ffn_gate_shexp.weight", "deepseek2.expert_shared_count = 0"}},
        Case{"SeparatelySizedSharedExpert", kV2, {U32("expert_shared_feed_forward_length", 32)}, {},
             absl::StatusCode::kUnimplemented, {"deepseek2.expert_shared_feed_forward_length"}},
        Case{"SharedExpertMissing", kV3, {}, {{"blk.2.ffn_up_shexp.weight", "blk.2.ffn_up_shared.weight"}},
             absl::StatusCode::kNotFound, {"blk.2.ffn_up_shexp.weight"}},
        Case{"RouterMissing", kV2, {}, {{"blk.1.ffn_gate_inp.weight", "blk.1.router.weight"}},
             absl::StatusCode::kNotFound, {"blk.1.ffn_gate_inp.weight"}},
        Case{"ExpertsWithTheWrongCount", kV2, {},
             {{"blk.2.ffn_down_exps.weight", std::nullopt, std::vector<uint64_t>{16, 32, 7}}}, kInvalid,
             {"blk.2.ffn_down_exps.weight", "deepseek2.expert_count = 8"}},
        Case{"BiasOfTheWrongWidth", kV3, {}, {{"blk.1.exp_probs_b.bias", std::nullopt, std::vector<uint64_t>{7}}},
             kInvalid, {"blk.1.exp_probs_b.bias", "deepseek2.expert_count = 8"}},
        Case{"DenseTensorInAMoeLayer", kV2, {}, {{"blk.1.ffn_gate_shexp.weight", "blk.1.ffn_gate.weight"}}, kInvalid,
             {"blk.1.ffn_gate.weight", "mixture-of-experts layer", "deepseek2.leading_dense_block_count = 1"}},
        Case{"MoeTensorInADenseLayer", kV2, {U32("leading_dense_block_count", 2)}, {}, kInvalid,
             {"blk.1.ffn_gate_inp.weight", "dense layer", "deepseek2.leading_dense_block_count = 2"}},
        Case{"DenseCountAboveLayers", kV2, {U32("leading_dense_block_count", 4)}, {}, kInvalid,
             {"deepseek2.leading_dense_block_count = 4", "deepseek2.block_count"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace decoded
