// The glm4 loader on copies of tests/data/glm4_tiny.gguf
// (tools/make_llama_variant_fixtures.py) with rewritten keys or tensors:
// malformed sandwich norms and rotary dimensions refused as INVALID_ARGUMENT
// naming the tensor or key and the keys its extent derives from, a missing
// tensor NOT_FOUND naming it, and what the layer does not model (NextN layers,
// M-RoPE; post norms in a family without them) UNIMPLEMENTED naming the key
// or tensor.
#include <memory>
#include <string>
#include <vector>

#include "engine/model_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_tensor_rewrite.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

std::vector<uint8_t> FixtureBytes(const std::string& fixture) {
  return wt::ReadFileBytes(wt::TestDataPath(fixture + "_tiny.gguf"));
}

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadBytes(const std::vector<uint8_t>& bytes) {
  EXPECT_FALSE(bytes.empty());
  auto file = wt::OpenBytes(bytes, "glm4");
  if (!file.ok()) return file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  if (!weights.ok()) return weights.status();
  return CreateFamily(*weights);
}

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadWithKvs(const std::vector<wt::KvEdit>& edits) {
  return LoadBytes(wt::RewriteKvs(FixtureBytes("glm4"), edits));
}

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadWithTensors(const std::string& fixture,
                                                             const std::vector<wt::TensorEdit>& edits) {
  return LoadBytes(wt::RewriteTensors(FixtureBytes(fixture), edits));
}

wt::TensorEdit Dims(const std::string& name, std::vector<uint64_t> dims) { return {name, std::nullopt, dims}; }
wt::TensorEdit Rename(const std::string& name, const std::string& to) { return {name, to, std::nullopt}; }
wt::KvEdit U32(const std::string& key, uint32_t v) { return {key, wt::kU32, wt::Enc<uint32_t>(v)}; }

void ExpectRefused(const absl::StatusOr<std::unique_ptr<DecodeModel>>& m, absl::StatusCode code,
                   const std::vector<std::string>& substrings) {
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status();
  for (const std::string& s : substrings) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(s));
}

TEST(Glm4HparamsTest, FixtureLoadsAsGlm4) {
  auto m = LoadWithKvs({});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->family(), "glm4");
  EXPECT_EQ((*m)->rope_plan().rot_dims(), 8);
}

TEST(Glm4HparamsTest, PostNormOfTheWrongShapeIsRefusedNamingTheTensorAndKey) {
  ExpectRefused(LoadWithTensors("glm4", {Dims("blk.1.post_ffw_norm.weight", {16})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.1.post_ffw_norm.weight has shape [1, 16]", "glm4.embedding_length = 32",
                 "requires 32 columns"});
  ExpectRefused(LoadWithTensors("glm4", {Dims("blk.0.post_attention_norm.weight", {16, 2})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.post_attention_norm.weight has shape [2, 16]", "requires 1 rows"});
}

TEST(Glm4HparamsTest, MissingTensorsAreNotFoundNamingThem) {
  ExpectRefused(LoadWithTensors("glm4", {Rename("blk.2.post_attention_norm.weight", "blk.2.post_attn_norm.weight")}),
                absl::StatusCode::kNotFound, {"blk.2.post_attention_norm.weight"});
  ExpectRefused(LoadWithTensors("glm4", {Rename("blk.0.post_ffw_norm.weight", "blk.0.post_mlp_norm.weight")}),
                absl::StatusCode::kNotFound, {"blk.0.post_ffw_norm.weight"});
  ExpectRefused(LoadWithTensors("glm4", {Rename("blk.1.ffn_up.weight", "blk.1.gate_up.weight")}),
                absl::StatusCode::kNotFound, {"blk.1.ffn_up.weight"});
}

TEST(Glm4HparamsTest, FusedGateUpOfTheWrongShapeIsRefusedNamingBothParts) {
  ExpectRefused(LoadWithTensors("glm4", {Dims("blk.0.ffn_up.weight", {32, 64})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.ffn_up.weight has shape [64, 32]", "gate rows (glm4.feed_forward_length = 64)",
                 "requires 128 rows"});
}

TEST(Glm4HparamsTest, RotaryDimensionsBeyondTheHeadOrOddAreRefusedNamingTheKey) {
  ExpectRefused(LoadWithKvs({U32("glm4.rope.dimension_count", 18)}), absl::StatusCode::kInvalidArgument,
                {"glm4.rope.dimension_count", "18"});
  ExpectRefused(LoadWithKvs({U32("glm4.rope.dimension_count", 7)}), absl::StatusCode::kInvalidArgument,
                {"glm4.rope.dimension_count", "7"});
  // Whole-head rotation is a valid (if unusual) file.
  auto whole = LoadWithKvs({U32("glm4.rope.dimension_count", 16)});
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)->rope_plan().rot_dims(), 16);
}

TEST(Glm4HparamsTest, UnmodelledFeaturesAreUnimplementedNamingTheKey) {
  ExpectRefused(LoadWithKvs({U32("glm4.nextn_predict_layers", 1)}), absl::StatusCode::kUnimplemented,
                {"glm4.nextn_predict_layers = 1", "NextN"});
  auto no_nextn = LoadWithKvs({U32("glm4.nextn_predict_layers", 0)});
  EXPECT_TRUE(no_nextn.ok()) << no_nextn.status();
  ExpectRefused(LoadWithKvs({U32("glm4.rope.dimension_sections", 8)}), absl::StatusCode::kUnimplemented,
                {"glm4.rope.dimension_sections", "M-RoPE"});
}

// Layer 0 of phi3 is fully bound before layer 1, so layer 1's norm can pose as
// a post norm of layer 0.
TEST(Glm4HparamsTest, PostNormsInAFamilyWithoutThemAreUnimplemented) {
  ExpectRefused(LoadWithTensors("phi3", {Rename("blk.1.attn_norm.weight", "blk.0.post_attention_norm.weight")}),
                absl::StatusCode::kUnimplemented,
                {"tensor blk.0.post_attention_norm.weight is not supported for phi3", "post"});
}

}  // namespace
}  // namespace decoded
