// Model::Load on copies of the committed tiny Gemma 3 file whose
// hyper-parameter keys are rewritten to hostile values: every one must come
// back as INVALID_ARGUMENT naming the key, never a crash or an allocation sized
// by the value (run under ASan+UBSan too). The fixture's own values are listed
// in tests/data/gemma3_tiny_swa.json ("config") and docs/reference-data.md:
// 6 layers, hidden 64, FFN 128, 4 heads, 2 KV heads, head size 16, context 128,
// window 4, pattern 3, vocabulary 334.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/gguf/gguf_test_writer.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;
using wt::Enc;
using wt::EncStr;
using wt::KvEdit;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

KvEdit U32(const std::string& key, uint32_t v) { return {"gemma3." + key, wt::kU32, Enc<uint32_t>(v)}; }
KvEdit I32(const std::string& key, int32_t v) { return {"gemma3." + key, wt::kI32, Enc<int32_t>(v)}; }
KvEdit U64(const std::string& key, uint64_t v) { return {"gemma3." + key, wt::kU64, Enc<uint64_t>(v)}; }
KvEdit F32(const std::string& key, float v) { return {"gemma3." + key, wt::kF32, Enc<float>(v)}; }
KvEdit F64(const std::string& key, double v) { return {"gemma3." + key, wt::kF64, Enc<double>(v)}; }
KvEdit Str(const std::string& key, const std::string& v) { return {"gemma3." + key, wt::kStr, EncStr(v)}; }
KvEdit Removed(const std::string& key) { return {"gemma3." + key, wt::kU32, "", true}; }

struct Mutation {
  std::string name;
  std::vector<KvEdit> edits;
  std::string key;      // must appear in the message (without the "gemma3." prefix)
  std::string also{};   // a further substring the message must hold, if any
};

void PrintTo(const Mutation& m, std::ostream* os) { *os << m.name; }

