// Mixed steps (BatchDecoder::Step) on the Vulkan backend (lavapipe in CI):
// decode rows and prefill spans of several sessions in one held plan run. A
// session's logits must be byte-identical to its spans run alone and to D1
// one token per graph on the same device (tests/engine/mixed_step_check.h;
// the real model against its spans alone).
// D1 is fed one token at a time here, not in long chunks: a D1 chunk of
// TiledMatMulMinRows rows or more takes the tiled mat-mat, whose sums are
// ordered otherwise, while a held plan multiplies every row as a mat-vec
// (so a mixed step's results do not depend on how a step budget chunks a
// prompt, on this backend either). On every fixture and the real Gemma 3.
#include <memory>
#include <string>

#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/model_path.h"
#include "tests/common/test_backend.h"
#include "tests/common/test_vocabulary.h"
#include "tests/engine/mixed_step_check.h"

namespace decoded {
namespace {

class VulkanMixedStepTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VulkanMixedStepTest, EachSessionMatchesItsSpansAloneAndD1ByteForByte) {
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  const std::string path = testing::LoadableFixturePath(GetParam());
  ASSERT_FALSE(path.empty());
  testing::CheckMixedSteps(path, /*unit=*/1, /*capacity=*/64, /*d1_chunk=*/1, vulkan);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VulkanMixedStepTest, ::testing::ValuesIn(testing::kFamilyFixtures),
                         testing::FixtureTestName);

// Spans of up to 9 tokens, against the sessions alone only: D1 one token per
// graph records a plan per token, minutes of lavapipe for the real model (its
// held plan is shown equal to D1 in vulkan_decode_test). Even so it takes
// 80-450 s of lavapipe on the CI hosts (three quarters of it lavapipe
// running the shaders, measured with perf), so the Release build runs it and
// the sanitizer build skips it; the fixtures above cover the Vulkan path
// there. Nor does it run the control
// (one session's changed prompt moves only its rows): that is the engine's
// row bookkeeping, the same on every model, and the fixtures run it.
TEST(VulkanMixedStepRealModelTest, Gemma3) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "minutes of lavapipe; the Release build runs it";
#endif
  DECODED_REQUIRE_REAL_MODEL();
  DECODED_TEST_BACKEND_OR_SKIP(vulkan, "vulkan");
  testing::CheckMixedSteps(testing::RealModelPath(), /*unit=*/1, /*capacity=*/64, /*d1_chunk=*/0, vulkan,
                            /*control=*/false);
}

}  // namespace
}  // namespace decoded
