// Paged KV on the CPU: contexts whose KV caches take fixed-size blocks from a
// shared pool (engine/kv_pool.h).
//   - Exactness: on every family fixture and the three real models, the
//     mixed-step script on paged caches (blocks handed out shuffled) gives
//     the same bytes as on contiguous caches, through held plans and D1
//     (tests/engine/paged_kv_check.h).
//   - Memory follows the live length: a context holds ceil(len / block)
//     blocks, a rewind gives the ones past it back, and so does its end; the
//     engine's KV byte counter follows.
//   - A pool that runs dry refuses the step that needs a block with
//     RESOURCE_EXHAUSTED and writes nothing into any context; the blocks a
//     closed context gives back serve the next.
//   - Trim gives freed blocks' pages back while other threads take, fill
//     and read blocks: a block in use is never discarded (its KV would read
//     zeros and change the logits).
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_counters.h"
#include "engine/kv_pool.h"
#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/model_path.h"
#include "tests/common/test_vocabulary.h"
#include "tests/engine/paged_kv_check.h"

namespace decoded {
namespace {

using testing::CheckPagedMatchesContiguous;

class PagedKvFixtureTest : public ::testing::TestWithParam<const char*> {};

// Blocks of 5 positions: spans and chunks straddle block ends everywhere.
TEST_P(PagedKvFixtureTest, PagedCachesGiveTheContiguousBytes) {
  const std::string path = testing::LoadableFixturePath(GetParam());
  ASSERT_FALSE(path.empty());
  CheckPagedMatchesContiguous(path, /*unit=*/1, /*capacity=*/64, /*d1_chunk=*/7, /*block_tokens=*/5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PagedKvFixtureTest, ::testing::ValuesIn(testing::kFamilyFixtures),
                         testing::FixtureTestName);

// Spans of up to ~60 tokens on 16-token blocks (the serving default).
TEST(PagedKvRealModelTest, Gemma3) {
  DECODED_REQUIRE_REAL_MODEL();
  CheckPagedMatchesContiguous(testing::RealModelPath(), /*unit=*/6, 256, kMaxPrefillChunk, 16);
}

TEST(PagedKvRealModelTest, SmolLM2) {
  const testing::NamedModel m = testing::NamedModelPath("DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf");
  DECODED_REQUIRE_NAMED_MODEL(m);
  CheckPagedMatchesContiguous(m.path, /*unit=*/6, 256, kMaxPrefillChunk, 16);
}

TEST(PagedKvRealModelTest, Qwen2) {
  const testing::NamedModel m = testing::NamedModelPath("DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  DECODED_REQUIRE_NAMED_MODEL(m);
  CheckPagedMatchesContiguous(m.path, /*unit=*/6, 256, kMaxPrefillChunk, 16);
}

struct Loaded {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Executor> ex;
};

Loaded LoadFixture() {
  Loaded l;
  auto model = Model::Load(testing::LoadableFixturePath("llama_tiny.gguf"));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return l;
  l.model = *std::move(model);
  l.ex = CreateCpuExecutor(2);
  return l;
}

std::vector<int32_t> Ids(int n, int32_t first = 3) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

TEST(PagedKvTest, AContextHoldsTheBlocksOfItsLiveLength) {
  Loaded l = LoadFixture();
  ASSERT_NE(l.model, nullptr);
  auto pool = l.model->NewKvPool(/*block_tokens=*/4, /*n_blocks=*/16);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int64_t before = GetEngineCounters().kv_bytes;
  {
    auto ctx = l.model->NewContext(64, *pool);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    EXPECT_EQ((*ctx)->kv_blocks(), 0);
    EXPECT_EQ((*ctx)->kv_bytes(), 0);
    ASSERT_TRUE((*ctx)->Prefill(Ids(13), false, *l.ex).ok());
    EXPECT_EQ((*ctx)->kv_blocks(), 4);  // positions 0..12
    ASSERT_TRUE((*ctx)->Decode(7, *l.ex).ok());
    ASSERT_TRUE((*ctx)->Decode(8, *l.ex).ok());
    ASSERT_TRUE((*ctx)->Decode(9, *l.ex).ok());
    EXPECT_EQ((*ctx)->kv_blocks(), 4);  // 16 positions
    ASSERT_TRUE((*ctx)->Decode(10, *l.ex).ok());
    EXPECT_EQ((*ctx)->kv_blocks(), 5);
    EXPECT_EQ((*pool)->used_blocks(), 5);
    EXPECT_EQ((*ctx)->kv_bytes(), 5 * (*pool)->block_bytes());
    EXPECT_EQ(GetEngineCounters().kv_bytes - before, (*ctx)->kv_bytes());
    ASSERT_TRUE((*ctx)->Rewind(5).ok());
    EXPECT_EQ((*ctx)->kv_blocks(), 2);
    EXPECT_EQ((*pool)->used_blocks(), 2);
    ASSERT_TRUE((*ctx)->Rewind(0).ok());
    EXPECT_EQ((*ctx)->kv_blocks(), 0);
    ASSERT_TRUE((*ctx)->Prefill(Ids(3), false, *l.ex).ok());
    EXPECT_EQ((*pool)->used_blocks(), 1);
  }
  EXPECT_EQ((*pool)->used_blocks(), 0);
  EXPECT_EQ(GetEngineCounters().kv_bytes, before);
}

// What preemption counts as reclaimable: a block is freed by giving a set
// of references back only when no reference is left outside the set, and a
// block the set names twice counts once.
TEST(PagedKvTest, FreedByGivingCountsSharedBlocksOnceAndOnlyWhenNoOtherReaderIsLeft) {
  Loaded l = LoadFixture();
  ASSERT_NE(l.model, nullptr);
  auto made = l.model->NewKvPool(/*block_tokens=*/4, /*n_blocks=*/8);
  ASSERT_TRUE(made.ok()) << made.status();
  KvPool& pool = **made;
  ASSERT_EQ(pool.groups().n_groups(), 1);  // no sliding window: a range is one block
  // A holds 3 blocks, the first two registered as a prefix; B maps those
  // two (LookupPrefix: a reference each) and takes one of its own.
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.Take(3, &a).ok());
  const std::vector<int32_t> tokens = Ids(8);
  const KvPool::PrefixBlock first = pool.RegisterPrefix({a[0]}, {}, absl::MakeConstSpan(tokens).first(4));
  pool.RegisterPrefix({a[1]}, first, absl::MakeConstSpan(tokens).subspan(4, 4));
  std::vector<KvPool::PrefixBlock> found;
  pool.LookupPrefix(tokens, &found);
  ASSERT_EQ(found.size(), 2u);
  for (const KvPool::PrefixBlock& f : found) b.push_back(f.blocks[0]);
  ASSERT_TRUE(pool.Take(1, &b).ok());
  ASSERT_EQ(pool.used_blocks(), 4);

  EXPECT_EQ(pool.FreedByGiving(a), 1) << "B still reads A's first two blocks";
  EXPECT_EQ(pool.FreedByGiving(b), 1);
  std::vector<int32_t> both = a;
  both.insert(both.end(), b.begin(), b.end());
  EXPECT_EQ(pool.FreedByGiving(both), 4) << "the shared blocks count once";
  EXPECT_EQ(pool.FreedByGiving({a[2], a[2]}), 1);
  EXPECT_EQ(pool.FreedByGiving({}), 0);
  EXPECT_EQ(pool.FreedByGiving({-1, 99}), 0);  // not blocks of this pool
  pool.Give(a);
  EXPECT_EQ(pool.FreedByGiving(b), 3) << "B is their last reader now";
  pool.Give(b);
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.FreedByGiving(a), 0) << "free blocks have nothing to give";
}

TEST(PagedKvTest, ADryPoolRefusesTheStepAndWritesNothing) {
  Loaded l = LoadFixture();
  ASSERT_NE(l.model, nullptr);
  auto pool = l.model->NewKvPool(/*block_tokens=*/4, /*n_blocks=*/3);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = l.model->NewContext(64, *pool);
  auto b = l.model->NewContext(64, *pool);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Prefill(Ids(8), false, *l.ex).ok());  // 2 blocks
  // B's 8 tokens need 2 blocks; 1 is free.
  auto refused = (*b)->Prefill(Ids(8), false, *l.ex);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ((*b)->cached_len(), 0);

