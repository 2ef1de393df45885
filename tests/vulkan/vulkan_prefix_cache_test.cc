// Prefix caching across sessions on the Vulkan backend (lavapipe in CI): a
// turn served from cached blocks gives the same tokens and bitwise the same
// logprobs and top-20 logprobs as with the cache off
// (tests/server/prefix_cache_check.h), on every family fixture. Exact here
// too because the serving engine steps prompts through held plans (mixed
// steps, --max_step_tokens), which multiply every row as a mat-vec: a row's
// results depend on its token and key range only, not on the span it came
// in, so the donor's KV bytes are the bytes this session would compute. (A
// D1 chunk of TiledMatMulMinRows rows and more takes the tiled mat-mat, whose
// sums are ordered otherwise: the serving engine does not prefill through D1
// with mixed steps on.)
#include <string>

#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/model_path.h"
#include "tests/common/test_backend.h"
#include "tests/common/test_vocabulary.h"
#include "tests/server/prefix_cache_check.h"

namespace decoded::serving {
namespace {

class VulkanPrefixCacheTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VulkanPrefixCacheTest, CachedBlocksGiveTheSameLogitsAsComputingThem) {
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  const std::string path = decoded::testing::LoadableFixturePath(GetParam());
  ASSERT_FALSE(path.empty());
  testing::CheckPrefixCache(path, /*bt=*/4, /*shared=*/18, /*context=*/64, vulkan);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VulkanPrefixCacheTest, ::testing::ValuesIn(decoded::testing::kFamilyFixtures),
                         decoded::testing::FixtureTestName);

}  // namespace
}  // namespace decoded::serving
