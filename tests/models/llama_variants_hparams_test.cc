// The qwen3 / phi3 loaders and Llama 3 frequency scaling on copies of the tiny
// fixtures (tools/make_llama_variant_fixtures.py) with rewritten keys or
// tensors: what they load as (plans, head size, window, frequency factors),
// malformed shapes and values refused as INVALID_ARGUMENT naming the tensor or
// key and the keys its extent derives from, missing tensors NOT_FOUND, and
// what the layer does not model (LongRoPE, partial rotary) UNIMPLEMENTED
// naming the key or tensor.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/edited_fixture.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_tensor_rewrite.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<uint8_t> FixtureBytes(const std::string& fixture) {
  return wt::ReadFileBytes(wt::TestDataPath(fixture + "_tiny.gguf"));
}

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadWithKvs(const std::string& fixture,
                                                         const std::vector<wt::KvEdit>& edits) {
  return wt::LoadEditedFixture(fixture + "_tiny.gguf", edits);
}

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadWithTensors(const std::string& fixture,
                                                             const std::vector<wt::TensorEdit>& edits) {
  return wt::LoadEditedFixture(fixture + "_tiny.gguf", {}, edits);
}

wt::TensorEdit Dims(const std::string& name, std::vector<uint64_t> dims) { return {name, std::nullopt, dims}; }
wt::TensorEdit Rename(const std::string& name, const std::string& to) { return {name, to, std::nullopt}; }
wt::KvEdit U32(const std::string& key, uint32_t v) { return {key, wt::kU32, wt::Enc<uint32_t>(v)}; }
wt::KvEdit I32(const std::string& key, int32_t v) { return {key, wt::kI32, wt::Enc<int32_t>(v)}; }
wt::KvEdit Removed(const std::string& key) { return {key, wt::kU32, "", true}; }

void ExpectRefused(const absl::StatusOr<std::unique_ptr<DecodeModel>>& m, absl::StatusCode code,
                   const std::vector<std::string>& substrings) {
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), code) << m.status();
  for (const std::string& s : substrings) EXPECT_THAT(wt::Msg(m.status()), HasSubstr(s));
}

TEST(LlamaVariantsHparamsTest, FixturesLoadAsTheirFamiliesWithTheirPlans) {
  auto qwen3 = LoadWithKvs("qwen3", {});
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ((*qwen3)->family(), "qwen3");
  EXPECT_EQ((*qwen3)->rope_plan().pairing(), RopePairing::kNeox);
  EXPECT_EQ((*qwen3)->dims().head_dim, 16);  // not hidden / heads = 8
  EXPECT_EQ((*qwen3)->mask_plan().window(0), 0);

  auto phi3 = LoadWithKvs("phi3", {});
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  EXPECT_EQ((*phi3)->family(), "phi3");
  EXPECT_EQ((*phi3)->rope_plan().pairing(), RopePairing::kNeox);
  EXPECT_EQ((*phi3)->mask_plan().n_variants(), 1);
  EXPECT_EQ((*phi3)->mask_plan().window(0), 6);

  auto llama3 = LoadWithKvs("llama3rope", {});
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ((*llama3)->family(), "llama");
  EXPECT_EQ((*llama3)->rope_plan().n_variants(), 1);
  EXPECT_EQ((*llama3)->rope_plan().variant(0).freq_factors.size(), 8u);
}

TEST(LlamaVariantsHparamsTest, Phi3WithoutAWindowKeyOrWithZeroIsGlobal) {
  for (const wt::KvEdit& edit : {Removed("phi3.attention.sliding_window"), U32("phi3.attention.sliding_window", 0)}) {
    auto m = LoadWithKvs("phi3", {edit});
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->mask_plan().window(0), 0);
  }
  auto m = LoadWithKvs("phi3", {I32("phi3.attention.sliding_window", -1)});
  ExpectRefused(m, absl::StatusCode::kInvalidArgument, {"phi3.attention.sliding_window", "= -1 is out of range"});
}

