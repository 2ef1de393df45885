// KvCache::Create on geometries from an untrusted model file: a byte size
// beyond int64 is refused before anything is allocated, and a failed
// allocation leaves the engine's KV byte counter as it was.
#include "engine/kv_cache.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/engine_counters.h"
#include "gtest/gtest.h"

namespace decoded {
namespace {

// Serves `budget` allocations from the CPU backend, then refuses; counts calls.
class FailingBackend final : public Backend {
 public:
  explicit FailingBackend(int budget) : budget_(budget) {}
  std::string_view name() const override { return "failing"; }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes, BufferAccess) override {
    ++calls;
    if (budget_-- <= 0) return absl::ResourceExhaustedError("refused");
    return CpuBackend().Allocate(bytes);
  }
  void Upload(DeviceBuffer& dst, const void* src, size_t bytes, size_t offset) override {
    CpuBackend().Upload(dst, src, bytes, offset);
  }
  absl::StatusOr<std::unique_ptr<CompiledPlan>> Compile(Graph, MemoryPlan, const PlanResources&) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<std::unique_ptr<Executor>> CreateExecutor(int threads, const std::atomic<int>* lent) override {
    return CpuBackend().CreateExecutor(threads, lent);
  }
  int64_t allocated_bytes() const override { return 0; }
  absl::Status CheckSupported(const Graph&) const override { return absl::UnimplementedError("not used"); }
  int calls = 0;

 private:
  int budget_;
};

TEST(KvCacheTest, ByteSizeBeyondInt64IsRefusedBeforeAllocating) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  FailingBackend backend(1000);
  // 2 * 2^31 * 2^31 * 2^31 * 2^31 * 4 bytes: far beyond 2^63.
  auto kv = KvCache::Create(backend, kMax, kMax, kMax, kMax);
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.calls, 0);
  // 1024 layers x 2 x 4 bytes x 2^21 x 2^16 x 2^16 = 2^66: only the layer
  // factor overflows.
  auto kv2 = KvCache::Create(backend, 1024, 1 << 21, 1 << 16, 1 << 16);
  EXPECT_EQ(kv2.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(backend.calls, 0);
}

TEST(KvCacheTest, FailedAllocationLeavesTheCounterUnchanged) {
  const int64_t before = GetEngineCounters().kv_bytes;
  {
    FailingBackend backend(3);  // K and V of layer 0, K of layer 1, then refuses
    auto kv = KvCache::Create(backend, 4, 2, 16, 8);
    EXPECT_EQ(kv.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(backend.calls, 4);
  }
  EXPECT_EQ(GetEngineCounters().kv_bytes, before);
  {
    FailingBackend backend(9);  // the pool's 8 buffers and the block table
    auto kv = KvCache::Create(backend, 4, 2, 16, 8);
    ASSERT_TRUE(kv.ok()) << kv.status();
    // 2 (K, V) x 4 layers x 2 heads x 16 dims x 8 positions x 4 bytes.
    EXPECT_EQ((*kv)->bytes(), 2 * 4 * 2 * 16 * 8 * 4);
    EXPECT_EQ(GetEngineCounters().kv_bytes - before, (*kv)->bytes());
  }
  EXPECT_EQ(GetEngineCounters().kv_bytes, before);
}

}  // namespace
}  // namespace decoded
