// The smollm3 loader (the Llama-style layer with NoPE layers) on copies of
// the tiny smollm3 fixture with rewritten keys and renamed tensors: partial
// rotary is UNIMPLEMENTED naming the key, malformed keys INVALID_ARGUMENT
// naming it, a missing tensor NOT_FOUND naming it. The fixture: 5 layers,
// hidden 32, 4 heads and 2 KV heads of 8, FFN 48, vocabulary 96
// (tests/data/smollm3_tiny.json "config").
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

constexpr char kFile[] = "smollm3_tiny.gguf";

wt::KvEdit U32(const std::string& key, uint32_t v) { return {"smollm3." + key, wt::kU32, wt::Enc<uint32_t>(v)}; }
wt::KvEdit Removed(const std::string& key) { return {"smollm3." + key, wt::kU32, "", true}; }

TEST(SmolLM3HparamsTest, FixtureLoadsWithTheDeviceOffsetPathAndTiedOutput) {
  auto m = wt::LoadEditedFixture(kFile, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->family(), "smollm3");
  EXPECT_EQ((*m)->kv_offset_path(), KvOffsetPath::kDeviceOffset);
  EXPECT_EQ((*m)->dims().n_layers, 5);
  EXPECT_EQ((*m)->dims().n_kv_heads, 2);
}

struct Case {
  std::string name;
  std::vector<wt::KvEdit> edits;
  std::vector<wt::TensorEdit> renames;  // {name, new_name}
  absl::StatusCode code;
  std::vector<std::string> want;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SmolLM3MalformedTest : public ::testing::TestWithParam<Case> {};

TEST_P(SmolLM3MalformedTest, IsRefusedNamingTheCause) {
  const Case& c = GetParam();
  auto m = wt::LoadEditedFixture(kFile, c.edits, c.renames);
  ASSERT_FALSE(m.ok());
  std::printf("[ refused  ] %s: %s\n", c.name.c_str(), m.status().ToString().c_str());
  EXPECT_EQ(m.status().code(), c.code) << m.status();
  for (const std::string& w : c.want) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(w));
}

INSTANTIATE_TEST_SUITE_P(
    Fixture, SmolLM3MalformedTest,
    ::testing::Values(
        Case{"PartialRotaryIsNotModelled", {U32("rope.dimension_count", 4)}, {}, absl::StatusCode::kUnimplemented,
             {"smollm3.rope.dimension_count = 4", "partial rotary"}},
        Case{"RmsEpsilonAbsent", {Removed("attention.layer_norm_rms_epsilon")}, {},
             absl::StatusCode::kInvalidArgument, {"smollm3.attention.layer_norm_rms_epsilon is absent"}},
        Case{"KvHeadsNotADivisor", {U32("attention.head_count_kv", 3)}, {}, absl::StatusCode::kInvalidArgument,
             {"smollm3.attention.head_count_kv"}},
        Case{"BlockCountBeyondTheLayersPresent", {U32("block_count", 8)}, {}, absl::StatusCode::kInvalidArgument,
             {"smollm3.block_count = 8", "does not match the 5 layers present"}},
        Case{"NoPeLayerTensorMissing", {}, {{"blk.3.attn_k.weight", "blk.3.attn_k.weight_"}},
             absl::StatusCode::kNotFound, {"blk.3.attn_k.weight"}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace decoded
