// Paged KV on the Vulkan backend (lavapipe in CI): the mixed-step script on
// caches whose blocks come shuffled from one pool gives the bytes of the same
// script on contiguous caches, through held plans and D1, on every family
// fixture (tests/engine/paged_kv_check.h). The real model runs paged through
// the serving engine (vulkan_serving_test), whose default KV is paged.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/model_path.h"
#include "tests/common/test_backend.h"
#include "tests/common/test_vocabulary.h"
#include "tests/engine/paged_kv_check.h"

namespace decoded {
namespace {

class VulkanPagedKvTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VulkanPagedKvTest, PagedCachesGiveTheContiguousBytes) {
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  const std::string path = testing::LoadableFixturePath(GetParam());
  ASSERT_FALSE(path.empty());
  testing::CheckPagedMatchesContiguous(path, /*unit=*/1, /*capacity=*/64, /*d1_chunk=*/7, /*block_tokens=*/5, vulkan);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VulkanPagedKvTest, ::testing::ValuesIn(testing::kFamilyFixtures),
                         testing::FixtureTestName);

}  // namespace
}  // namespace decoded
