// The prefix-cache exactness check (tests/server/prefix_cache_serving_test.cc
// on the CPU, tests/vulkan/vulkan_prefix_cache_test.cc on Vulkan): a turn
// served from cached blocks against the same turn on an engine with the
// cache off, its tokens, logprobs and top-20 logprobs bitwise.
#ifndef DECODED_TESTS_SERVER_PREFIX_CACHE_CHECK_H_
#define DECODED_TESTS_SERVER_PREFIX_CACHE_CHECK_H_

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"

namespace decoded::serving::testing {


class Sink final : public TurnSink {
 public:
  void OnToken(const TokenEvent& e) override {
    absl::MutexLock l(&mu_);
    events_.push_back(e);
  }
  void OnTurnEnd(const TurnEnd& end) override {
    absl::MutexLock l(&mu_);
    end_ = end;
    done_ = true;
  }
  bool Wait() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(300));
  }
  std::vector<TokenEvent> events() const {
    absl::MutexLock l(&mu_);
    return events_;
  }
  TurnEnd end() const {
    absl::MutexLock l(&mu_);
    return end_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<TokenEvent> events_;
  TurnEnd end_;
  bool done_ = false;
};

struct Turn {
  std::vector<TokenEvent> events;
  TurnEnd end;
};

// One greedy turn of `prompt` on a fresh session, closed after.
inline Turn Run(Engine& engine, const std::vector<int32_t>& prompt, int32_t max_new_tokens) {
  TurnRequest t;
  t.kind = TurnRequest::InputKind::kTokens;
  t.tokens = prompt;
  t.sampling.temperature = 0;
  t.sampling.top_logprobs = 20;
  t.stopping.max_new_tokens = max_new_tokens;
  t.stopping.ignore_eos = true;
  Turn out;
  auto id = engine.OpenSession();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return out;
  Sink sink;
  EXPECT_TRUE(engine.SubmitTurn(*id, t, &sink).ok());
  EXPECT_TRUE(sink.Wait());
  absl::Notification released;
  engine.CloseSession(*id, [&released] { released.Notify(); });
  EXPECT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(60)));
  out.events = sink.events();
  out.end = sink.end();
  return out;
}

// Same ids, and bitwise the same logprobs and top alternatives.
inline void ExpectSameLogits(const Turn& got, const Turn& want, const std::string& what) {
  ASSERT_EQ(got.end.reason, FinishReason::kLength) << what << ": " << got.end.error;
  ASSERT_EQ(got.events.size(), want.events.size()) << what;
  for (size_t i = 0; i < got.events.size(); ++i) {
    const TokenEvent& g = got.events[i];
    const TokenEvent& w = want.events[i];
    EXPECT_EQ(g.id, w.id) << what << ", token " << i;
    EXPECT_EQ(std::memcmp(&g.logprob, &w.logprob, sizeof(float)), 0)
        << what << ", token " << i << ": logprob " << g.logprob << " vs " << w.logprob;
    ASSERT_EQ(g.top.size(), w.top.size()) << what << ", token " << i;
    for (size_t k = 0; k < g.top.size(); ++k) {
      EXPECT_EQ(g.top[k].id, w.top[k].id) << what << ", token " << i << ", alternative " << k;
      EXPECT_EQ(std::memcmp(&g.top[k].logprob, &w.top[k].logprob, sizeof(float)), 0)
          << what << ", token " << i << ", alternative " << k;
    }
  }
}

inline std::unique_ptr<Engine> MakeEngine(const std::string& path, bool prefix_cache, int32_t block_tokens,
                                          int32_t context, std::shared_ptr<Backend> backend = nullptr) {
  EngineOptions o;
  o.model_path = path;
  o.backend = std::move(backend);
  o.workers = 1;
  o.threads_per_worker = 2;
  o.max_sessions = 4;
  o.max_batch = 4;
  o.max_step_tokens = 32;
  o.context_length = context;
  o.kv_block_tokens = block_tokens;
  o.kv_budget_bytes = 0;
  o.prefix_cache = prefix_cache;
  o.max_unconsumed_events = 1 << 20;
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

inline std::vector<int32_t> Ids(int n, int32_t seed, int32_t vocab) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(3 + (seed * 37 + i * 11) % (std::min(vocab, 200) - 3));
  return v;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The checks above for the model at `path` with blocks of `bt` tokens and a
// shared prefix of `shared` tokens (not a whole number of blocks).
// `backend`: null for the CPU.
inline void CheckPrefixCache(const std::string& path, int32_t bt, int32_t shared, int32_t context,
                             std::shared_ptr<Backend> backend = nullptr) {
  std::unique_ptr<Engine> on = MakeEngine(path, true, bt, context, backend);
  std::unique_ptr<Engine> off = MakeEngine(path, false, bt, context, backend);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  const int32_t vocab = on->ModelInfo().vocab_size;
  const std::vector<int32_t> system = Ids(shared, 1, vocab);
  const std::vector<int32_t> p1 = Concat(system, Ids(bt + 3, 2, vocab));
  const std::vector<int32_t> p2 = Concat(system, Ids(bt + 5, 3, vocab));
  constexpr int32_t kNew = 6;

  const Turn first = Run(*on, p1, kNew);
  EXPECT_EQ(first.end.usage.cached_tokens, 0);
  ExpectSameLogits(first, Run(*off, p1, kNew), "the first prompt");

  // The shared blocks are cached now (the first session has closed).
  const int32_t hit = shared / bt * bt;
  const Turn second = Run(*on, p2, kNew);
  EXPECT_EQ(second.end.usage.cached_tokens, hit);
  EXPECT_EQ(second.end.usage.prefilled_tokens, static_cast<int32_t>(p2.size()) - hit);
  ExpectSameLogits(second, Run(*off, p2, kNew), "a prompt sharing the first's leading blocks");

  // The whole first prompt again: all its blocks but the one with its last
  // token (and its generated tokens' blocks are cached too, unused here).
  const Turn again = Run(*on, p1, kNew);
  EXPECT_EQ(again.end.usage.cached_tokens, (static_cast<int32_t>(p1.size()) - 1) / bt * bt);
  ExpectSameLogits(again, first, "the first prompt again");

  // Same second block after a different first one: the chain does not match.
  std::vector<int32_t> p3 = p1;
  for (int32_t i = 0; i < bt; ++i) p3[static_cast<size_t>(i)] = (p3[static_cast<size_t>(i)] + 1) % vocab;
  const Turn other = Run(*on, p3, kNew);
  EXPECT_EQ(other.end.usage.cached_tokens, 0);
  ExpectSameLogits(other, Run(*off, p3, kNew), "another first block");

  const EngineStats stats = on->Stats();
  EXPECT_EQ(stats.prefix_cache_hit_tokens, hit + again.end.usage.cached_tokens);
  EXPECT_EQ(stats.prefix_cache_queried_tokens,
            static_cast<int64_t>(p1.size() * 2 + p2.size() + p3.size()));
  EXPECT_GT(stats.kv_blocks_cached, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);  // cached blocks are free blocks
  EXPECT_EQ(off->Stats().prefix_cache_hit_tokens, 0);
  EXPECT_EQ(off->Stats().kv_blocks_cached, 0);
}

}  // namespace decoded::serving::testing

#endif  // DECODED_TESTS_SERVER_PREFIX_CACHE_CHECK_H_