const std::vector<Mutation>& Mutations() {
  static const auto* m = new std::vector<Mutation>{
      // Layer count: range, then the blk.N. tensors present.
      {"BlockCountZero", {U32("block_count", 0)}, "block_count", "out of range [1, 1024]"},
      {"BlockCount1e8", {U32("block_count", 100000000)}, "block_count", "= 100000000 is out of range"},
      {"BlockCountInt32Max", {U32("block_count", 2147483647)}, "block_count", "out of range"},
      {"BlockCountUint32Max", {U32("block_count", 4294967295u)}, "block_count", "= 4294967295"},
      {"BlockCountUint64Max", {U64("block_count", ~uint64_t{0})}, "block_count", "= 18446744073709551615"},
      {"BlockCountNegative", {I32("block_count", -1)}, "block_count", "= -1 is out of range"},
      {"BlockCountOneLess", {U32("block_count", 5)}, "block_count", "does not match the 6 layers present"},
      {"BlockCountOneMore", {U32("block_count", 7)}, "block_count", "does not match the 6 layers present"},
      {"BlockCountFloat", {F32("block_count", 6.0f)}, "block_count", "not an integer"},
      {"BlockCountString", {Str("block_count", "6")}, "block_count", "not an integer"},
      {"BlockCountAbsent", {Removed("block_count")}, "block_count", "absent"},
      // Widths: range, then the tensors that use them.
      {"EmbeddingLengthZero", {U32("embedding_length", 0)}, "embedding_length", "out of range"},
      {"EmbeddingLengthHuge", {U32("embedding_length", 2147483647)}, "embedding_length", "out of range"},
      {"EmbeddingLengthMismatch", {U32("embedding_length", 65)}, "embedding_length", "token_embd.weight"},
      {"FeedForwardLengthZero", {U32("feed_forward_length", 0)}, "feed_forward_length", "out of range"},
      {"FeedForwardLengthHuge", {U32("feed_forward_length", 4294967295u)}, "feed_forward_length", "out of range"},
      {"FeedForwardLengthMismatch", {U32("feed_forward_length", 256)}, "feed_forward_length", "ffn_gate"},
      // Heads.
      {"HeadCountZero", {U32("attention.head_count", 0)}, "attention.head_count", "out of range"},
      {"HeadCountHuge", {U32("attention.head_count", 2147483647)}, "attention.head_count", "out of range"},
      {"HeadCountMismatch", {U32("attention.head_count", 8)}, "attention.head_count", "blk.0.attn_q.weight"},
      {"HeadCountNotMultipleOfKv", {U32("attention.head_count", 3)}, "attention.head_count", "not a multiple"},
      {"HeadCountKvZero", {U32("attention.head_count_kv", 0)}, "attention.head_count_kv", "out of range"},
      {"HeadCountKvAboveHeads", {U32("attention.head_count_kv", 8)}, "attention.head_count_kv",
       "out of range [1, 4]"},
      {"HeadCountKvHuge", {U32("attention.head_count_kv", 4294967295u)}, "attention.head_count_kv", "out of range"},
      {"HeadCountKvMismatch", {U32("attention.head_count_kv", 1)}, "attention.head_count_kv",
       "blk.0.attn_k.weight"},
      {"HeadCountKvNotDivisor", {U32("attention.head_count_kv", 3)}, "attention.head_count_kv", "not a multiple"},
      {"KeyLengthZero", {U32("attention.key_length", 0)}, "attention.key_length", "out of range"},
      {"KeyLengthHuge", {U32("attention.key_length", 2147483647)}, "attention.key_length", "out of range"},
      {"KeyLengthOdd", {U32("attention.key_length", 17)}, "attention.key_length", "not a multiple of 2"},
      {"KeyLengthMismatch", {U32("attention.key_length", 8), U32("attention.value_length", 8)},
       "attention.key_length", "blk.0.attn_q.weight"},
      {"ValueLengthZero", {U32("attention.value_length", 0)}, "attention.value_length", "out of range"},
      {"ValueLengthHuge", {U32("attention.value_length", 4294967295u)}, "attention.value_length", "out of range"},
      {"ValueLengthMismatch", {U32("attention.value_length", 8)}, "attention.value_length",
       "differs from gemma3.attention.key_length"},
      // Context and window.
      {"ContextLengthZero", {U32("context_length", 0)}, "context_length", "out of range"},
      {"ContextLengthInt32Max", {U32("context_length", 2147483647)}, "context_length", "out of range"},
      {"ContextLengthUint32Max", {U32("context_length", 4294967295u)}, "context_length", "out of range"},
      {"ContextLengthBelowWindow", {U32("context_length", 2)}, "context_length", "sliding_window = 4"},
      {"SlidingWindowNegative", {I32("attention.sliding_window", -4)}, "attention.sliding_window", "= -4"},
      {"SlidingWindowZero", {U32("attention.sliding_window", 0)}, "attention.sliding_window", "out of range"},
      {"SlidingWindowHuge", {U32("attention.sliding_window", 2147483647)}, "attention.sliding_window",
       "out of range [1, 128]"},
      {"SlidingWindowPatternZero", {U32("attention.sliding_window_pattern", 0)}, "attention.sliding_window_pattern",
       "out of range"},
      {"SlidingWindowPatternAboveLayers", {U32("attention.sliding_window_pattern", 7)},
       "attention.sliding_window_pattern", "out of range [1, 6]"},
      {"SlidingWindowPatternHuge", {U32("attention.sliding_window_pattern", 4294967295u)},
       "attention.sliding_window_pattern", "out of range"},
      // Floats: finite and inside their ranges.
      {"RmsEpsilonNegative", {F32("attention.layer_norm_rms_epsilon", -1e-6f)}, "attention.layer_norm_rms_epsilon",
       "out of range"},
      {"RmsEpsilonZero", {F32("attention.layer_norm_rms_epsilon", 0.0f)}, "attention.layer_norm_rms_epsilon",
       "out of range"},
      {"RmsEpsilonDenormal", {F32("attention.layer_norm_rms_epsilon", 1e-40f)},
       "attention.layer_norm_rms_epsilon", "out of range"},
      {"RmsEpsilonNaN", {F32("attention.layer_norm_rms_epsilon", static_cast<float>(kNaN))},
       "attention.layer_norm_rms_epsilon", "not finite"},
      {"RmsEpsilonInf", {F32("attention.layer_norm_rms_epsilon", static_cast<float>(kInf))},
       "attention.layer_norm_rms_epsilon", "not finite"},
      {"RmsEpsilonInteger", {U32("attention.layer_norm_rms_epsilon", 1)}, "attention.layer_norm_rms_epsilon",
       "not a float"},
      {"RopeBaseZero", {F32("rope.freq_base", 0.0f)}, "rope.freq_base", "out of range"},
      {"RopeBaseNegative", {F32("rope.freq_base", -1e6f)}, "rope.freq_base", "out of range"},
      {"RopeBaseNaN", {F32("rope.freq_base", static_cast<float>(kNaN))}, "rope.freq_base", "not finite"},
      {"RopeBaseInf", {F32("rope.freq_base", static_cast<float>(kInf))}, "rope.freq_base", "not finite"},
      {"RopeBaseBeyondFloat32", {F64("rope.freq_base", 1e300)}, "rope.freq_base", "out of range"},
      {"RopeBaseSwaZero", {F32("rope.freq_base_swa", 0.0f)}, "rope.freq_base_swa", "out of range"},
      {"RopeBaseSwaNegative", {F32("rope.freq_base_swa", -1e4f)}, "rope.freq_base_swa", "out of range"},
      {"RopeBaseSwaNaN", {F32("rope.freq_base_swa", static_cast<float>(kNaN))}, "rope.freq_base_swa",
       "not finite"},
      {"RopeScalingNegative", {F32("rope.scaling.factor", -8.0f)}, "rope.scaling.factor", "out of range"},
      {"RopeScalingTiny", {F32("rope.scaling.factor", 1e-30f)}, "rope.scaling.factor", "out of range"},
      {"RopeScalingNaN", {F32("rope.scaling.factor", static_cast<float>(kNaN))}, "rope.scaling.factor",
       "not finite"},
      {"QueryPreAttnScalarZero", {F32("attention.query_pre_attn_scalar", 0.0f)},
       "attention.query_pre_attn_scalar", "out of range"},
      {"QueryPreAttnScalarNegative", {F32("attention.query_pre_attn_scalar", -24.0f)},
       "attention.query_pre_attn_scalar", "out of range"},
      {"QueryPreAttnScalarNaN", {F32("attention.query_pre_attn_scalar", static_cast<float>(kNaN))},
       "attention.query_pre_attn_scalar", "not finite"},
      {"QueryPreAttnScalarInf", {F32("attention.query_pre_attn_scalar", static_cast<float>(kInf))},
       "attention.query_pre_attn_scalar", "not finite"},
      {"AttnSoftcapNegative", {F32("attn_logit_softcapping", -50.0f)}, "attn_logit_softcapping", "out of range"},
      {"AttnSoftcapNaN", {F32("attn_logit_softcapping", static_cast<float>(kNaN))}, "attn_logit_softcapping",
       "not finite"},
      {"AttnSoftcapTiny", {F32("attn_logit_softcapping", 1e-30f)}, "attn_logit_softcapping", "out of range"},
      {"FinalSoftcapNegative", {F32("final_logit_softcapping", -30.0f)}, "final_logit_softcapping",
       "out of range"},
      {"FinalSoftcapNaN", {F32("final_logit_softcapping", static_cast<float>(kNaN))}, "final_logit_softcapping",
       "not finite"},
      {"FinalSoftcapInf", {F32("final_logit_softcapping", static_cast<float>(kInf))}, "final_logit_softcapping",
       "not finite"},
      // Vocabulary: the optional key must agree with the embedding.
      {"VocabSizeMismatch", {U32("vocab_size", 335)}, "vocab_size", "token_embd.weight"},
  };
  return *m;
}

