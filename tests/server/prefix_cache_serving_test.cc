// Prefix caching across sessions (EngineOptions::prefix_cache) on every
// family fixture and the three real models:
//   - A session whose prompt starts with blocks another session computed maps
//     them instead of prefilling them: Usage::cached_tokens counts them,
//     prefilled_tokens does not, and the decoded_prefix_cache_* counters
//     follow.
//   - Exactness: its tokens and every token's logprob and top-20 logprobs
//     (log-softmax of the logits rows) are byte-identical to the same turn
//     on an engine with the cache off. "The same" is exact here because on
//     the CPU a row's arithmetic depends only on its own token and its key
//     range, never on how the prompt was cut into spans
//     (BatchDecoder::Step): the donor's KV bytes for a block are the bytes
//     this session would compute. (A backend where a span's results depend
//     on its size, Backend::prefill_depends_on_chunk_rows, gives the logits
//     of the donor's chunking for the shared part instead.)
//   - The key chains the blocks: a prompt whose first block differs gets no
//     hit though its later blocks match cached ones (each key covers every
//     token before it; the lookup stops at the first miss).
//   - Shown to fail: keys and lookups that ignore the block's tokens map
//     other tokens' KV, and the logprobs differ (hundreds of mismatches).
//   - The whole prompt cached: the last token is still computed (its logits
//     are the turn's first), so at most floor((n - 1) / block) blocks hit.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"
#include "tests/common/family_fixtures.h"
#include "tests/common/model_path.h"
#include "tests/common/test_vocabulary.h"

namespace decoded::serving {
namespace {

constexpr int32_t kBlock = 4;

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
Turn Run(Engine& engine, const std::vector<int32_t>& prompt, int32_t max_new_tokens) {
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
void ExpectSameLogits(const Turn& got, const Turn& want, const std::string& what) {
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

std::unique_ptr<Engine> MakeEngine(const std::string& path, bool prefix_cache, int32_t block_tokens,
                                   int32_t context) {
  EngineOptions o;
  o.model_path = path;
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

std::vector<int32_t> Ids(int n, int32_t seed, int32_t vocab) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(3 + (seed * 37 + i * 11) % (std::min(vocab, 200) - 3));
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The checks above for the model at `path` with blocks of `bt` tokens and a
// shared prefix of `shared` tokens (not a whole number of blocks).
void CheckPrefixCache(const std::string& path, int32_t bt, int32_t shared, int32_t context) {
  std::unique_ptr<Engine> on = MakeEngine(path, true, bt, context);
  std::unique_ptr<Engine> off = MakeEngine(path, false, bt, context);
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

class PrefixCacheFixtureTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheFixtureTest, CachedBlocksGiveTheSameLogitsAsComputingThem) {
  const std::string path = testing::LoadableFixturePath(GetParam());
  ASSERT_FALSE(path.empty());
  CheckPrefixCache(path, kBlock, 18, 64);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheFixtureTest, ::testing::ValuesIn(testing::kFamilyFixtures),
                         testing::FixtureTestName);

// The serving default of 16-token blocks; a 40-token shared prefix.
TEST(PrefixCacheRealModelTest, Gemma3) {
  DECODED_REQUIRE_REAL_MODEL();
  CheckPrefixCache(testing::RealModelPath(), 16, 40, 256);
}

TEST(PrefixCacheRealModelTest, SmolLM2) {
  const testing::NamedModel m = testing::NamedModelPath("DECODED_SMOLLM2_PATH", "smollm2-135m-instruct-q4_1.gguf");
  DECODED_REQUIRE_NAMED_MODEL(m);
  CheckPrefixCache(m.path, 16, 40, 256);
}

TEST(PrefixCacheRealModelTest, Qwen2) {
  const testing::NamedModel m = testing::NamedModelPath("DECODED_QWEN2_PATH", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  DECODED_REQUIRE_NAMED_MODEL(m);
  CheckPrefixCache(m.path, 16, 40, 256);
}

}  // namespace
}  // namespace decoded::serving
