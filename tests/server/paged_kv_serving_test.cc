// The serving engine over a deliberately small paged KV pool
// (EngineOptions::kv_block_tokens, kv_budget_bytes), on the Llama fixture
// (one layer group: a block per position range, so the counts below are
// exact) and, for the load test, on the Gemma 3 fixture too (sliding-window
// layers in groups of their own that give blocks back as they go):
//   - Under load (more demand than blocks), every turn either completes with
//     exactly the tokens it gets alone on a roomy pool, or ends
//     RESOURCE_EXHAUSTED; never a crash, never another session's blocks
//     overwritten (which would change a completed turn's tokens); every block
//     is back once the sessions close.
//   - An idle session's blocks are taken back for another's prompt
//     (preemption), and its next turn recomputes its context and continues
//     with the tokens it would have given without the preemption.
//   - A turn whose input needs more blocks than the pool has is refused.
//   - No deadlock where a prompt waits for blocks: a prompt whose blocks are
//     mapped goes on past it, and a queued turn that has not started gives
//     its session's blocks up; while nothing can step the worker sleeps
//     (no busy-wait), and wakes when blocks come back.
//   - After a preemption, penalties and Usage::cached_tokens see the same
//     turn input as without it.
//   - No preemption that cannot make room: blocks an idle session shares
//     with a running one (a cached prefix) do not count as reclaimable.
// Runs under ASan+UBSan in CI too.
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"
#include "tests/common/model_path.h"
#include "tests/common/test_vocabulary.h"

namespace decoded::serving {
namespace {

constexpr int32_t kContext = 64;
constexpr int32_t kBlock = 4;

class Sink final : public TurnSink {
 public:
  void OnToken(const TokenEvent& e) override {
    Engine* ack = nullptr;
    SessionId session = 0;
    {
      absl::MutexLock l(&mu_);
      ids_.push_back(e.id);
      entered_ = true;
      // Holds the worker (which emits) until Unblock: the test arranges the
      // queue meanwhile.
      mu_.Await(absl::Condition(+[](bool* b) { return !*b; }, &block_));
      ack = ack_;
      session = session_;
    }
    if (ack != nullptr) ack->EventsConsumed(session, 1);
  }
  // The next OnToken blocks until Unblock.
  void BlockNextToken() {
    absl::MutexLock l(&mu_);
    block_ = true;
  }
  bool WaitEntered() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&entered_), absl::Seconds(60));
  }
  void Unblock() {
    absl::MutexLock l(&mu_);
    block_ = false;
  }
  // Every later token is acknowledged (Engine::EventsConsumed) as it comes.
  void AckTokens(Engine* engine, SessionId session) {
    absl::MutexLock l(&mu_);
    ack_ = engine;
    session_ = session;
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
  bool entered_ = false;
  bool block_ = false;
  Engine* ack_ = nullptr;
  SessionId session_ = 0;
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
  for (int i = 0; i < n; ++i) v.push_back(3 + (seed * 37 + i * 11) % 90);  // the Llama fixture has 96 ids
  return v;
}

constexpr const char* kLlama = "llama_tiny.gguf";
constexpr const char* kGemma3 = "gemma3_tiny_swa.gguf";

