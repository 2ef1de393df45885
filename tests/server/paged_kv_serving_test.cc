// The serving engine over a deliberately small paged KV pool
// (EngineOptions::kv_block_tokens, kv_budget_bytes), on the Gemma 3 fixture:
//   - Under load (more demand than blocks), every turn either completes with
//     exactly the tokens it gets alone on a roomy pool, or ends
//     RESOURCE_EXHAUSTED; never a crash, never another session's blocks
//     overwritten (which would change a completed turn's tokens); every block
//     is back once the sessions close.
//   - An idle session's blocks are taken back for another's prompt
//     (preemption), and its next turn recomputes its context and continues
//     with the tokens it would have given without the preemption.
//   - A turn whose input needs more blocks than the pool has is refused.
// Runs under ASan+UBSan in CI too.
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"

namespace decoded::serving {
namespace {

constexpr int32_t kContext = 64;
constexpr int32_t kBlock = 4;

class Sink final : public TurnSink {
 public:
  void OnToken(const TokenEvent& e) override {
    absl::MutexLock l(&mu_);
    ids_.push_back(e.id);
  }
  void OnTurnEnd(const TurnEnd& end) override {
    absl::MutexLock l(&mu_);
    end_ = end;
    done_ = true;
  }
  bool Wait() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(120));
  }
  std::vector<int32_t> ids() const {
    absl::MutexLock l(&mu_);
    return ids_;
  }
  TurnEnd end() const {
    absl::MutexLock l(&mu_);
    return end_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int32_t> ids_;
  TurnEnd end_;
  bool done_ = false;
};

TurnRequest Tokens(std::vector<int32_t> ids, int32_t max_new_tokens) {
  TurnRequest t;
  t.kind = TurnRequest::InputKind::kTokens;
  t.tokens = std::move(ids);
  t.sampling.temperature = 0;  // greedy: one right answer per turn
  t.stopping.max_new_tokens = max_new_tokens;
  t.stopping.ignore_eos = true;
  return t;
}

std::vector<int32_t> Prompt(int n, int32_t seed) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(3 + (seed * 37 + i * 11) % 200);
  return v;
}

// An engine whose pool holds `blocks` blocks (0: every session's full context).
std::unique_ptr<Engine> MakeEngine(int32_t blocks, int max_sessions) {
  EngineOptions o;
  o.model_path = testing::TestDataPath("gemma3_tiny_swa.gguf");
  o.workers = 1;
  o.threads_per_worker = 2;
  o.max_sessions = max_sessions;
  o.max_batch = 8;
  o.max_step_tokens = 32;
  o.context_length = kContext;
  o.kv_block_tokens = kBlock;
  o.max_unconsumed_events = 1 << 20;  // no backpressure: the sinks never acknowledge
  o.kv_budget_bytes = 0;
  if (blocks > 0) {
    auto probe = Engine::Create(o);
    EXPECT_TRUE(probe.ok()) << probe.status();
    if (!probe.ok()) return nullptr;
    const int64_t block_bytes = (*probe)->ModelInfo().session_kv_bytes / kContext * kBlock;
    o.kv_budget_bytes = block_bytes * blocks;
  }
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  if (blocks > 0) {
    EXPECT_EQ((*engine)->Stats().kv_blocks_total, blocks);
  }
  return *std::move(engine);
}

// Closes `id` and waits for its release (its KV blocks back in the pool).
void CloseAndWait(Engine& engine, SessionId id) {
  absl::Notification released;
  engine.CloseSession(id, [&released] { released.Notify(); });
  EXPECT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

// One turn alone on a fresh session of `engine`.
std::vector<int32_t> Alone(Engine& engine, const TurnRequest& turn) {
  auto id = engine.OpenSession();
  EXPECT_TRUE(id.ok()) << id.status();
  Sink sink;
  EXPECT_TRUE(engine.SubmitTurn(*id, turn, &sink).ok());
  EXPECT_TRUE(sink.Wait());
  CloseAndWait(engine, *id);
  return sink.ids();
}

TEST(PagedKvServingTest, ASmallPoolUnderLoadCompletesTurnsExactlyOrRefusesThem) {
  constexpr int kSessions = 8;
  // 8 turns of 20 + 30 tokens: 13 blocks each at their end, 104 in all, on
  // a pool of 24.
  std::unique_ptr<Engine> roomy = MakeEngine(0, kSessions);
  std::unique_ptr<Engine> small = MakeEngine(24, kSessions);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  std::vector<TurnRequest> turns;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < kSessions; ++i) {
    turns.push_back(Tokens(Prompt(20, i), 30));
    want.push_back(Alone(*roomy, turns.back()));
    ASSERT_EQ(want.back().size(), 30u);
  }
  std::vector<SessionId> ids;
  std::vector<Sink> sinks(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    auto id = small->OpenSession();
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (int i = 0; i < kSessions; ++i) ASSERT_TRUE(small->SubmitTurn(ids[i], turns[i], &sinks[i]).ok());
  int completed = 0, refused = 0;
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(sinks[i].Wait()) << "turn " << i << " never ended";
    const TurnEnd end = sinks[i].end();
    if (end.reason == FinishReason::kLength) {
      ++completed;
      EXPECT_EQ(sinks[i].ids(), want[i]) << "turn " << i << " completed with other tokens than alone";
    } else {
      ++refused;
      EXPECT_EQ(end.reason, FinishReason::kError) << "turn " << i;
      EXPECT_EQ(end.error.code(), absl::StatusCode::kResourceExhausted) << end.error;
      // What it streamed before the pool ran dry is what it streams alone.
      const std::vector<int32_t> got = sinks[i].ids();
      ASSERT_LE(got.size(), want[i].size());
      EXPECT_EQ(got, std::vector<int32_t>(want[i].begin(), want[i].begin() + static_cast<ptrdiff_t>(got.size())));
    }
    EXPECT_LE(small->Stats().kv_blocks_used, 24);
  }
  RecordProperty("completed", completed);
  RecordProperty("refused", refused);
  EXPECT_GE(completed, 1);
  EXPECT_EQ(small->Stats().kv_exhausted_turns, refused);
  for (SessionId id : ids) CloseAndWait(*small, id);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}

