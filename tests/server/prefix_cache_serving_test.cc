// Prefix caching across sessions (EngineOptions::prefix_cache) on every
// family fixture and the three real models:
//   - A session whose prompt starts with blocks another session computed maps
//     them instead of prefilling them: Usage::cached_tokens counts them,
//     prefilled_tokens does not, and the decoded_prefix_cache_* counters
//     follow.
//   - Exactness: its tokens and every token's logprob and top-20 logprobs
//     (log-softmax of the logits rows) are byte-identical to the same turn
//     on an engine with the cache off. "The same" is exact here because on
//     the CPU a row's arithmetic depends only on its own token and its key
//     range, never on how the prompt was cut into spans
//     (BatchDecoder::Step): the donor's KV bytes for a block are the bytes
//     this session would compute. (A backend where a span's results depend
//     on its size, Backend::prefill_depends_on_chunk_rows, gives the logits
//     of the donor's chunking for the shared part instead.)
//   - The key chains the blocks: a prompt whose first block differs gets no
//     hit though its later blocks match cached ones (each key covers every
//     token before it; the lookup stops at the first miss).
//   - Shown to fail: keys and lookups that ignore the block's tokens map
//     other tokens' KV, and the logprobs differ (hundreds of mismatches).
//   - The whole prompt cached: the last token is still computed (its logits
//     are the turn's first), so at most floor((n - 1) / block) blocks hit.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/model_path.h"
#include "tests/common/test_vocabulary.h"
#include "tests/server/prefix_cache_check.h"

namespace decoded::serving {
namespace {

using testing::CheckPrefixCache;
constexpr int32_t kBlock = 4;

class PrefixCacheFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheFixtureTest, CachedBlocksGiveTheSameLogitsAsComputingThem) {
  const std::string path = decoded::testing::LoadableFixturePath(GetParam());
  ASSERT_FALSE(path.empty());
  CheckPrefixCache(path, kBlock, 18, 64);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheFixtureTest, ::testing::ValuesIn(decoded::testing::kFamilyFixtures),
                         decoded::testing::FixtureTestName);

// The serving default of 16-token blocks; a 40-token shared prefix.
TEST(PrefixCacheRealModelTest, Gemma3) {
  DECODED_REQUIRE_REAL_MODEL();
  CheckPrefixCache(decoded::testing::RealModelPath(), 16, 40, 256);
}

TEST(PrefixCacheRealModelTest, SmolLM2) {
  const decoded::testing::NamedModel m = decoded::testing::NamedModelPath("DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf");
  DECODED_REQUIRE_NAMED_MODEL(m);
  CheckPrefixCache(m.path, 16, 40, 256);
}

TEST(PrefixCacheRealModelTest, Qwen2) {
  const decoded::testing::NamedModel m = decoded::testing::NamedModelPath("DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  DECODED_REQUIRE_NAMED_MODEL(m);
  CheckPrefixCache(m.path, 16, 40, 256);
}

}  // namespace
}  // namespace decoded::serving