// An engine whose pool holds the bytes of `blocks` position ranges of every
// layer (for the Llama fixture: `blocks` blocks).
std::unique_ptr<Engine> MakeEngine(int32_t blocks, int max_sessions, int32_t max_step_tokens = 32,
                                   int max_unconsumed_events = 1 << 20, const char* fixture = kLlama) {
  EngineOptions o;
  // The Llama fixture in a copy with the test vocabulary, made once.
  static const std::string llama = testing::LoadableFixturePath(kLlama);
  o.model_path = fixture == kLlama ? llama : testing::TestDataPath(fixture);
  o.workers = 1;
  o.threads_per_worker = 2;
  o.max_sessions = max_sessions;
  o.max_batch = 8;
  o.max_step_tokens = max_step_tokens;
  o.context_length = kContext;
  o.kv_block_tokens = kBlock;
  o.max_unconsumed_events = max_unconsumed_events;  // default: no backpressure (sinks do not acknowledge)
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
  if (blocks > 0 && fixture == kLlama) {
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

// The ids of `second`, run after `first` on one fresh session of `engine`.
std::vector<int32_t> SecondTurnAlone(Engine& engine, const TurnRequest& first, const TurnRequest& second) {
  auto id = engine.OpenSession();
  EXPECT_TRUE(id.ok()) << id.status();
  Sink s1, s2;
  EXPECT_TRUE(engine.SubmitTurn(*id, first, &s1).ok());
  EXPECT_TRUE(s1.Wait());
  EXPECT_TRUE(engine.SubmitTurn(*id, second, &s2).ok());
  EXPECT_TRUE(s2.Wait());
  CloseAndWait(engine, *id);
  return s2.ids();
}

class PagedKvLoadTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Fixtures, PagedKvLoadTest, ::testing::Values(kLlama, kGemma3),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == kLlama ? "Llama" : "Gemma3SlidingWindow";
                         });

TEST_P(PagedKvLoadTest, ASmallPoolUnderLoadCompletesTurnsExactlyOrRefusesThem) {
  constexpr int kSessions = 8;
  // 8 turns of 20 + 30 tokens: 13 position ranges each at their end, 104 in
  // all, on a pool of 24 ranges' bytes (Gemma 3: its sliding groups hold
  // only their window's ranges).
  std::unique_ptr<Engine> roomy = MakeEngine(0, kSessions, 32, 1 << 20, GetParam());
  std::unique_ptr<Engine> small = MakeEngine(24, kSessions, 32, 1 << 20, GetParam());
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
    EXPECT_LE(small->Stats().kv_blocks_used, small->Stats().kv_blocks_total);
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
  const TurnRequest a1 = Tokens(Prompt(30, 1), 10), b1 = Tokens(Prompt(30, 3), 4);
  // Penalties count the turn's input and output, not the context before it:
  // recomputed context must not reach them.
  TurnRequest a2 = Tokens(Prompt(6, 2), 8);
  a2.sampling.repetition_penalty = 1.5f;
  a2.sampling.presence_penalty = 1.0f;
  a2.sampling.frequency_penalty = 1.0f;
  // A's two turns without preemption.
  std::vector<int32_t> want_a1, want_a2;
  TurnEnd roomy_a2;
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
    roomy_a2 = s2.end();
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
  // The recomputed tokens are not cached ones: what the roomy pool reused,
  // the small one computed.
  EXPECT_EQ(roomy_a2.usage.cached_tokens - sa2.end().usage.cached_tokens,
            sa2.end().usage.prefilled_tokens - roomy_a2.usage.prefilled_tokens);
  EXPECT_EQ(sa2.end().usage.prompt_tokens, roomy_a2.usage.prompt_tokens);
  CloseAndWait(*small, *a);
  CloseAndWait(*small, *b);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}

