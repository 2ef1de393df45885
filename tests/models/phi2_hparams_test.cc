// The phi2 loader on copies of the tiny phi2 fixtures with rewritten keys and
// renamed tensors: malformed files are INVALID_ARGUMENT naming the key or
// tensor, missing tensors NOT_FOUND naming them, and what the layer does not
// model (q/k LayerNorm, RoPE scaling) UNIMPLEMENTED naming the key or tensor.
// The fixture: 3 layers, hidden 32, 2 heads of 16, 8 rotated dimensions,
// FFN 128, vocabulary 96 (tests/data/phi2_tiny.json "config").
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

wt::KvEdit U32(const std::string& key, uint32_t v) { return {"phi2." + key, wt::kU32, wt::Enc<uint32_t>(v)}; }
wt::KvEdit F32(const std::string& key, float v) { return {"phi2." + key, wt::kF32, wt::Enc<float>(v)}; }
wt::KvEdit Removed(const std::string& key) { return {"phi2." + key, wt::kU32, "", true}; }

TEST(Phi2HparamsTest, BothLayoutsLoadWithPartialRotaryAndTheSymbolOffsetPath) {
  for (const std::string file : {"phi2_tiny.gguf", "phi2_tiny_fused.gguf"}) {
    auto m = wt::LoadEditedFixture(file, {});
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->family(), "phi2");
    EXPECT_EQ((*m)->dims().head_dim, 16);
    EXPECT_EQ((*m)->rope_plan().rot_dims(), 8);
    EXPECT_EQ((*m)->rope_plan().pairing(), RopePairing::kNeox);
    EXPECT_EQ((*m)->rope_plan().n_variants(), 1);
    EXPECT_EQ((*m)->mask_plan().n_variants(), 1);
    EXPECT_EQ((*m)->kv_offset_path(), KvOffsetPath::kSymbol);
  }
}

struct Case {
  std::string name;
  std::string file;
  std::vector<wt::KvEdit> edits;
  std::vector<wt::TensorEdit> renames;  // {name, new_name}
  absl::StatusCode code;
  std::vector<std::string> want;  // substrings of the message
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Phi2MalformedTest : public ::testing::TestWithParam<Case> {};

TEST_P(Phi2MalformedTest, IsRefusedNamingTheCause) {
  const Case& c = GetParam();
  auto m = wt::LoadEditedFixture(c.file, c.edits, c.renames);
  ASSERT_FALSE(m.ok());
  std::printf("[ refused  ] %s: %s\n", c.name.c_str(), m.status().ToString().c_str());
  EXPECT_EQ(m.status().code(), c.code) << m.status();
  for (const std::string& w : c.want) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(w));
}

const char kSep[] = "phi2_tiny.gguf";
const char kFused[] = "phi2_tiny_fused.gguf";
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kNotFound = absl::StatusCode::kNotFound;
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;

INSTANTIATE_TEST_SUITE_P(
    Files, Phi2MalformedTest,
    ::testing::Values(
        Case{"RotaryDimsOdd", kSep, {U32("rope.dimension_count", 7)}, {}, kInvalid,
             {"phi2.rope.dimension_count = 7", "not a multiple of 2"}},
        Case{"RotaryDimsBeyondTheHead", kSep, {U32("rope.dimension_count", 32)}, {}, kInvalid,
             {"phi2.rope.dimension_count = 32", "out of range [2, 16]"}},
        Case{"LayerNormEpsilonAbsent", kSep, {Removed("attention.layer_norm_epsilon")}, {}, kInvalid,
             {"phi2.attention.layer_norm_epsilon is absent"}},
        Case{"LayerNormEpsilonZero", kSep, {F32("attention.layer_norm_epsilon", 0.0f)}, {}, kInvalid,
             {"phi2.attention.layer_norm_epsilon = 0", "out of range"}},
        Case{"FfnWidthDisagreesWithTensors", kSep, {U32("feed_forward_length", 64)}, {}, kInvalid,
             {"blk.0.ffn_up.weight", "phi2.feed_forward_length = 64"}},
        Case{"OutputBiasMissing", kSep, {}, {{"output.bias", "output.bias_"}}, kNotFound, {"output.bias"}},
        Case{"OutputNormBiasMissing", kSep, {}, {{"output_norm.bias", "output_norm.bias_"}}, kNotFound,
             {"output_norm.bias"}},
        Case{"FfnUpBiasMissing", kSep, {}, {{"blk.1.ffn_up.bias", "blk.1.ffn_up.bias_"}}, kNotFound,
             {"blk.1.ffn_up.bias"}},
        Case{"OneSeparateQkvBiasMissing", kSep, {}, {{"blk.2.attn_v.bias", "blk.2.attn_v.bias_"}}, kNotFound,
             {"blk.2.attn_v.bias"}},
        Case{"FusedQkvRowsDisagreeWithHeadCounts", kFused, {U32("attention.head_count_kv", 1)}, {}, kInvalid,
             {"blk.0.attn_qkv.weight", "phi2.attention.head_count_kv = 1", "requires 64 rows"}},
        Case{"FusedQkvBiasMissing", kFused, {}, {{"blk.0.attn_qkv.bias", "blk.0.attn_qkv.bias_"}}, kNotFound,
             {"blk.0.attn_qkv.bias"}},
        Case{"FusedAndSeparateQkvInOneLayer", kFused, {}, {{"blk.0.ffn_down.bias", "blk.0.attn_q.weight"}}, kInvalid,
             {"blk.0.attn_qkv.weight", "blk.0.attn_q.weight", "one Q/K/V layout"}},
        Case{"QkLayerNormIsNotModelled", kSep, {}, {{"blk.0.ffn_up.bias", "blk.0.attn_q_norm.weight"}},
             kUnimplemented, {"blk.0.attn_q_norm.weight"}},
        Case{"RopeScalingIsNotModelled", kSep, {F32("rope.scaling.factor", 4.0f)}, {}, kUnimplemented,
             {"phi2.rope.scaling.factor"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace decoded