TEST(PagedKvServingTest, AnIdleSessionsBlocksServeAnotherPromptAndItsNextTurnRecomputes) {
  // One session's full context: 16 blocks.
  std::unique_ptr<Engine> roomy = MakeEngine(0, 2);
  std::unique_ptr<Engine> small = MakeEngine(kContext / kBlock, 2);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  const TurnRequest a1 = Tokens(Prompt(30, 1), 10), a2 = Tokens(Prompt(6, 2), 8), b1 = Tokens(Prompt(30, 3), 4);
  // A's two turns without preemption.
  std::vector<int32_t> want_a1, want_a2;
  {
    auto id = roomy->OpenSession();
    ASSERT_TRUE(id.ok());
    Sink s1, s2;
    ASSERT_TRUE(roomy->SubmitTurn(*id, a1, &s1).ok());
    ASSERT_TRUE(s1.Wait());
    ASSERT_TRUE(roomy->SubmitTurn(*id, a2, &s2).ok());
    ASSERT_TRUE(s2.Wait());
    want_a1 = s1.ids();
    want_a2 = s2.ids();
    CloseAndWait(*roomy, *id);
  }
  auto a = small->OpenSession();
  auto b = small->OpenSession();
  ASSERT_TRUE(a.ok() && b.ok());
  Sink sa1, sb1, sa2;
  ASSERT_TRUE(small->SubmitTurn(*a, a1, &sa1).ok());
  ASSERT_TRUE(sa1.Wait());
  EXPECT_EQ(sa1.ids(), want_a1);
  // A holds 10 blocks (its 39 or 40 cached tokens); B's 30 need 8 of the 6 free.
  EXPECT_EQ(small->Stats().kv_blocks_used, 10);
  ASSERT_TRUE(small->SubmitTurn(*b, b1, &sb1).ok());
  ASSERT_TRUE(sb1.Wait());
  EXPECT_EQ(sb1.end().reason, FinishReason::kLength) << sb1.end().error;
  EXPECT_EQ(sb1.ids(), Alone(*roomy, b1));
  EXPECT_EQ(small->Stats().kv_preemptions, 1);
  // A's next turn prefills its whole context again and goes on as it would
  // have.
  ASSERT_TRUE(small->SubmitTurn(*a, a2, &sa2).ok());
  ASSERT_TRUE(sa2.Wait());
  EXPECT_EQ(sa2.end().reason, FinishReason::kLength) << sa2.end().error;
  EXPECT_EQ(sa2.ids(), want_a2);
  EXPECT_EQ(sa2.end().usage.prefilled_tokens, sa1.end().usage.context_tokens + 6);
  CloseAndWait(*small, *a);
  CloseAndWait(*small, *b);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}

TEST(PagedKvServingTest, AnInputLargerThanThePoolIsRefused) {
  std::unique_ptr<Engine> small = MakeEngine(4, 2);  // 16 positions
  ASSERT_NE(small, nullptr);
  auto id = small->OpenSession();
  ASSERT_TRUE(id.ok());
  Sink sink;
  const absl::Status s = small->SubmitTurn(*id, Tokens(Prompt(17, 1), 1), &sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  Sink fits;
  ASSERT_TRUE(small->SubmitTurn(*id, Tokens(Prompt(12, 1), 2), &fits).ok());
  ASSERT_TRUE(fits.Wait());
  EXPECT_EQ(fits.end().reason, FinishReason::kLength) << fits.end().error;
}

}  // namespace
}  // namespace decoded::serving