// A later turn of a session with sliding-window layers, on a pool idle
// sessions have filled: its prompt must take their blocks back (or wait),
// not fail. (Whether a prompt's blocks are mapped is a question of position
// ranges; the blocks a context holds are summed over its layer groups, so
// comparing the two took a Gemma 3 session with some context for mapped,
// skipped the reclaim and ended its turn RESOURCE_EXHAUSTED.)
TEST(PagedKvServingTest, ALaterTurnOfASlidingWindowModelReclaimsIdleSessionsBlocks) {
  std::unique_ptr<Engine> roomy = MakeEngine(0, 8, 32, 1 << 20, kGemma3);
  std::unique_ptr<Engine> small = MakeEngine(16, 8, 32, 1 << 20, kGemma3);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  const TurnRequest a1 = Tokens(Prompt(40, 1), 1), a2 = Tokens(Prompt(12, 2), 4);
  const std::vector<int32_t> want_a2 = SecondTurnAlone(*roomy, a1, a2);
  auto a = small->OpenSession();
  ASSERT_TRUE(a.ok());
  Sink sa1, sa2;
  ASSERT_TRUE(small->SubmitTurn(*a, a1, &sa1).ok());
  ASSERT_TRUE(sa1.Wait());
  // Idle sessions take the pool until fewer blocks are free than A's next
  // prompt needs.
  std::vector<SessionId> idle;
  for (int i = 0; i < 6; ++i) {
    const serving::EngineStats st = small->Stats();
    if (st.kv_blocks_total - st.kv_blocks_used < 3) break;
    auto id = small->OpenSession();
    ASSERT_TRUE(id.ok());
    const int32_t n = static_cast<int32_t>(std::min<int64_t>(30, (st.kv_blocks_total - st.kv_blocks_used) / 3 * kBlock));
    Sink s;
    ASSERT_TRUE(small->SubmitTurn(*id, Tokens(Prompt(std::max(1, n - 1), 10 + i), 1), &s).ok());
    ASSERT_TRUE(s.Wait());
    ASSERT_EQ(s.end().reason, FinishReason::kLength) << s.end().error;
    idle.push_back(*id);
  }
  const serving::EngineStats full = small->Stats();
  ASSERT_LT(full.kv_blocks_total - full.kv_blocks_used, 3) << full.kv_blocks_used << " of " << full.kv_blocks_total;
  ASSERT_TRUE(small->SubmitTurn(*a, a2, &sa2).ok());
  ASSERT_TRUE(sa2.Wait());
  EXPECT_EQ(sa2.end().reason, FinishReason::kLength) << sa2.end().error;
  EXPECT_EQ(sa2.ids(), want_a2);
  EXPECT_GE(small->Stats().kv_preemptions, 1);
  CloseAndWait(*small, *a);
  for (SessionId id : idle) CloseAndWait(*small, id);
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

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

TEST(PagedKvServingTest, APromptWaitingForBlocksLetsAMappedPromptFinish) {
  // Pool of 16 blocks, steps of 10 tokens. W (4 + 2 tokens) holds the worker
  // in its first token's event while X (48 tokens, 12 blocks) and then Y
  // (24 tokens, 6 blocks) queue. X maps its 12 blocks at its first span; Y
  // then waits in front of X, and the 2 free blocks plus W's 2 cannot make
  // room: X must go on past Y (not wait behind it: that never ends), and Y
  // runs once X's turn is over.
  std::unique_ptr<Engine> roomy = MakeEngine(0, 3, 10);
  std::unique_ptr<Engine> small = MakeEngine(kContext / kBlock, 3, 10);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  const TurnRequest w1 = Tokens(Prompt(4, 7), 2), x1 = Tokens(Prompt(48, 8), 4), y1 = Tokens(Prompt(24, 9), 4);
  auto w = small->OpenSession(), x = small->OpenSession(), y = small->OpenSession();
  ASSERT_TRUE(w.ok() && x.ok() && y.ok());
  Sink sw, sx, sy;
  sw.BlockNextToken();
  ASSERT_TRUE(small->SubmitTurn(*w, w1, &sw).ok());
  ASSERT_TRUE(sw.WaitEntered());
  ASSERT_TRUE(small->SubmitTurn(*x, x1, &sx).ok());
  ASSERT_TRUE(small->SubmitTurn(*y, y1, &sy).ok());
  sw.Unblock();
  for (Sink* sink : {&sw, &sx, &sy}) ASSERT_TRUE(sink->Wait()) << "a turn never ended";
  EXPECT_EQ(sx.end().reason, FinishReason::kLength) << sx.end().error;
  EXPECT_EQ(sy.end().reason, FinishReason::kLength) << sy.end().error;
  EXPECT_EQ(sw.ids(), Alone(*roomy, w1));
  EXPECT_EQ(sx.ids(), Alone(*roomy, x1));
  EXPECT_EQ(sy.ids(), Alone(*roomy, y1));
  for (SessionId id : {*w, *x, *y}) CloseAndWait(*small, id);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}

TEST(PagedKvServingTest, AQueuedTurnThatHasNotStartedGivesItsBlocksToAPromptAheadOfIt) {
  // Pool of 16 blocks. U's first turn leaves 24 tokens cached (6 blocks).
  // X (4 + 2 tokens) holds the worker in its first token's event while P
  // (44 tokens, 11 blocks) and then U's second turn queue: P is ahead, and
  // only U's blocks make room for it (8 free, 2 of X's). U's turn, waiting
  // behind P, must give them up (or neither ever runs) and recompute its
  // context once P is done, with the tokens it gives without preemption.
  std::unique_ptr<Engine> roomy = MakeEngine(0, 3);
  std::unique_ptr<Engine> small = MakeEngine(kContext / kBlock, 3);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  const TurnRequest u1 = Tokens(Prompt(20, 11), 4), u2 = Tokens(Prompt(4, 12), 4);
  const TurnRequest x1 = Tokens(Prompt(4, 13), 2), p1 = Tokens(Prompt(44, 14), 4);
  const std::vector<int32_t> want_u2 = SecondTurnAlone(*roomy, u1, u2);
  auto u = small->OpenSession(), x = small->OpenSession(), p = small->OpenSession();
  ASSERT_TRUE(u.ok() && x.ok() && p.ok());
  Sink su1, su2, sx, sp;
  ASSERT_TRUE(small->SubmitTurn(*u, u1, &su1).ok());
  ASSERT_TRUE(su1.Wait());
  EXPECT_EQ(small->Stats().kv_blocks_used, 6);
  sx.BlockNextToken();
  ASSERT_TRUE(small->SubmitTurn(*x, x1, &sx).ok());
  ASSERT_TRUE(sx.WaitEntered());
  ASSERT_TRUE(small->SubmitTurn(*p, p1, &sp).ok());
  ASSERT_TRUE(small->SubmitTurn(*u, u2, &su2).ok());
  EXPECT_EQ(small->Stats().turns_waiting, 2);
  sx.Unblock();
  for (Sink* sink : {&sx, &sp, &su2}) ASSERT_TRUE(sink->Wait()) << "a turn never ended";
  EXPECT_EQ(sp.end().reason, FinishReason::kLength) << sp.end().error;
  EXPECT_EQ(su2.end().reason, FinishReason::kLength) << su2.end().error;
  EXPECT_EQ(sp.ids(), Alone(*roomy, p1));
  EXPECT_EQ(su2.ids(), want_u2);
  EXPECT_EQ(sx.ids(), Alone(*roomy, x1));
  EXPECT_GE(small->Stats().kv_preemptions, 1);
  for (SessionId id : {*u, *x, *p}) CloseAndWait(*small, id);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}

TEST(PagedKvServingTest, APromptWaitingForBlocksDoesNotSpinTheWorker) {
  // One event of credit per session. X (40 tokens, 10 blocks) streams its
  // first token and waits for its client, holding its blocks; Y (28 tokens,
  // 7 blocks) cannot get 7 of the 6 free ones and nothing can be taken
  // back, so no session can step. The worker must sleep, not poll, and Y
  // must run once X's client reads on and X's turn ends.
  std::unique_ptr<Engine> roomy = MakeEngine(0, 2);
  std::unique_ptr<Engine> small = MakeEngine(kContext / kBlock, 2, 32, 1);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  const TurnRequest x1 = Tokens(Prompt(40, 21), 8), y1 = Tokens(Prompt(28, 22), 4);
  auto x = small->OpenSession(), y = small->OpenSession();
  ASSERT_TRUE(x.ok() && y.ok());
  Sink sx, sy;
  sy.AckTokens(small.get(), *y);
  ASSERT_TRUE(small->SubmitTurn(*x, x1, &sx).ok());
  ASSERT_TRUE(sx.WaitEntered());
  ASSERT_TRUE(small->SubmitTurn(*y, y1, &sy).ok());
  absl::SleepFor(absl::Milliseconds(200));  // Y's pick found nothing to step
  EXPECT_EQ(small->Stats().turns_waiting, 1);
  const double cpu = ProcessCpuSeconds();
  absl::SleepFor(absl::Seconds(1));
  const double spent = ProcessCpuSeconds() - cpu;
  EXPECT_LT(spent, 0.2) << "the process used " << spent << " s of CPU in 1 s while no session could step";
  EXPECT_EQ(small->Stats().turns_waiting, 1);
  sx.AckTokens(small.get(), *x);
  small->EventsConsumed(*x, 1);
  ASSERT_TRUE(sx.Wait());
  ASSERT_TRUE(sy.Wait());
  EXPECT_EQ(sx.end().reason, FinishReason::kLength) << sx.end().error;
  EXPECT_EQ(sy.end().reason, FinishReason::kLength) << sy.end().error;
  EXPECT_EQ(sx.ids(), Alone(*roomy, x1));
  EXPECT_EQ(sy.ids(), Alone(*roomy, y1));
  for (SessionId id : {*x, *y}) CloseAndWait(*small, id);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}


TEST(PagedKvServingTest, BlocksSharedWithARunningTurnAreNotTakenBackForNothing) {
  // One event of credit per session. A (30 tokens, 2 generated) ends idle
  // holding 8 blocks, 7 of them registered. B's prompt starts with A's 30
  // tokens: it maps those 7 blocks, computes 1 more, streams its first token
  // and waits for its client. 16 - 9 = 7 blocks are free; C's 36 tokens
  // need 9. Taking A's blocks back would free only its last one (B reads the
  // other 7): A must not be preempted, and C waits for B instead.
  std::unique_ptr<Engine> roomy = MakeEngine(0, 3);
  std::unique_ptr<Engine> small = MakeEngine(kContext / kBlock, 3, 32, 1);
  ASSERT_NE(roomy, nullptr);
  ASSERT_NE(small, nullptr);
  const std::vector<int32_t> shared = Prompt(30, 41);
  std::vector<int32_t> b_prompt = shared;
  b_prompt.push_back(7);
  b_prompt.push_back(9);
  const TurnRequest a1 = Tokens(shared, 2), b1 = Tokens(b_prompt, 6), c1 = Tokens(Prompt(36, 42), 4);
  auto a = small->OpenSession(), b = small->OpenSession(), c = small->OpenSession();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  Sink sa, sb, sc;
  sa.AckTokens(small.get(), *a);
  sc.AckTokens(small.get(), *c);
  ASSERT_TRUE(small->SubmitTurn(*a, a1, &sa).ok());
  ASSERT_TRUE(sa.Wait());
  ASSERT_EQ(small->Stats().kv_blocks_used, 8);
  ASSERT_TRUE(small->SubmitTurn(*b, b1, &sb).ok());
  ASSERT_TRUE(sb.WaitEntered());
  ASSERT_EQ(small->Stats().kv_blocks_used, 9) << "B maps A's cached blocks";
  ASSERT_TRUE(small->SubmitTurn(*c, c1, &sc).ok());
  absl::SleepFor(absl::Milliseconds(300));  // C's pick found no room
  EXPECT_EQ(small->Stats().turns_waiting, 1);
  EXPECT_EQ(small->Stats().kv_preemptions, 0) << "A's blocks were taken back though B reads most of them";
  // B's client reads on: B's turn ends, and C gets its blocks (from A and
  // B, idle now, whose shared blocks are then reclaimable).
  sb.AckTokens(small.get(), *b);
  small->EventsConsumed(*b, 1);
  ASSERT_TRUE(sb.Wait());
  ASSERT_TRUE(sc.Wait());
  EXPECT_EQ(sb.end().reason, FinishReason::kLength) << sb.end().error;
  EXPECT_EQ(sc.end().reason, FinishReason::kLength) << sc.end().error;
  EXPECT_EQ(sb.ids(), Alone(*roomy, b1));
  EXPECT_EQ(sc.ids(), Alone(*roomy, c1));
  for (SessionId id : {*a, *b, *c}) CloseAndWait(*small, id);
  EXPECT_EQ(small->Stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace decoded::serving
