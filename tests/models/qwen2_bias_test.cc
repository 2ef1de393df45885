// Qwen2 requires its q/k/v biases (LlamaStyleSpec::qkv_bias_required): a file
// with one of them missing is refused NOT_FOUND naming the tensor, in the first
// layer or a later one, instead of loading as a bias-free Llama layer that
// would produce plausible but wrong logits.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/edited_fixture.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;
using ::testing::HasSubstr;

TEST(Qwen2BiasTest, FixtureWithItsBiasesLoads) {
  auto m = wt::LoadEditedFixture("qwen2_tiny.gguf", {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->family(), "qwen2");
}

TEST(Qwen2BiasTest, EachMissingBiasIsNotFoundNamingTheTensor) {
  for (const std::string tensor : {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.1.attn_v.bias"}) {
    SCOPED_TRACE(tensor);
    auto m = wt::LoadEditedFixture("qwen2_tiny.gguf", {}, {{tensor, tensor + "_renamed", std::nullopt}});
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(tensor));
  }
}

TEST(Qwen2BiasTest, ALayerWithoutAnyBiasIsRefused) {
  std::vector<wt::TensorEdit> edits;
  for (const std::string t : {"q", "k", "v"}) {
    const std::string name = "blk.1.attn_" + t + ".bias";
    edits.push_back({name, name + "_renamed", std::nullopt});
  }
  auto m = wt::LoadEditedFixture("qwen2_tiny.gguf", {}, edits);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("blk.1.attn_q.bias"));
}

}  // namespace
}  // namespace decoded
