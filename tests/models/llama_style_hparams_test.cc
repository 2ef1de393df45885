// The llama-style families' loader on copies of the tiny llama / qwen2
// fixtures with rewritten keys: what the layer does not model (scaling types
// other than none, linear and yarn, YaRN variants, partial rotary) is
// UNIMPLEMENTED naming the key; YaRN's keys become the RoPE plan's;
// malformed values are INVALID_ARGUMENT naming the key or tensor; linear
// scaling becomes the RoPE position scale; an unknown architecture is refused
// with the supported list.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

absl::StatusOr<std::unique_ptr<DecodeModel>> LoadEdited(const std::string& fixture,
                                                        const std::vector<wt::KvEdit>& edits) {
  const std::vector<uint8_t> bytes =
      wt::RewriteKvs(wt::ReadFileBytes(wt::TestDataPath(fixture + "_tiny.gguf")), edits);
  EXPECT_FALSE(bytes.empty());
  auto file = wt::OpenBytes(bytes, fixture);
  if (!file.ok()) return file.status();
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  if (!weights.ok()) return weights.status();
  return CreateFamily(*weights);
}

wt::KvEdit Str(const std::string& key, const std::string& v) { return {key, wt::kStr, wt::EncStr(v)}; }
wt::KvEdit F32(const std::string& key, float v) { return {key, wt::kF32, wt::Enc<float>(v)}; }
wt::KvEdit U32(const std::string& key, uint32_t v) { return {key, wt::kU32, wt::Enc<uint32_t>(v)}; }

TEST(LlamaStyleHparamsTest, FixturesLoadAsTheirFamilies) {
  for (const std::string name : {"llama", "qwen2"}) {
    auto m = LoadEdited(name, {});
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->family(), name);
    EXPECT_EQ((*m)->rope_plan().pairing(), name == "llama" ? RopePairing::kAdjacent : RopePairing::kNeox);
    EXPECT_EQ((*m)->mask_plan().n_variants(), 1);
    EXPECT_EQ((*m)->rope_plan().n_variants(), 1);
  }
}

// Llama 3 scaling is read from rope_freqs.weight (llama_variants_*_test); a
// "llama3" scaling type is not what llama.cpp's converter writes. LongRoPE
// is not modelled.
TEST(LlamaStyleHparamsTest, UnknownScalingTypesAreRefusedNamingTheKey) {
  for (const std::string type : {"llama3", "longrope", "dynamic"}) {
    auto m = LoadEdited("llama", {Str("llama.rope.scaling.type", type), F32("llama.rope.scaling.factor", 8.0f)});
    ASSERT_FALSE(m.ok()) << type;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(wt::Msg(m.status()), HasSubstr("llama.rope.scaling.type"));
    EXPECT_THAT(wt::Msg(m.status()), HasSubstr(type));
  }
}

