// The deepseek2 loader on copies of the tiny fixtures with rewritten keys and
// renamed tensors: linear and unknown RoPE scaling are UNIMPLEMENTED naming
// the key, YaRN without its factor, malformed MLA geometry and FFN tensors of
// the other kind (dense / MoE) INVALID_ARGUMENT naming the key, a missing
// tensor NOT_FOUND naming it (the MoE keys: deepseek2_moe_test). The fixtures: 2 dense
// layers, hidden 32, 4 heads, kv_lora_rank 16, qk_nope 8, qk_rope 8,
// v_head 12; deepseek2_tiny with q_lora_rank 24, deepseek2lite_tiny with a
// direct q (tests/data/deepseek2*_tiny.json "config").
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/edited_fixture.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

wt::KvEdit U32(const std::string& key, uint32_t v) { return {"deepseek2." + key, wt::kU32, wt::Enc<uint32_t>(v)}; }
wt::KvEdit Str(const std::string& key, const std::string& v) { return {"deepseek2." + key, wt::kStr, wt::EncStr(v)}; }
wt::KvEdit F32(const std::string& key, float v) { return {"deepseek2." + key, wt::kF32, wt::Enc<float>(v)}; }
wt::KvEdit Removed(const std::string& key) { return {"deepseek2." + key, wt::kU32, "", true}; }

TEST(Deepseek2HparamsTest, FixturesLoadWithOneLatentKvHead) {
  for (const char* file : {"deepseek2_tiny.gguf", "deepseek2lite_tiny.gguf"}) {
    auto m = wt::LoadEditedFixture(file, {});
    ASSERT_TRUE(m.ok()) << file << ": " << m.status();
    EXPECT_EQ((*m)->family(), "deepseek2");
    EXPECT_EQ((*m)->dims().n_layers, 2);
    EXPECT_EQ((*m)->dims().kv_layout(), KvLayout::SharedLatent(16 + 8, 16));
    EXPECT_EQ((*m)->rope_plan().head_dim(), 8);
    EXPECT_EQ((*m)->rope_plan().pairing(), RopePairing::kAdjacent);
  }
}

struct Case {
  std::string name;
  std::string file;
  std::vector<wt::KvEdit> edits;
  std::vector<wt::TensorEdit> renames;
  absl::StatusCode code;
  std::vector<std::string> want;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Deepseek2MalformedTest : public ::testing::TestWithParam<Case> {};

TEST_P(Deepseek2MalformedTest, IsRefusedNamingTheCause) {
  const Case& c = GetParam();
  auto m = wt::LoadEditedFixture(c.file, c.edits, c.renames);
  ASSERT_FALSE(m.ok());
  std::printf("[ refused  ] %s: %s\n", c.name.c_str(), m.status().ToString().c_str());
  EXPECT_EQ(m.status().code(), c.code) << m.status();
  for (const std::string& w : c.want) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(w));
}

constexpr char kQLora[] = "deepseek2_tiny.gguf";
constexpr char kDirect[] = "deepseek2lite_tiny.gguf";

INSTANTIATE_TEST_SUITE_P(
    Fixtures, Deepseek2MalformedTest,
    ::testing::Values(
        // A MoE layer needs the expert keys the dense fixtures do not carry.
        Case{"MoeLayersWithoutExpertKeys", kQLora, {U32("leading_dense_block_count", 1)}, {},
             absl::StatusCode::kInvalidArgument, {"deepseek2.expert_count"}},
        Case{"ExpertTensorInADenseLayer", kDirect, {}, {{"blk.1.ffn_gate.weight", "blk.1.ffn_gate_exps.weight"}},
             absl::StatusCode::kInvalidArgument,
             {"blk.1.ffn_gate_exps.weight", "dense layer", "deepseek2.leading_dense_block_count = 2"}},
        Case{"YarnWithoutFactor", kQLora, {Str("rope.scaling.type", "yarn")}, {}, absl::StatusCode::kInvalidArgument,
             {"deepseek2.rope.scaling.type = \"yarn\"", "deepseek2.rope.scaling.factor"}},
        Case{"LinearRopeScaling", kQLora, {Str("rope.scaling.type", "linear"), F32("rope.scaling.factor", 4.0f)}, {},
             absl::StatusCode::kUnimplemented, {"deepseek2.rope.scaling.factor = 4", "only YaRN"}},
        Case{"UnknownRopeScalingType", kDirect, {Str("rope.scaling.type", "longrope")}, {},
             absl::StatusCode::kUnimplemented, {"deepseek2.rope.scaling.type = \"longrope\""}},
        Case{"UnsplitKvB", kDirect, {},
             {{"blk.0.attn_k_b.weight", "blk.0.attn_kv_b.weight"}}, absl::StatusCode::kUnimplemented,
             {"blk.0.attn_kv_b.weight"}},
        Case{"KeyLengthNotLatentPlusRope", kQLora, {U32("attention.key_length", 16)}, {},
             absl::StatusCode::kInvalidArgument, {"deepseek2.attention.key_length = 16"}},
        Case{"ValueLengthNotTheLatent", kQLora, {U32("attention.value_length", 12)}, {},
             absl::StatusCode::kInvalidArgument, {"deepseek2.attention.value_length = 12"}},
        Case{"KvLoraRankAbsent", kDirect, {Removed("attention.kv_lora_rank")}, {},
             absl::StatusCode::kInvalidArgument, {"deepseek2.attention.kv_lora_rank"}},
        Case{"MoreThanOneKvHead", kDirect, {U32("attention.head_count_kv", 4)}, {},
             absl::StatusCode::kInvalidArgument, {"deepseek2.attention.head_count_kv = 4"}},
        Case{"KeyLengthMlaNotAboveRope", kDirect, {U32("attention.key_length_mla", 8)}, {},
             absl::StatusCode::kInvalidArgument, {"deepseek2.attention.key_length_mla = 8"}},
        Case{"ValueHeadDisagreesWithVb", kDirect, {U32("attention.value_length_mla", 8)}, {},
             absl::StatusCode::kInvalidArgument, {"blk.0.attn_v_b.weight", "deepseek2.attention.value_length_mla"}},
        Case{"LowRankQWithoutItsRank", kQLora, {Removed("attention.q_lora_rank")}, {},
             absl::StatusCode::kInvalidArgument, {"blk.0.attn_q_a.weight", "deepseek2.attention.q_lora_rank"}},
        Case{"KbMissing", kQLora, {}, {{"blk.1.attn_k_b.weight", "blk.1.attn_k_b_.weight"}},
             absl::StatusCode::kNotFound, {"blk.1.attn_k_b.weight"}},
        Case{"KvANormMissing", kDirect, {}, {{"blk.0.attn_kv_a_norm.weight", "blk.0.unused.weight"}},
             absl::StatusCode::kNotFound, {"blk.0.attn_kv_a_norm.weight"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace decoded