TEST(LlamaVariantsHparamsTest, Qwen3MalformedTensorsAreRefusedNamingTheTensorAndKeys) {
  ExpectRefused(LoadWithTensors("qwen3", {Dims("blk.0.attn_q_norm.weight", {8})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.attn_q_norm.weight has shape [1, 8]", "qwen3.attention.key_length = 16",
                 "requires 16 columns"});
  // The same 16 values as two rows of 8 (the data must stay within its bytes).
  ExpectRefused(LoadWithTensors("qwen3", {Dims("blk.1.attn_k_norm.weight", {8, 2})}),
                absl::StatusCode::kInvalidArgument, {"tensor blk.1.attn_k_norm.weight has shape [2, 8]",
                                                     "requires 1 rows"});
  ExpectRefused(LoadWithTensors("qwen3", {Rename("blk.1.attn_k_norm.weight", "blk.1.k_norm.weight")}),
                absl::StatusCode::kNotFound, {"blk.1.attn_k_norm.weight"});
  // q is heads x key_length = 64 wide, not the hidden 32.
  ExpectRefused(LoadWithTensors("qwen3", {Dims("blk.0.attn_q.weight", {32, 32})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.attn_q.weight", "qwen3.attention.head_count = 4 x qwen3.attention.key_length = 16",
                 "requires 64 rows"});
  ExpectRefused(LoadWithKvs("qwen3", {U32("qwen3.attention.key_length", 8), U32("qwen3.attention.value_length", 8)}),
                absl::StatusCode::kInvalidArgument, {"blk.0.attn_q.weight", "qwen3.attention.key_length = 8"});
}

TEST(LlamaVariantsHparamsTest, Phi3MalformedFusedTensorsAreRefusedNamingEveryPart) {
  ExpectRefused(LoadWithTensors("phi3", {Dims("blk.0.attn_qkv.weight", {32, 48})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.attn_qkv.weight has shape [48, 32]", "q rows (phi3.attention.head_count = 2",
                 "k rows (phi3.attention.head_count_kv = 1", "v rows", "requires 64 rows"});
  ExpectRefused(LoadWithTensors("phi3", {Dims("blk.1.ffn_up.weight", {32, 64})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.1.ffn_up.weight has shape [64, 32]", "gate rows (phi3.feed_forward_length = 64)",
                 "up rows (phi3.feed_forward_length = 64)", "requires 128 rows"});
  ExpectRefused(LoadWithTensors("phi3", {Dims("blk.0.attn_qkv.weight", {16, 64})}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.attn_qkv.weight has shape [64, 16]", "phi3.embedding_length = 32",
                 "requires 32 columns"});
  // A separate projection beside the fused one, or a gate beside the fused
  // gate_up, is another layout than llama.cpp writes.
  ExpectRefused(LoadWithTensors("phi3", {Rename("blk.0.attn_output.weight", "blk.0.attn_k.weight")}),
                absl::StatusCode::kInvalidArgument, {"blk.0.attn_k.weight", "beside the fused blk.0.attn_qkv.weight"});
  ExpectRefused(LoadWithTensors("phi3", {Rename("blk.1.ffn_down.weight", "blk.1.ffn_gate.weight")}),
                absl::StatusCode::kInvalidArgument, {"blk.1.ffn_gate.weight", "fused in ffn_up.weight"});
  ExpectRefused(LoadWithTensors("phi3", {Rename("blk.0.attn_qkv.weight", "blk.0.qkv.weight")}),
                absl::StatusCode::kNotFound, {"blk.0.attn_q.weight"});
  // A fused bias is split by columns as the weight by rows (layer 0 is
  // checked before layer 1 is bound, so layer 1's norm can serve as it).
  ExpectRefused(LoadWithTensors("phi3", {Rename("blk.1.attn_norm.weight", "blk.0.attn_qkv.bias")}),
                absl::StatusCode::kInvalidArgument,
                {"tensor blk.0.attn_qkv.bias has shape [1, 32]", "q columns (phi3.attention.head_count = 2",
                 "requires 64 columns"});
}

TEST(LlamaVariantsHparamsTest, Phi3UnmodelledFeaturesAreUnimplementedNamingTheKeyOrTensor) {
  ExpectRefused(LoadWithTensors("phi3", {Rename("output_norm.weight", "rope_factors_long.weight")}),
                absl::StatusCode::kUnimplemented, {"rope_factors_long.weight", "LongRoPE"});
  ExpectRefused(LoadWithTensors("phi3", {Rename("output_norm.weight", "rope_factors_short.weight")}),
                absl::StatusCode::kUnimplemented, {"rope_factors_short.weight", "LongRoPE"});
  ExpectRefused(LoadWithKvs("phi3", {U32("phi3.rope.dimension_count", 8)}), absl::StatusCode::kUnimplemented,
                {"phi3.rope.dimension_count = 8", "partial rotary"});
}

TEST(LlamaVariantsHparamsTest, RopeFreqsOfTheWrongLengthAreRefusedNamingTheTensor) {
  ExpectRefused(LoadWithTensors("llama3rope", {Dims("rope_freqs.weight", {4})}), absl::StatusCode::kInvalidArgument,
                {"tensor rope_freqs.weight has shape [1, 4]", "llama.rope.dimension_count = 16",
                 "requires 8 columns"});
}

TEST(LlamaVariantsHparamsTest, RopeFreqsThatAreNotDivisorsAreRefusedNamingTheEntry) {
  for (float bad : {0.0f, -1.0f, 1e-4f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    std::vector<uint8_t> bytes = FixtureBytes("llama3rope");
    ASSERT_TRUE(wt::OverwriteTensorData(bytes, "rope_freqs.weight", wt::Enc<float>(1.0f) + wt::Enc<float>(bad)));
    ExpectRefused(wt::LoadFamilyFromBytes(bytes, "llama3rope"), absl::StatusCode::kInvalidArgument,
                  {"tensor rope_freqs.weight[1] = ", "is not a frequency divisor"});
  }
}

}  // namespace
}  // namespace decoded
