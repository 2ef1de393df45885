// The shared decode driver: D2 == D1 byte for byte, plans once, both KV-write
// offset paths agree, a held plan addresses only the caches each step names, and a
// rebind step allocates nothing. Runs on the tiny Gemma 3 fixture and on the
// real model.
#include "engine/decode_driver.h"
#include "engine/engine_counters.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/key_panels.h"
#include "engine/graph/optimizer.h"
#include "engine/model_registry.h"
#include "gtest/gtest.h"
#include "tests/common/counting_allocator.h"
#include "tests/common/model_path.h"

namespace decoded {
namespace {


struct Loaded {
  std::shared_ptr<const Weights> weights;
  std::unique_ptr<DecodeModel> model;
};

Loaded Load(const std::string& path, std::optional<KvOffsetPath> path_override = std::nullopt) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  auto weights = Weights::FromGguf(std::shared_ptr<const GgufFile>(std::move(*file)));
  EXPECT_TRUE(weights.ok()) << weights.status();
  FamilyOptions opts;
  opts.kv_offset_path = path_override;
  auto model = CreateFamily(*weights, opts);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  return {*weights, *std::move(model)};
}

std::unique_ptr<KvCache> NewKv(const DecodeModel& m, int32_t capacity) {
  auto kv = KvCache::Create(m.backend(), m.dims().n_layers, m.dims().n_kv_heads, m.dims().head_dim, capacity);
  EXPECT_TRUE(kv.ok());
  return *std::move(kv);
}

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

bool SameBytes(absl::Span<const float> a, absl::Span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Prefill `prompt` in both caches, then decode `n` greedy tokens: D1 (a fresh
// graph per token) on kv1, D2 (held plan) on kv2. Asserts byte equality of
// every step's logits and returns the D2 token sequence.
std::vector<int32_t> CheckD2MatchesD1(const DecodeModel& m, const std::vector<int32_t>& prompt, int n,
                                      Executor& ex) {
  auto kv1 = NewKv(m, 64), kv2 = NewKv(m, 64);
  auto l1 = forward_with_kv_context(m, *kv1, prompt, false, ex);
  auto l2 = forward_with_kv_context(m, *kv2, prompt, false, ex);
  EXPECT_TRUE(l1.ok() && l2.ok());
  int32_t tok = Argmax(*l1);
  DecodeSession session;
  const int64_t builds0 = GetEngineCounters().graph_builds, opt0 = OptimizerRuns();
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto d1 = forward_with_kv_context(m, *kv1, std::vector<int32_t>{tok}, false, ex);
    auto d2 = forward_with_kv_context_persistent(m, *kv2, session, tok, ex);
    EXPECT_TRUE(d1.ok() && d2.ok());
    EXPECT_TRUE(SameBytes(*d1, *d2)) << "D1 and D2 logits differ at decode step " << i;
    out.push_back(tok);
    tok = Argmax(*d2);
  }
  // n D1 builds (the control) + exactly one D2 build; same for optimizer runs.
  EXPECT_EQ(GetEngineCounters().graph_builds - builds0, n + 1);
  EXPECT_EQ(OptimizerRuns() - opt0, n + 1);
  return out;
}

class TinyFixtureTest : public ::testing::Test {
 protected:
  std::string path_ = testing::TestDataPath("gemma3_tiny_swa.gguf");
};

TEST_F(TinyFixtureTest, PersistentDecodeIsByteIdenticalToRebuildAndPlansOnce) {
  Loaded l = Load(path_);
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(2);
  CheckD2MatchesD1(*l.model, {2, 17, 33, 4, 99, 5, 6}, 12, ex);
}

TEST_F(TinyFixtureTest, HeldPlanBuildsOnceForManyTokens) {
  Loaded l = Load(path_);
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(1);
  auto kv = NewKv(*l.model, 64);
  DecodeSession s;
  const auto c0 = GetEngineCounters();
  const int64_t opt0 = OptimizerRuns();
  int32_t tok = 2;
  for (int i = 0; i < 10; ++i) {
    auto r = forward_with_kv_context_persistent(*l.model, *kv, s, tok, ex);
    ASSERT_TRUE(r.ok()) << r.status();
    tok = Argmax(*r);
  }
  const auto c1 = GetEngineCounters();
  EXPECT_EQ(c1.graph_builds - c0.graph_builds, 1);
  EXPECT_EQ(OptimizerRuns() - opt0, 1);
  EXPECT_EQ(c1.rebinds - c0.rebinds, 9);
  EXPECT_GT(s.bound_nodes, 0);
  EXPECT_EQ(c1.bound_nodes - c0.bound_nodes, s.bound_nodes);
  drop_decode_session(s);
  EXPECT_EQ(GetEngineCounters().bound_nodes, c0.bound_nodes);
}

TEST_F(TinyFixtureTest, DeviceOffsetAndSymbolPathsWriteIdenticalBytes) {
  Loaded dev = Load(path_, KvOffsetPath::kDeviceOffset);
  Loaded sym = Load(path_, KvOffsetPath::kSymbol);
  ASSERT_NE(dev.model, nullptr);
  ASSERT_NE(sym.model, nullptr);
  CpuExecutor ex(2);
  auto kv_d = NewKv(*dev.model, 32), kv_s = NewKv(*sym.model, 32);
  const std::vector<int32_t> prompt = {2, 40, 41, 42};
  auto pd = forward_with_kv_context(*dev.model, *kv_d, prompt, true, ex);
  auto ps = forward_with_kv_context(*sym.model, *kv_s, prompt, true, ex);
  ASSERT_TRUE(pd.ok() && ps.ok());
  EXPECT_TRUE(SameBytes(*pd, *ps));
  DecodeSession sd, ss;
  int32_t tok = Argmax(absl::MakeConstSpan(*pd).subspan(pd->size() - dev.model->dims().vocab));
  for (int i = 0; i < 9; ++i) {
    auto d = forward_with_kv_context_persistent(*dev.model, *kv_d, sd, tok, ex);
    auto s = forward_with_kv_context_persistent(*sym.model, *kv_s, ss, tok, ex);
    ASSERT_TRUE(d.ok() && s.ok());
    EXPECT_TRUE(SameBytes(*d, *s)) << "step " << i;
    tok = Argmax(*d);
  }
  // Only the rows written so far: the rest of a cache buffer is uninitialised
  // (kv_cache.h), so comparing it depends on what the allocator reused.
  // Keys may be in the CPU's 16-position panels (engine/cpu/key_panels.h):
  // compared element by element, written positions only.
  ASSERT_EQ(kv_d->write_offset(), kv_s->write_offset());
  const int32_t dim = kv_d->layout().k_dim, cap = kv_d->capacity();
  const bool panels = cpu::KeysInPanels(DType::kF32, true, cap, dim);
  for (int32_t layer = 0; layer < dev.model->dims().n_layers; ++layer) {
    for (int32_t h = 0; h < kv_d->n_kv_heads(); ++h) {
      const int64_t head = int64_t{h} * cap * dim;  // one block: [n_kv_heads, capacity] positions
      const auto* kd = static_cast<const float*>(kv_d->k(layer)) + head;
      const auto* ks = static_cast<const float*>(kv_s->k(layer)) + head;
      const auto* vd = static_cast<const float*>(kv_d->v(layer)) + head;
      const auto* vs = static_cast<const float*>(kv_s->v(layer)) + head;
      int differing = 0;
      for (int32_t p = 0; p < kv_d->write_offset(); ++p) {
        for (int32_t d = 0; d < dim; ++d) {
          const int64_t k = panels ? cpu::PanelElement(p, dim, d) : int64_t{p} * dim + d, v = int64_t{p} * dim + d;
          differing += std::memcmp(kd + k, ks + k, 4) != 0;
          differing += std::memcmp(vd + v, vs + v, 4) != 0;
        }
      }
      EXPECT_EQ(differing, 0) << "layer " << layer << " head " << h;
    }
  }
}

// A held plan is bound to no KV cache: each step's rows name theirs. Moving a
// session's plan to another cache of the model's geometry rebinds it (no
// rebuild) and gives exactly a fresh session's logits there, and the step
// writes the new cache only; a cache of another geometry is refused before
// anything runs.
TEST_F(TinyFixtureTest, HeldPlanFollowsTheCacheEachStepNames) {
  Loaded l = Load(path_);
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(1);
  const std::vector<int32_t> prompt_a = {2, 10, 11, 12, 13};
  const std::vector<int32_t> prompt_b = {2, 50, 51};
  auto kv_a = NewKv(*l.model, 32);
  ASSERT_TRUE(forward_with_kv_context(*l.model, *kv_a, prompt_a, false, ex).ok());
  DecodeSession s;
  ASSERT_TRUE(forward_with_kv_context_persistent(*l.model, *kv_a, s, 7, ex).ok());
  ASSERT_TRUE(forward_with_kv_context_persistent(*l.model, *kv_a, s, 8, ex).ok());

  auto kv_b = NewKv(*l.model, 32);
  ASSERT_TRUE(forward_with_kv_context(*l.model, *kv_b, prompt_b, false, ex).ok());
  const int64_t builds0 = GetEngineCounters().graph_builds;
  auto got = forward_with_kv_context_persistent(*l.model, *kv_b, s, 9, ex);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(GetEngineCounters().graph_builds - builds0, 0);
  std::vector<float> got_copy(got->begin(), got->end());

  auto kv_fresh = NewKv(*l.model, 32);
  ASSERT_TRUE(forward_with_kv_context(*l.model, *kv_fresh, prompt_b, false, ex).ok());
  DecodeSession fresh;
  auto want = forward_with_kv_context_persistent(*l.model, *kv_fresh, fresh, 9, ex);
  ASSERT_TRUE(want.ok());
  EXPECT_TRUE(SameBytes(got_copy, *want));
  EXPECT_EQ(kv_a->cached_len(), 7);
  EXPECT_EQ(kv_b->cached_len(), 4);

  // Another geometry (one layer short): refused, nothing written.
  auto wrong = KvCache::Create(l.model->backend(), l.model->dims().n_layers - 1, l.model->dims().kv_layout(), 32);
  ASSERT_TRUE(wrong.ok());
  const DecodeRow row{wrong->get(), 9};
  auto refused = rebind_and_realize_prebuilt(*l.model, absl::MakeConstSpan(&row, 1), s, ex);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*wrong)->cached_len(), 0);
}