  auto decoder = l.model->NewBatchDecoder(4, 64);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  // A's next token takes the last block, B's 4 tokens find none: the step
  // is refused as a whole and neither context moves.
  const std::vector<int32_t> one = {5};
  const std::vector<int32_t> four = Ids(4);
  {
    const std::vector<StepSpan> spans = {{a->get(), one, SpanLogits::kLast}, {b->get(), four, SpanLogits::kLast}};
    auto step = (*decoder)->Step(spans, *l.ex);
    EXPECT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted) << step.status();
    EXPECT_EQ((*a)->cached_len(), 8);
    EXPECT_EQ((*b)->cached_len(), 0);
  }
  {
    const std::vector<StepSpan> spans = {{a->get(), one, SpanLogits::kLast}};
    auto step = (*decoder)->Step(spans, *l.ex);
    EXPECT_TRUE(step.ok()) << step.status();
    EXPECT_EQ((*a)->cached_len(), 9);
  }
  EXPECT_EQ((*pool)->free_blocks(), 0);
  a->reset();  // its 3 blocks go back
  EXPECT_EQ((*pool)->free_blocks(), 3);
  {
    const std::vector<StepSpan> spans = {{b->get(), four, SpanLogits::kLast}};
    auto step = (*decoder)->Step(spans, *l.ex);
    EXPECT_TRUE(step.ok()) << step.status();
    EXPECT_EQ((*b)->cached_len(), 4);
  }
}