std::vector<uint8_t> Fixture() { return wt::ReadFileBytes(wt::TestDataPath("gemma3_tiny_swa.gguf")); }

absl::StatusOr<std::shared_ptr<const Model>> LoadBytes(const std::vector<uint8_t>& bytes) {
  const std::string path = wt::WriteTempFile(bytes, "gemma3_hparams");
  auto model = Model::Load(path);
  ::unlink(path.c_str());
  return model;
}

TEST(Gemma3HparamsTest, RewriterWithoutEditsReproducesTheFixture) {
  const std::vector<uint8_t> bytes = Fixture();
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(wt::RewriteKvs(bytes, {}), bytes);
}

TEST(Gemma3HparamsTest, UnmutatedAndSameValueCopiesLoad) {
  const std::vector<uint8_t> bytes = Fixture();
  auto model = LoadBytes(bytes);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->info().n_layers, 6);
  // Same values in other integer / float widths, and the optional keys at
  // their "off" or agreeing values, still load.
  auto same = LoadBytes(wt::RewriteKvs(
      bytes, {U64("block_count", 6), I32("context_length", 128), F64("attention.layer_norm_rms_epsilon", 1e-6),
              F32("final_logit_softcapping", 0.0f), F32("rope.scaling.factor", 0.0f), U32("vocab_size", 334)}));
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->info().context_length, 128);
}

class Gemma3HostileHparamsTest : public ::testing::TestWithParam<Mutation> {};

TEST_P(Gemma3HostileHparamsTest, IsInvalidArgumentNamingTheKey) {
  const Mutation& m = GetParam();
  const std::vector<uint8_t> mutated = wt::RewriteKvs(Fixture(), m.edits);
  ASSERT_FALSE(mutated.empty());
  auto model = LoadBytes(mutated);
  ASSERT_FALSE(model.ok()) << m.name << " loaded";
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  const std::string msg = wt::Msg(model.status());
  RecordProperty("message", msg);  // readable with --gtest_output=xml
  EXPECT_THAT(msg, HasSubstr("model file: "));
  EXPECT_THAT(msg, HasSubstr("gemma3." + m.key));
  if (!m.also.empty()) {
    EXPECT_THAT(msg, HasSubstr(m.also));
  }
}

INSTANTIATE_TEST_SUITE_P(Keys, Gemma3HostileHparamsTest, ::testing::ValuesIn(Mutations()),
                         [](const ::testing::TestParamInfo<Mutation>& info) { return info.param.name; });

// The softcap fixture states final_logit_softcapping = 30; a broken value
// there must be caught the same way (a stored key, not an appended one).
TEST(Gemma3HparamsTest, StoredSoftcapIsChecked) {
  const std::vector<uint8_t> bytes = wt::ReadFileBytes(wt::TestDataPath("gemma3_tiny_softcap.gguf"));
  ASSERT_TRUE(LoadBytes(bytes).ok());
  auto model = LoadBytes(wt::RewriteKvs(bytes, {F32("final_logit_softcapping", -30.0f)}));
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wt::Msg(model.status()), HasSubstr("gemma3.final_logit_softcapping = -30 is out of range"));
}

TEST(Gemma3HparamsTest, RealModelStillLoads) {
  DECODED_REQUIRE_REAL_MODEL();
  auto model = Model::Load(wt::RealModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->info().n_layers, 18);
  EXPECT_EQ((*model)->info().context_length, 32768);
}

}  // namespace
}  // namespace decoded
