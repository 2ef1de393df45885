// The paged-KV exactness check, shared by the CPU test
// (tests/engine/paged_kv_test.cc) and the Vulkan one: the mixed-step script
// (tests/engine/mixed_step_check.h) run on contexts whose KV caches take
// their blocks from one pool, handed out in a shuffled order (so a cache's
// blocks are neither contiguous nor ascending, and sessions' blocks
// interleave), must give byte-identical logits to the same script on
// contiguous caches; and so must D1. Attention reads keys in position order
// whatever the blocks (engine/kv_rows.h), so "the same" is exact equality.
#ifndef DECODED_TESTS_ENGINE_PAGED_KV_CHECK_H_
#define DECODED_TESTS_ENGINE_PAGED_KV_CHECK_H_

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/kv_pool.h"
#include "engine/runtime.h"
#include "gtest/gtest.h"
#include "tests/engine/mixed_step_check.h"

namespace decoded::testing {

// Takes every free block and gives them back shuffled: the pool then hands
// them out in that order.
inline void ScrambleFreeBlocks(KvPool& pool, uint32_t seed) {
  std::vector<int32_t> all;
  ASSERT_TRUE(pool.Take(pool.free_blocks(), &all).ok());
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  pool.Give(all);
}

inline void CheckPagedMatchesContiguous(const std::string& path, int unit, int32_t capacity, int32_t d1_chunk,
                                        int32_t block_tokens, std::shared_ptr<Backend> backend = nullptr,
                                        DType kv_type = DType::kF32) {
  ModelLoadOptions options;
  options.backend = std::move(backend);
  options.kv_type = kv_type;
  auto model = Model::Load(path, options);
  ASSERT_TRUE(model.ok()) << path << ": " << model.status();
  auto made = (*model)->backend().CreateExecutor(2, nullptr);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<Executor> ex = *std::move(made);
  const Script script = MakeScript((*model)->info().vocab_size, unit, 23);

  const int32_t per_session = (capacity + block_tokens - 1) / block_tokens;
  auto probe = (*model)->NewKvPool(block_tokens, 1);
  ASSERT_TRUE(probe.ok()) << probe.status();
  // A block of each layer group per position range (engine/kv_groups.h).
  const int32_t groups = (*probe)->groups().n_groups();
  auto pool = (*model)->NewKvPool(block_tokens, (kSessions * per_session + 3) * groups);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ScrambleFreeBlocks(**pool, 5);

  auto decoder = (*model)->NewBatchDecoder(16, 256);
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const std::vector<Rows> contiguous = Run(**model, **decoder, script, capacity, *ex);
  const std::vector<Rows> paged = Run(**model, **decoder, script, capacity, *ex, *pool);
  ASSERT_EQ(paged.size(), static_cast<size_t>(kSessions));
  ASSERT_EQ(contiguous.size(), static_cast<size_t>(kSessions));
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(paged[static_cast<size_t>(i)].size(), contiguous[static_cast<size_t>(i)].size()) << "session " << i;
    EXPECT_EQ(Mismatches(paged, contiguous)[static_cast<size_t>(i)], 0) << "session " << i << " of " << path;
  }
  // The contexts are gone: every block is back.
  EXPECT_EQ((*pool)->free_blocks(), (*pool)->n_blocks());

  if (d1_chunk > 0) {
    ScrambleFreeBlocks(**pool, 7);
    const std::vector<Rows> d1 = RunD1(**model, script, capacity, d1_chunk, *ex);
    const std::vector<Rows> d1_paged = RunD1(**model, script, capacity, d1_chunk, *ex, *pool);
    ASSERT_EQ(d1_paged.size(), static_cast<size_t>(kSessions));
    for (int i = 0; i < kSessions; ++i) {
      EXPECT_EQ(Mismatches(d1_paged, d1)[static_cast<size_t>(i)], 0) << "D1, session " << i << " of " << path;
    }
    EXPECT_EQ((*pool)->free_blocks(), (*pool)->n_blocks());
  }
}

}  // namespace decoded::testing

#endif  // DECODED_TESTS_ENGINE_PAGED_KV_CHECK_H_
