// Layer groups of the paged KV cache (engine/kv_groups.h) and what they are
// for: a sliding-window group gives its blocks back once they leave the
// window, a cache cannot rewind to where a query would read a block it gave
// back, and the prefix cache matches a chain whose sliding blocks are there
// only for the window's reach (engine/kv_pool.h). That a context over such a
// cache gives the contiguous cache's logits byte for byte is
// tests/engine/paged_kv_test.cc's check (the Gemma 3 fixtures have a window of
// 4 positions, so their blocks go back all through it) and the long-prompt
// test below on the real Gemma 3.
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/kv_groups.h"
#include "engine/kv_pool.h"
#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/common/test_vocabulary.h"

namespace decoded {
namespace {

TEST(KvGroupsTest, NoWindowIsOneGroupOfEveryLayer) {
  auto g = KvGroups::ForWindows({0, 0, 0, 0});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(*g, KvGroups::Single(4));
  EXPECT_EQ(g->n_groups(), 1);
  EXPECT_FALSE(g->any_sliding());
}

TEST(KvGroupsTest, Gemma3LayersGroupByWindowInEqualGroups) {
  // Gemma 3 270M: 18 layers, every sixth global, the others a window of 512.
  std::vector<int32_t> windows;
  for (int32_t l = 0; l < 18; ++l) windows.push_back((l + 1) % 6 == 0 ? 0 : 512);
  auto g = KvGroups::ForWindows(windows);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->layers_per_group, 3);  // gcd(3 global, 15 local)
  ASSERT_EQ(g->n_groups(), 6);
  // Groups in the order of their first layer: local 0-2, local 3, 4 and 6,
  // global 5, 11 and 17, local 7-9, ...
  EXPECT_EQ(g->window, (std::vector<int32_t>{512, 512, 0, 512, 512, 512}));
  for (int32_t l = 0; l < 18; ++l) {
    EXPECT_EQ(g->window[static_cast<size_t>(g->group_of[static_cast<size_t>(l)])], windows[static_cast<size_t>(l)])
        << "layer " << l;
  }
  EXPECT_EQ(g->group_of[5], 2);
  EXPECT_EQ(g->slot_of[5], 0);
  EXPECT_EQ(g->group_of[17], 2);
  EXPECT_EQ(g->slot_of[17], 2);
  EXPECT_EQ(g->group_of[6], 1);
  EXPECT_EQ(g->slot_of[6], 2);
  EXPECT_EQ(g->FirstRead(0, 1000), 489);  // a query at 1000 sees 489..1000
  EXPECT_EQ(g->FirstRead(2, 1000), 0);
  EXPECT_EQ(g->FirstRead(0, 100), 0);
}

TEST(KvGroupsTest, CountsWithoutACommonDivisorGiveGroupsOfOneLayer) {
  auto g = KvGroups::ForWindows({0, 8, 8});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->layers_per_group, 1);
  EXPECT_EQ(g->window, (std::vector<int32_t>{0, 8, 8}));
  EXPECT_FALSE(KvGroups::ForWindows({}).ok());
  EXPECT_FALSE(KvGroups::ForWindows({0, -1}).ok());
}

std::vector<int32_t> Ids(int n, int32_t first = 3) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The blocks a context at `len` holds once it reserved room for the next
// token: every range up to len + 1 in a full group, from the window's reach in
// a sliding one.
int32_t ExpectedBlocks(const KvGroups& g, int32_t bt, int32_t len) {
  const int32_t ranges = (len + 1 + bt - 1) / bt;
  int32_t n = 0;
  for (int32_t i = 0; i < g.n_groups(); ++i) n += ranges - g.FirstRead(i, len) / bt;
  return n;
}