TEST(PagedKvTest, APoolOfAnotherGeometryIsRefused) {
  Loaded l = LoadFixture();
  ASSERT_NE(l.model, nullptr);
  auto other = Model::Load(testing::LoadableFixturePath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(other.ok()) << other.status();
  auto pool = (*other)->NewKvPool(4, 4);
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto ctx = l.model->NewContext(64, *pool);
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument) << ctx.status();
  EXPECT_EQ(l.model->NewKvPool(0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(l.model->NewKvPool(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagedKvTest, TrimNeverDiscardsABlockInUse) {
  Loaded l = LoadFixture();
  ASSERT_NE(l.model, nullptr);
  constexpr int32_t kBlockTokens = 64;
  auto pool = l.model->NewKvPool(kBlockTokens, /*n_blocks=*/8);
  ASSERT_TRUE(pool.ok()) << pool.status();
  // A block must span whole pages for Discard to drop any.
  const int64_t per_layer = (*pool)->block_bytes() / (*pool)->n_layers();
  ASSERT_GE(per_layer / 2, 2 * sysconf(_SC_PAGESIZE)) << "the fixture's blocks are too small to discard";
  const std::vector<int32_t> prompt = Ids(70);  // 2 blocks
  std::vector<float> want;
  {
    auto ctx = l.model->NewContext(128, *pool);
    ASSERT_TRUE(ctx.ok());
    ASSERT_TRUE((*ctx)->Prefill(prompt, false, *l.ex).ok());
    auto logits = (*ctx)->Decode(5, *l.ex);
    ASSERT_TRUE(logits.ok()) << logits.status();
    want.assign(logits->begin(), logits->end());
  }
  std::atomic<bool> done{false};
  std::thread trimmer([&] {
    while (!done.load()) (*pool)->Trim();
  });
  // Two contexts at a time (4 of the 8 blocks), each cycle giving its
  // blocks back for the trimmer to discard and taking them again.
  std::atomic<int> mismatches{0};
  auto cycle = [&] {
    std::unique_ptr<Executor> ex = CreateCpuExecutor(1);
    for (int i = 0; i < 1000; ++i) {
      auto ctx = l.model->NewContext(128, *pool);
      if (!ctx.ok() || !(*ctx)->Prefill(prompt, false, *ex).ok()) {
        ++mismatches;
        continue;
      }
      auto logits = (*ctx)->Decode(5, *ex);
      if (!logits.ok() || logits->size() != want.size() ||
          std::memcmp(logits->data(), want.data(), want.size() * sizeof(float)) != 0) {
        ++mismatches;
      }
    }
  };
  std::thread other(cycle);
  cycle();
  other.join();
  done = true;
  trimmer.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ((*pool)->free_blocks(), 8);
}

}  // namespace
}  // namespace decoded