// The YaRN keys as llama.cpp's converter writes them become the plan's
// RopeLayer::yarn and attention_factor: absent betas and attention factor take
// HF's defaults (32, 1, 0.1 ln(factor) + 1), absent original context the
// file's context length (llama.cpp's fallback).
TEST(LlamaStyleHparamsTest, YarnKeysBecomeThePlansYarn) {
  auto m = LoadEdited("qwen2", {Str("qwen2.rope.scaling.type", "yarn"), F32("qwen2.rope.scaling.factor", 4.0f),
                                U32("qwen2.rope.scaling.original_context_length", 32)});
  ASSERT_TRUE(m.ok()) << m.status();
  const RopeLayer& r = (*m)->rope_plan().variant(0);
  ASSERT_TRUE(r.yarn.has_value());
  EXPECT_EQ(*r.yarn, (YarnScaling{.factor = 4.0, .original_context = 32, .beta_fast = 32.0, .beta_slow = 1.0}));
  EXPECT_DOUBLE_EQ(r.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(r.freq_scale, 1.0);

  auto stated = LoadEdited("llama", {Str("llama.rope.scaling.type", "yarn"), F32("llama.rope.scaling.factor", 8.0f),
                                     F32("llama.rope.scaling.yarn_beta_fast", 16.0f),
                                     F32("llama.rope.scaling.yarn_beta_slow", 0.5f),
                                     F32("llama.rope.scaling.yarn_attn_factor", 1.5f),
                                     F32("llama.rope.scaling.yarn_ext_factor", 1.0f)});
  ASSERT_TRUE(stated.ok()) << stated.status();
  const RopeLayer& s = (*stated)->rope_plan().variant(0);
  ASSERT_TRUE(s.yarn.has_value());
  EXPECT_EQ(s.yarn->original_context, (*stated)->trained_context_length());
  EXPECT_EQ(s.yarn->factor, 8.0);
  EXPECT_EQ(s.yarn->beta_fast, 16.0);
  EXPECT_EQ(s.yarn->beta_slow, 0.5);
  EXPECT_EQ(s.attention_factor, 1.5);
  EXPECT_NE((*m)->structural_hash(), LoadEdited("qwen2", {})->get()->structural_hash());
}

TEST(LlamaStyleHparamsTest, YarnVariantsTheLayerDoesNotModelAreRefusedNamingTheKey) {
  struct Case {
    std::string fixture;
    std::vector<wt::KvEdit> edits;
    absl::StatusCode code;
    std::string want;
  };
  const std::vector<wt::KvEdit> yarn = {Str("qwen2.rope.scaling.type", "yarn"), F32("qwen2.rope.scaling.factor", 4.0f)};
  auto with = [&](std::vector<wt::KvEdit> more) {
    std::vector<wt::KvEdit> all = yarn;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  const std::vector<Case> cases = {
      {"qwen2", {Str("qwen2.rope.scaling.type", "yarn")}, absl::StatusCode::kInvalidArgument,
       "qwen2.rope.scaling.factor"},
      {"qwen2", with({F32("qwen2.rope.scaling.yarn_ext_factor", 0.5f)}), absl::StatusCode::kUnimplemented,
       "qwen2.rope.scaling.yarn_ext_factor = 0.5"},
      {"qwen2", with({F32("qwen2.rope.scaling.yarn_log_multiplier", 0.0707f)}), absl::StatusCode::kUnimplemented,
       "qwen2.rope.scaling.yarn_log_multiplier"},
      {"qwen2", with({F32("qwen2.rope.scaling.yarn_beta_fast", -32.0f)}), absl::StatusCode::kInvalidArgument,
       "qwen2.rope.scaling.yarn_beta_fast"},
      {"qwen2", with({F32("qwen2.rope.scaling.yarn_attn_factor", 0.0f)}), absl::StatusCode::kInvalidArgument,
       "qwen2.rope.scaling.yarn_attn_factor"},
      {"qwen2", with({U32("qwen2.rope.scaling.original_context_length", 0)}), absl::StatusCode::kInvalidArgument,
       "qwen2.rope.scaling.original_context_length"},
      {"qwen2", {F32("qwen2.rope.scaling.attn_factor", 1.2f)}, absl::StatusCode::kUnimplemented,
       "qwen2.rope.scaling.attn_factor"},
      // Llama 3's rope_freqs.weight beside YaRN: two frequency scalings.
      {"llama3rope", {Str("llama.rope.scaling.type", "yarn"), F32("llama.rope.scaling.factor", 4.0f)},
       absl::StatusCode::kUnimplemented, "rope_freqs.weight"},
  };
  for (const Case& c : cases) {
    auto m = LoadEdited(c.fixture, c.edits);
    ASSERT_FALSE(m.ok()) << c.want;
    EXPECT_EQ(m.status().code(), c.code) << m.status();
    EXPECT_THAT(wt::Msg(m.status()), HasSubstr(c.want));
  }
}

TEST(LlamaStyleHparamsTest, LinearScalingScalesPositions) {
  auto m = LoadEdited("qwen2", {Str("qwen2.rope.scaling.type", "linear"), F32("qwen2.rope.scaling.factor", 4.0f)});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ((*m)->rope_plan().variant(0).freq_scale, 0.25);
}

TEST(LlamaStyleHparamsTest, PartialRotaryIsRefusedNamingTheKey) {
  auto m = LoadEdited("llama", {U32("llama.rope.dimension_count", 8)});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(wt::Msg(m.status()), HasSubstr("llama.rope.dimension_count"));
}

TEST(LlamaStyleHparamsTest, MalformedValuesAreInvalidArgumentNamingTheKey) {
  struct Case {
    std::vector<wt::KvEdit> edits;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{{"qwen2.attention.layer_norm_rms_epsilon", wt::kU32, "", true}}, "qwen2.attention.layer_norm_rms_epsilon"},
      // 8 heads would make the head size 8, below the 16 dimensions rotated.
      {{U32("qwen2.attention.head_count", 8)}, "qwen2.rope.dimension_count"},
      {{U32("qwen2.attention.head_count", 8), U32("qwen2.rope.dimension_count", 8)}, "blk.0.attn_k.weight"},
      {{U32("qwen2.rope.dimension_count", 32)}, "qwen2.rope.dimension_count"},
      {{U32("qwen2.attention.head_count_kv", 3)}, "qwen2.attention.head_count_kv"},
      {{U32("qwen2.feed_forward_length", 64)}, "ffn_gate"},
      {{F32("qwen2.rope.freq_base", 0.0f)}, "qwen2.rope.freq_base"},
      {{U32("qwen2.vocab_size", 97)}, "qwen2.vocab_size"},
  };
  for (const Case& c : cases) {
    auto m = LoadEdited("qwen2", c.edits);
    ASSERT_FALSE(m.ok()) << c.want;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_THAT(wt::Msg(m.status()), HasSubstr(c.want));
  }
}

TEST(LlamaStyleHparamsTest, UnknownArchitectureIsRefusedListingTheSupportedOnes) {
  auto m = LoadEdited("llama", {Str("general.architecture", "mamba")});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  for (const char* family : {"mamba", "gemma3", "llama", "qwen2"}) {
    EXPECT_THAT(wt::Msg(m.status()), HasSubstr(family));
  }
}

}  // namespace
}  // namespace decoded