TEST(KvGroupsTest, SlidingGroupsGiveBackTheBlocksThatLeftTheWindow) {
  auto model = Model::Load(testing::LoadableFixturePath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_GT((*model)->info().sliding_window, 0);
  auto ex = CreateCpuExecutor(2);
  constexpr int32_t kBt = 2;
  auto pool = (*model)->NewKvPool(kBt, 200);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const KvGroups& g = (*pool)->groups();
  ASSERT_TRUE(g.any_sliding());
  auto ctx = (*model)->NewContext(64, *pool);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  DecodeContext& c = **ctx;
  ASSERT_TRUE(c.Prefill(Ids(20), false, *ex).ok());
  for (int32_t t = 0; t < 12; ++t) {
    ASSERT_TRUE(c.Decode(5 + t, *ex).ok());
    // Decode reserved the row it wrote; the next reserve gives back what
    // fell out of the window at the current length.
    ASSERT_TRUE(c.ReserveKv(1).ok());
    EXPECT_EQ(c.kv_blocks(), ExpectedBlocks(g, kBt, c.cached_len())) << "at " << c.cached_len();
  }
  const int32_t all = ((c.cached_len() + 1 + kBt - 1) / kBt) * g.n_groups();
  EXPECT_LT(c.kv_blocks(), all);
  EXPECT_EQ((*pool)->used_blocks(), c.kv_blocks());
  EXPECT_EQ(c.kv_bytes(), c.kv_blocks() * (*pool)->block_bytes());

  // Back into the window: fine. Further back: the sliding groups gave those
  // blocks away, so only a full recompute (0) is possible.
  const int32_t len = c.cached_len();
  EXPECT_EQ(c.RewindableTo(len - 1), len - 1);
  EXPECT_EQ(c.RewindableTo(5), 0);
  EXPECT_EQ(c.Rewind(5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.cached_len(), len);
  ASSERT_TRUE(c.Rewind(len - 1).ok());
  ASSERT_TRUE(c.Rewind(0).ok());
  EXPECT_EQ(c.kv_blocks(), 0);
  EXPECT_EQ((*pool)->used_blocks(), 0);
}

// After a rewind into the window the context goes on with the same logits as
// one that never went further.
TEST(KvGroupsTest, ARewindInsideTheWindowGivesTheLogitsOfAContextThatStoppedThere) {
  auto model = Model::Load(testing::LoadableFixturePath("gemma3_tiny_swa.gguf"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto ex = CreateCpuExecutor(2);
  auto pool = (*model)->NewKvPool(2, 200);
  ASSERT_TRUE(pool.ok());
  auto a = (*model)->NewContext(64, *pool);
  auto b = (*model)->NewContext(64, *pool);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Prefill(Ids(30), false, *ex).ok());
  for (int32_t t = 0; t < 3; ++t) ASSERT_TRUE((*a)->Decode(40 + t, *ex).ok());
  ASSERT_TRUE((*a)->Rewind(31).ok());
  ASSERT_TRUE((*b)->Prefill(Ids(30), false, *ex).ok());
  ASSERT_TRUE((*b)->Decode(40, *ex).ok());
  auto la = (*a)->Decode(7, *ex);
  ASSERT_TRUE(la.ok());
  const std::vector<float> after_rewind(la->begin(), la->end());
  auto lb = (*b)->Decode(7, *ex);
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(after_rewind, std::vector<float>(lb->begin(), lb->end()));
}

// The real Gemma 3 (window 512) past its window: a paged context whose
// sliding groups gave blocks back gives the contiguous cache's logits byte for
// byte, through prefill chunks and decode steps, while holding fewer blocks.
TEST(KvGroupsRealModelTest, Gemma3PastItsWindowHoldsLessAndComputesTheSame) {
  DECODED_REQUIRE_REAL_MODEL();
  auto model = Model::Load(testing::RealModelPath());
  ASSERT_TRUE(model.ok()) << model.status();
  auto ex = CreateCpuExecutor(2);
  constexpr int32_t kBt = 16, kPrompt = 700, kCapacity = 720;
  auto pool = (*model)->NewKvPool(kBt, 400);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const KvGroups& g = (*pool)->groups();
  ASSERT_EQ(g.n_groups(), 6);
  auto paged = (*model)->NewContext(kCapacity, *pool);
  auto contiguous = (*model)->NewContext(kCapacity);
  ASSERT_TRUE(paged.ok() && contiguous.ok());
  std::vector<int32_t> prompt(kPrompt);
  for (int32_t i = 0; i < kPrompt; ++i) prompt[static_cast<size_t>(i)] = 2 + (i * 7919) % 200000;
  for (DecodeContext* c : {paged->get(), contiguous->get()}) {
    for (int32_t at = 0; at < kPrompt; at += kMaxPrefillChunk) {
      const size_t n = static_cast<size_t>(std::min(kMaxPrefillChunk, kPrompt - at));
      ASSERT_TRUE(c->Prefill(absl::MakeConstSpan(prompt).subspan(static_cast<size_t>(at), n), false, *ex).ok());
    }
  }
  for (int32_t t = 0; t < 4; ++t) {
    auto a = (*paged)->Decode(100 + t, *ex);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::vector<float> pl(a->begin(), a->end());
    auto b = (*contiguous)->Decode(100 + t, *ex);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(pl, std::vector<float>(b->begin(), b->end())) << "decode step " << t;
  }
  ASSERT_TRUE((*paged)->ReserveKv(1).ok());
  const int32_t len = (*paged)->cached_len();
  EXPECT_EQ((*paged)->kv_blocks(), ExpectedBlocks(g, kBt, len));
  // 1 full group of 45 ranges, 5 sliding groups of the 33 their window reaches.
  EXPECT_EQ((*paged)->kv_blocks(), 45 + 5 * 33);
}

// The prefix index over a full group and a sliding one (window 5) of one
// layer each, 4 positions per block.
class SlidingPrefixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = KvGroups::ForWindows({0, 5});
    ASSERT_TRUE(g.ok());
    auto pool = KvPool::Create(CpuBackend(), *g, KvLayout::Separate(1, 4), kBt, 8);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    // Four ranges of 4 tokens, blocks (full, sliding) per range.
    ASSERT_TRUE(pool_->Take(8, &held_).ok());
    KvPool::PrefixBlock parent;
    for (int32_t r = 0; r < 4; ++r) {
      parent = pool_->RegisterPrefix({Full(r), Sliding(r)}, parent, absl::MakeConstSpan(tokens_).subspan(4 * r, 4));
      ASSERT_EQ(parent.blocks, (std::vector<int32_t>{Full(r), Sliding(r)}));
    }
  }
  int32_t Full(int32_t r) const { return held_[static_cast<size_t>(2 * r)]; }
  int32_t Sliding(int32_t r) const { return held_[static_cast<size_t>(2 * r + 1)]; }
  // Ranges matched for the 16 tokens plus one (a context continues after).
  std::vector<KvPool::PrefixBlock> Lookup() {
    std::vector<int32_t> t = tokens_;
    t.push_back(99);
    std::vector<KvPool::PrefixBlock> found;
    pool_->LookupPrefix(t, &found);
    return found;
  }
  void GiveBack(const std::vector<KvPool::PrefixBlock>& found) {
    for (const auto& f : found) {
      for (int32_t b : f.blocks) {
        if (b >= 0) pool_->Give({b});
      }
    }
  }
  // Gives every held block back, `first` least recently used (in that
  // order), the rest after them, then takes first.size() blocks: those.
  void EvictFirst(const std::vector<int32_t>& first) {
    std::vector<int32_t> order = first;
    for (int32_t b : held_) {
      if (std::find(first.begin(), first.end(), b) == first.end()) order.push_back(b);
    }
    pool_->Give(order);
    std::vector<int32_t> taken;
    ASSERT_TRUE(pool_->Take(static_cast<int32_t>(first.size()), &taken).ok());
    ASSERT_EQ(taken, first);
  }

  static constexpr int32_t kBt = 4;
  std::shared_ptr<KvPool> pool_;
  std::vector<int32_t> held_;
  std::vector<int32_t> tokens_ = Ids(16);
};

TEST_F(SlidingPrefixTest, AMatchMapsTheSlidingBlocksOnlyWithinTheWindowFromItsEnd) {
  pool_->Give(held_);
  EXPECT_EQ(pool_->cached_free_blocks(), 8);
  const std::vector<KvPool::PrefixBlock> found = Lookup();
  ASSERT_EQ(found.size(), 4u);
  // A query at 16 reads 12..16: only range 3 of the sliding group.
  for (int32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(found[static_cast<size_t>(r)].blocks[0], Full(r));
    EXPECT_EQ(found[static_cast<size_t>(r)].blocks[1], r == 3 ? Sliding(3) : -1) << "range " << r;
  }
  EXPECT_EQ(pool_->used_blocks(), 5);
  // A cache adopts them as they are.
  auto kv = KvCache::CreatePaged(pool_, 32);
  ASSERT_TRUE(kv.ok());
  std::vector<int32_t> flat;
  for (const auto& f : found) flat.insert(flat.end(), f.blocks.begin(), f.blocks.end());
  ASSERT_TRUE((*kv)->Adopt(flat).ok());
  EXPECT_EQ((*kv)->cached_len(), 16);
  EXPECT_EQ((*kv)->held_blocks(), 5);
  EXPECT_EQ((*kv)->block(1, 2), -1);
  EXPECT_EQ((*kv)->block(1, 3), Sliding(3));
  // ... but not with a sliding block missing inside the window.
  auto other = KvCache::CreatePaged(pool_, 32);
  ASSERT_TRUE(other.ok());
  flat[2 * 3 + 1] = -1;
  EXPECT_EQ((*other)->Adopt(flat).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SlidingPrefixTest, AnEvictedSlidingBlockOutsideTheWindowStillMatches) {
  EvictFirst({Sliding(0)});
  EXPECT_EQ(Lookup().size(), 4u);
}

TEST_F(SlidingPrefixTest, AMatchEndsWhereTheWindowLacksABlock) {
  // Range 3's sliding block gone: a context at 16 reads 12..16 and cannot
  // go on from there; one at 12 reads range 2's.
  EvictFirst({Sliding(3)});
  const std::vector<KvPool::PrefixBlock> found = Lookup();
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[2].blocks[1], Sliding(2));
  EXPECT_EQ(found[1].blocks[1], -1);
}

TEST_F(SlidingPrefixTest, AMatchEndsBeforeARangeThatLostItsFullBlock) {
  // Range 1's entry goes with its full block: the chain is range 0 alone,
  // whose sliding block a context at 4 reads (0..4).
  EvictFirst({Sliding(3), Full(1)});
  const std::vector<KvPool::PrefixBlock> found = Lookup();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].blocks, (std::vector<int32_t>{Full(0), Sliding(0)}));
}

TEST_F(SlidingPrefixTest, NothingMatchesWhenTheOnlyRangeLacksItsWindowBlock) {
  EvictFirst({Sliding(0), Full(1)});
  EXPECT_TRUE(Lookup().empty());
}

}  // namespace
}  // namespace decoded
