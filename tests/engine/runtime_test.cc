// The model-level API: loading, per-session KV accounting, and its errors.
#include "engine/runtime.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/model_path.h"

namespace decoded {
namespace {

TEST(ModelLoadTest, MissingFileIsNotFound) {
  auto m = Model::Load("/nonexistent/model.gguf");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelLoadTest, GarbageFileIsInvalidArgument) {
  const std::string path = ::testing::TempDir() + "/garbage.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out << "this is not a gguf file at all";
  }
  auto m = Model::Load(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  std::remove(path.c_str());
}

TEST(ModelLoadTest, TinyFixtureLoadsWithItsGeometry) {
  auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelInfo& info = (*m)->info();
  EXPECT_EQ(info.family, "gemma3");
  EXPECT_EQ(info.n_layers, 6);
  EXPECT_EQ(info.hidden_size, 64);
  EXPECT_EQ(info.sliding_window, 4);
  EXPECT_EQ(info.device, "cpu");
  EXPECT_EQ((*m)->NewContext(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->NewContext(info.context_length + 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelLoadTest, PrefillChunkBoundsAreChecked) {
  auto m = Model::Load(testing::TestDataPath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(m.ok());
  auto ctx = (*m)->NewContext(128);
  ASSERT_TRUE(ctx.ok());
  auto ex = CreateCpuExecutor(1);
  EXPECT_EQ((*ctx)->Prefill({}, false, *ex).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(kMaxPrefillChunk + 1, 5);
  EXPECT_EQ((*ctx)->Prefill(too_long, false, *ex).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*ctx)->cached_len(), 0);
}

TEST(RealModelRuntimeTest, KvBytesFollowTheGeometryAndAreReleased) {
  DECODED_REQUIRE_REAL_MODEL();
  auto model = Model::Load(testing::RealModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  const EngineCounters before = GetEngineCounters();
  {
    auto ctx = (*model)->NewContext(1024);
    ASSERT_TRUE(ctx.ok());
    // 2 (K, V) x 18 layers x 1 kv head x 256 head_dim x 1024 positions x 4 bytes (f32).
    EXPECT_EQ((*ctx)->kv_bytes(), 2LL * 18 * 1 * 256 * 1024 * 4);
    EXPECT_EQ(GetEngineCounters().kv_bytes - before.kv_bytes, (*ctx)->kv_bytes());
    auto ex = CreateCpuExecutor(2);
    ASSERT_TRUE((*ctx)->Prefill(std::vector<int32_t>{2, 818, 5279}, false, *ex).ok());
    ASSERT_TRUE((*ctx)->Decode(529, *ex).ok());
    EXPECT_GT((*ctx)->bound_nodes(), 0);
    EXPECT_EQ(GetEngineCounters().bound_nodes - before.bound_nodes, (*ctx)->bound_nodes());
    EXPECT_EQ(GetEngineCounters().live_contexts - before.live_contexts, 1);
  }
  const EngineCounters after = GetEngineCounters();
  EXPECT_EQ(after.kv_bytes, before.kv_bytes);
  EXPECT_EQ(after.bound_nodes, before.bound_nodes);
  EXPECT_EQ(after.live_contexts, before.live_contexts);
}

}  // namespace
}  // namespace decoded