TEST_F(TinyFixtureTest, RebindStepAllocatesNoHeapMemory) {
  Loaded l = Load(path_);
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(2);
  auto kv = NewKv(*l.model, 64);
  DecodeSession s;
  ASSERT_TRUE(forward_with_kv_context_persistent(*l.model, *kv, s, 2, ex).ok());
  ASSERT_TRUE(forward_with_kv_context_persistent(*l.model, *kv, s, 3, ex).ok());
  const int64_t before = testing::HeapAllocations();
  for (int32_t t = 4; t < 20; ++t) {
    const DecodeRow row{kv.get(), t};
    auto r = rebind_and_realize_prebuilt(*l.model, absl::MakeConstSpan(&row, 1), s, ex);
    ASSERT_TRUE(r.ok());
  }
  EXPECT_EQ(testing::HeapAllocations() - before, 0);
  // Control: the counter sees allocations (a D1 step builds a graph).
  const int64_t control = testing::HeapAllocations();
  ASSERT_TRUE(forward_with_kv_context(*l.model, *kv, std::vector<int32_t>{5}, false, ex).ok());
  EXPECT_GT(testing::HeapAllocations() - control, 0);
}

TEST_F(TinyFixtureTest, BadTokenAndFullCacheAreRejectedBeforeAnyWrite) {
  Loaded l = Load(path_);
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(1);
  auto kv = NewKv(*l.model, 4);
  EXPECT_EQ(forward_with_kv_context(*l.model, *kv, std::vector<int32_t>{2, -1}, false, ex).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(forward_with_kv_context(*l.model, *kv, std::vector<int32_t>{l.model->dims().vocab}, false, ex)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->cached_len(), 0);
  EXPECT_EQ(forward_with_kv_context(*l.model, *kv, std::vector<int32_t>{2, 3, 4, 5, 6}, false, ex).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(forward_with_kv_context(*l.model, *kv, std::vector<int32_t>{2, 3, 4}, false, ex).ok());
  DecodeSession s;
  ASSERT_TRUE(forward_with_kv_context_persistent(*l.model, *kv, s, 5, ex).ok());
  EXPECT_EQ(forward_with_kv_context_persistent(*l.model, *kv, s, 6, ex).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv->cached_len(), 4);
}

// Nothing a decode step touches is sized by the cache capacity: the held
// plan's arena and every bound data buffer are the same for a 64-row and a
// 4096-row cache (attention reads key bounds over the live range).
TEST_F(TinyFixtureTest, HeldPlanFootprintDoesNotDependOnCapacity) {
  Loaded l = Load(path_);
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(1);
  auto footprint = [&](int32_t capacity) {
    auto kv = NewKv(*l.model, capacity);
    DecodeSession s;
    EXPECT_TRUE(forward_with_kv_context_persistent(*l.model, *kv, s, 2, ex).ok());
    size_t bytes = s.plan->arena_bytes();
    for (const auto& b : s.buffers) bytes += b ? b->size() : 0;
    return bytes;
  };
  EXPECT_EQ(footprint(64), footprint(4096));
}

TEST(RealModelDriverTest, PersistentDecodeIsByteIdenticalToRebuild) {
  DECODED_REQUIRE_REAL_MODEL();
  Loaded l = Load(testing::RealModelPath());
  ASSERT_NE(l.model, nullptr);
  CpuExecutor ex(2);
  // "<bos>The capital of France is" tokenized by llama.cpp.
  CheckD2MatchesD1(*l.model, {2, 818, 5279, 529, 7001, 563}, 8, ex);
}

}  // namespace
}  // namespace decoded
