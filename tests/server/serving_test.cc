// Scheduler semantics with a scripted fake model: fairness, one step at a time
// per session, cancellation before a step, closing, admission, validation and
// the stop rules. The fake's logits make the greedy continuation of token t
// be (t + 1) % kVocab, so expected tokens follow from arithmetic, not from
// running the scheduler.
#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/serving/scheduler.h"
#include "gtest/gtest.h"

namespace decoded::serving {
namespace {

constexpr int32_t kVocab = 32;
constexpr int32_t kEog = 31;       // the fake's end-of-generation id
constexpr float kHot = 5.0f;       // logit of the successor token; all others 0

class FakeExecutor final : public Executor {
 public:
  std::string_view backend_name() const override { return "fake"; }
  int threads() const override { return 1; }
};

// Shared observation and control of all fake contexts.
struct FakeWorld {
  absl::Mutex mu;
  bool paused ABSL_GUARDED_BY(mu) = false;
  int steps_started ABSL_GUARDED_BY(mu) = 0;
  std::vector<int> step_order ABSL_GUARDED_BY(mu);  // context tag per step
  std::vector<size_t> prefill_sizes ABSL_GUARDED_BY(mu);  // tokens per Prefill call
  std::atomic<int> overlaps{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> next_tag{0};
  absl::Duration step_sleep = absl::ZeroDuration();

  void Pause() {
    absl::MutexLock l(&mu);
    paused = true;
  }
  void Resume() {
    absl::MutexLock l(&mu);
    paused = false;
  }
  void WaitStepsStarted(int n) {
    std::pair<FakeWorld*, int> arg(this, n);
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(
        +[](std::pair<FakeWorld*, int>* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return a->first->steps_started >= a->second;
        },
        &arg));
  }
  std::vector<int> Order() {
    absl::MutexLock l(&mu);
    return step_order;
  }
};

class FakeContext final : public DecodeContext {
 public:
  FakeContext(FakeWorld* world, int32_t capacity) : world_(world), capacity_(capacity), tag_(world->next_tag++) {}
  ~FakeContext() override { world_->destroyed++; }

  int tag() const { return tag_; }
  const std::vector<int32_t>& history() const { return history_; }

  int32_t cached_len() const override { return static_cast<int32_t>(history_.size()); }
  int32_t capacity() const override { return capacity_; }

  absl::StatusOr<absl::Span<const float>> Prefill(absl::Span<const int32_t> tokens, bool all_logits,
                                                  Executor&) override {
    if (tokens.empty() || tokens.size() > static_cast<size_t>(kMaxPrefillChunk)) {
      return absl::InvalidArgumentError("bad chunk");
    }
    if (cached_len() + static_cast<int32_t>(tokens.size()) > capacity_) return absl::ResourceExhaustedError("full");
    Enter();
    {
      absl::MutexLock l(&world_->mu);
      world_->prefill_sizes.push_back(tokens.size());
    }
    logits_.clear();
    for (size_t i = 0; i < tokens.size(); ++i) {
      history_.push_back(tokens[i]);
      if (all_logits || i + 1 == tokens.size()) AppendRow(tokens[i]);
    }
    Leave();
    return absl::Span<const float>(logits_);
  }

  absl::StatusOr<absl::Span<const float>> Decode(int32_t token, Executor&) override {
    if (cached_len() + 1 > capacity_) return absl::ResourceExhaustedError("full");
    Enter();
    logits_.clear();
    history_.push_back(token);
    AppendRow(token);
    Leave();
    return absl::Span<const float>(logits_);
  }

  int64_t kv_bytes() const override { return int64_t{capacity_} * 16; }  // any positive size
  int64_t bound_nodes() const override { return 0; }

 private:
  void Enter() {
    if (in_step_.exchange(true)) world_->overlaps++;
    absl::MutexLock l(&world_->mu);
    world_->steps_started++;
    world_->step_order.push_back(tag_);
    world_->mu.Await(absl::Condition(
        +[](FakeWorld* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !w->paused; }, world_));
  }
  void Leave() {
    if (world_->step_sleep > absl::ZeroDuration()) absl::SleepFor(world_->step_sleep);
    in_step_ = false;
  }
  void AppendRow(int32_t token) {
    const size_t base = logits_.size();
    logits_.resize(base + kVocab, 0.0f);
    logits_[base + (token + 1) % kVocab] = kHot;
  }

  FakeWorld* world_;
  int32_t capacity_;
  int tag_;
  std::vector<int32_t> history_;
  std::vector<float> logits_;
  std::atomic<bool> in_step_{false};
};

class LetterText final : public TextDecoder {
 public:
  std::string Push(int32_t id) override { return std::string(1, static_cast<char>('a' + id % 26)); }
  std::string Flush() override { return ""; }
};

class FakeModel final : public ServingModel {
 public:
  explicit FakeModel(FakeWorld* world) : world_(world) {}
  int32_t vocab_size() const override { return kVocab; }
  bool IsEndOfGeneration(int32_t id) const override { return id == kEog; }
  std::unique_ptr<TextDecoder> NewTextDecoder() const override { return std::make_unique<LetterText>(); }
  absl::StatusOr<std::unique_ptr<DecodeContext>> NewContext(int32_t max_seq_len) const override {
    auto ctx = std::make_unique<FakeContext>(world_, max_seq_len);
    absl::MutexLock l(&mu_);
    contexts_.push_back(ctx.get());
    return std::unique_ptr<DecodeContext>(std::move(ctx));
  }
  // The n-th context created (tags count from 0).
  FakeContext* context(int n) const {
    absl::MutexLock l(&mu_);
    return contexts_[n];
  }

 private:
  FakeWorld* world_;
  mutable absl::Mutex mu_;
  mutable std::vector<FakeContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

// Collects one session's events; thread-safe.
class RecordingSink : public TurnSink {
 public:
  void OnToken(const TokenEvent& event) override {
    absl::MutexLock l(&mu_);
    EXPECT_FALSE(ended_) << "token after the turn's end";
    tokens_.push_back(event);
  }
  void OnTurnEnd(const TurnEnd& end) override {
    {
      absl::MutexLock l(&mu_);
      EXPECT_FALSE(ended_) << "two ends for one turn";
      ended_ = true;
      end_ = end;
    }
    done_.Notify();
  }
  bool WaitEnd(absl::Duration timeout = absl::Seconds(10)) { return done_.WaitForNotificationWithTimeout(timeout); }
  TurnEnd end() {
    absl::MutexLock l(&mu_);
    return end_;
  }
  std::vector<int32_t> ids() {
    absl::MutexLock l(&mu_);
    std::vector<int32_t> ids;
    for (const TokenEvent& t : tokens_) ids.push_back(t.id);
    return ids;
  }
  std::string text() {
    absl::MutexLock l(&mu_);
    std::string s;
    for (const TokenEvent& t : tokens_) s += t.text;
    return s;
  }
  int calls() {
    absl::MutexLock l(&mu_);
    return static_cast<int>(tokens_.size()) + (ended_ ? 1 : 0);
  }

 private:
  absl::Mutex mu_;
  std::vector<TokenEvent> tokens_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  TurnEnd end_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
};

PreparedTurn Turn(std::vector<int32_t> prompt, int max_new_tokens) {
  PreparedTurn t;
  t.prompt = std::move(prompt);
  t.stopping.max_new_tokens = max_new_tokens;
  return t;
}

class SchedulerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Scheduler> MakeScheduler(int workers, int max_sessions = 8, int max_queued = 8,
                                           int32_t context_length = 64) {
    SchedulerOptions o;
    o.workers = workers;
    o.max_sessions = max_sessions;
    o.max_queued = max_queued;
    o.context_length = context_length;
    o.make_executor = [] { return std::make_unique<FakeExecutor>(); };
    return std::make_unique<Scheduler>(&model_, o);
  }

  FakeWorld world_;
  FakeModel model_{&world_};
};

TEST_F(SchedulerTest, SessionsAreSteppedRoundRobin) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open(), b = *sched->Open(), c = *sched->Open();
  RecordingSink sa, sb, sc;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 3), &sa).ok());
  world_.WaitStepsStarted(1);  // the worker holds a; b and c queue behind it
  ASSERT_TRUE(sched->Submit(b, Turn({0}, 3), &sb).ok());
  ASSERT_TRUE(sched->Submit(c, Turn({0}, 3), &sc).ok());
  world_.Resume();
  ASSERT_TRUE(sa.WaitEnd() && sb.WaitEnd() && sc.WaitEnd());
  // 3 tokens = one prefill step (samples the first) + two decode steps each.
  EXPECT_EQ(world_.Order(), (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(sa.ids(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(sa.end().reason, FinishReason::kLength);
}

TEST_F(SchedulerTest, StepsOfOneSessionNeverOverlapAcrossWorkers) {
  world_.step_sleep = absl::Milliseconds(1);
  auto sched = MakeScheduler(3);
  std::vector<RecordingSink> sinks(4);
  std::vector<SessionId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(*sched->Open());
    ASSERT_TRUE(sched->Submit(ids[i], Turn({static_cast<int32_t>(i)}, 20), &sinks[i]).ok());
  }
  for (auto& s : sinks) ASSERT_TRUE(s.WaitEnd());
  EXPECT_EQ(world_.overlaps.load(), 0);
  // Sessions stay independent: each follows its own successor chain.
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> expected;
    for (int k = 1; k <= 20; ++k) expected.push_back(i + k);
    EXPECT_EQ(sinks[i].ids(), expected) << "session " << i;
  }
}

TEST_F(SchedulerTest, CancelledQueuedTurnEndsWithoutAStep) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open(), b = *sched->Open();
  RecordingSink sa, sb;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 2), &sa).ok());
  world_.WaitStepsStarted(1);
  ASSERT_TRUE(sched->Submit(b, Turn({5}, 2), &sb).ok());
  ASSERT_TRUE(sched->Cancel(b).ok());
  world_.Resume();
  ASSERT_TRUE(sb.WaitEnd());
  EXPECT_EQ(sb.end().reason, FinishReason::kCancelled);
  EXPECT_EQ(sb.end().usage.generated_tokens, 0);
  EXPECT_TRUE(model_.context(1)->history().empty());
  ASSERT_TRUE(sa.WaitEnd());
  for (int tag : world_.Order()) EXPECT_EQ(tag, 0);
}

// Cancels from inside the sink, i.e. right after the first token is emitted.
class CancelOnFirstToken : public RecordingSink {
 public:
  CancelOnFirstToken(Scheduler* s, SessionId id) : sched_(s), id_(id) {}
  void OnToken(const TokenEvent& e) override {
    RecordingSink::OnToken(e);
    EXPECT_TRUE(sched_->Cancel(id_).ok());
  }

 private:
  Scheduler* sched_;
  SessionId id_;
};

TEST_F(SchedulerTest, CancelMidTurnKeepsTheSessionUsable) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  CancelOnFirstToken first(sched.get(), a);
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 10), &first).ok());
  ASSERT_TRUE(first.WaitEnd());
  EXPECT_EQ(first.end().reason, FinishReason::kCancelled);
  EXPECT_EQ(first.ids(), (std::vector<int32_t>{1}));

  RecordingSink second;
  ASSERT_TRUE(sched->Submit(a, Turn({7}, 2), &second).ok());
  ASSERT_TRUE(second.WaitEnd());
  EXPECT_EQ(second.end().reason, FinishReason::kLength);
  EXPECT_EQ(second.ids(), (std::vector<int32_t>{8, 9}));
  // The token sampled before the cancel is carried into the next turn.
  EXPECT_EQ(second.end().usage.cached_tokens, 1);
  EXPECT_EQ(second.end().usage.prompt_tokens, 2);
  EXPECT_EQ(model_.context(0)->history(), (std::vector<int32_t>{0, 1, 7, 8}));
}

TEST_F(SchedulerTest, CloseDropsAQueuedTurnAndItsContext) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open(), b = *sched->Open();
  RecordingSink sa, sb;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 2), &sa).ok());
  world_.WaitStepsStarted(1);
  ASSERT_TRUE(sched->Submit(b, Turn({5}, 2), &sb).ok());
  sched->Close(b);  // b is only queued: returns at once
  EXPECT_EQ(world_.destroyed.load(), 1);
  EXPECT_EQ(sched->Stats().sessions_active, 1);
  world_.Resume();
  ASSERT_TRUE(sa.WaitEnd());
  EXPECT_EQ(sb.calls(), 0);
  for (int tag : world_.Order()) EXPECT_EQ(tag, 0);
}

TEST_F(SchedulerTest, CloseWaitsForTheRunningStepThenDropsTheContext) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  RecordingSink sa;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 50), &sa).ok());
  world_.WaitStepsStarted(1);
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    sched->Close(a);
    closed = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(closed.load()) << "Close returned while a step was running";
  EXPECT_EQ(world_.destroyed.load(), 0);
  world_.Resume();
  closer.join();
  EXPECT_EQ(world_.destroyed.load(), 1);
  const int calls = sa.calls();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(sa.calls(), calls) << "sink called after Close returned";
  EXPECT_LE(calls, 1);  // at most the token of the step that was running
  EXPECT_EQ(sched->Stats().sessions_active, 0);
}

// The age of a running step is what health watches for a wedged worker loop.
TEST_F(SchedulerTest, StatsReportTheAgeOfTheRunningStep) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  RecordingSink sa;
  EXPECT_EQ(sched->Stats().longest_running_step_seconds, 0);
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 5), &sa).ok());
  world_.WaitStepsStarted(1);
  absl::SleepFor(absl::Milliseconds(120));
  EXPECT_GE(sched->Stats().longest_running_step_seconds, 0.1);
  world_.Resume();
  ASSERT_TRUE(sa.WaitEnd());
  sched->Close(a);
  EXPECT_EQ(sched->Stats().longest_running_step_seconds, 0);
}

// A long prompt is prefilled in small chunks while another session waits, and
// in full chunks when it runs alone.
TEST_F(SchedulerTest, PrefillChunksShrinkWhileOthersWait) {
  auto sched = MakeScheduler(1, 8, 8, 1024);
  SessionId a = *sched->Open();
  SessionId b = *sched->Open();
  RecordingSink sa, sb;
  std::vector<int32_t> long_prompt(300, 1);
  // b first: whenever a is picked, b is queued behind it (b's steps are
  // held by the pause until a has been submitted).
  world_.Pause();
  ASSERT_TRUE(sched->Submit(b, Turn({1}, 40), &sb).ok());
  ASSERT_TRUE(sched->Submit(a, Turn(long_prompt, 1), &sa).ok());
  world_.Resume();
  ASSERT_TRUE(sa.WaitEnd());
  ASSERT_TRUE(sb.WaitEnd());
  std::vector<size_t> sizes;
  {
    absl::MutexLock l(&world_.mu);
    sizes = world_.prefill_sizes;
  }
  // b prefills one token; a's 300 come in chunks of kSharedPrefillChunk while
  // b is decoding, so a needs at least 300 / 32 calls.
  size_t a_calls = 0;
  for (size_t n : sizes) {
    if (n > 1) {
      ++a_calls;
      EXPECT_LE(n, static_cast<size_t>(kSharedPrefillChunk));
    }
  }
  EXPECT_GE(a_calls, 300 / kSharedPrefillChunk);
  {
    absl::MutexLock l(&world_.mu);
    world_.prefill_sizes.clear();
  }
  RecordingSink alone;
  ASSERT_TRUE(sched->Submit(a, Turn(long_prompt, 1), &alone).ok());
  ASSERT_TRUE(alone.WaitEnd());
  absl::MutexLock l(&world_.mu);
  EXPECT_EQ(world_.prefill_sizes.front(), static_cast<size_t>(kMaxPrefillChunk));
}

// Sessions reserve KV at open; the budget caps how many fit.
TEST_F(SchedulerTest, KvBudgetLimitsOpenSessions) {
  SchedulerOptions o;
  o.workers = 1;
  o.max_sessions = 8;
  o.context_length = 64;
  o.make_executor = [] { return std::make_unique<FakeExecutor>(); };
  o.kv_budget_bytes = 2 * 64 * 16;  // two FakeContexts of capacity 64
  Scheduler sched(&model_, o);
  auto a = sched.Open();
  auto b = sched.Open();
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = sched.Open();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  sched.Close(*a);
  EXPECT_TRUE(sched.Open().ok());
}

TEST_F(SchedulerTest, SessionAndQueueLimitsAreEnforced) {
  auto sched = MakeScheduler(1, /*max_sessions=*/3, /*max_queued=*/1);
  SessionId a = *sched->Open(), b = *sched->Open(), c = *sched->Open();
  EXPECT_EQ(sched->Open().status().code(), absl::StatusCode::kResourceExhausted);
  RecordingSink sa, sb, sc;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 2), &sa).ok());
  world_.WaitStepsStarted(1);  // a has started: it no longer counts as queued
  ASSERT_TRUE(sched->Submit(b, Turn({0}, 2), &sb).ok());
  EXPECT_EQ(sched->Submit(c, Turn({0}, 2), &sc).code(), absl::StatusCode::kResourceExhausted);
  world_.Resume();
  ASSERT_TRUE(sa.WaitEnd() && sb.WaitEnd());
  sched->Close(c);
  EXPECT_TRUE(sched->Open().ok());
}

TEST_F(SchedulerTest, BadTurnsAreRefusedWithTheirCodes) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/8);
  SessionId a = *sched->Open();
  RecordingSink sink;
  EXPECT_EQ(sched->Submit(a, Turn({}, 2), &sink).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->Submit(a, Turn({kVocab}, 2), &sink).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->Submit(a, Turn({-1}, 2), &sink).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->Submit(a, Turn(std::vector<int32_t>(9, 1), 2), &sink).code(),
            absl::StatusCode::kInvalidArgument);
  PreparedTurn hot = Turn({0}, 2);
  hot.sampling.temperature = -1;
  EXPECT_EQ(sched->Submit(a, hot, &sink).code(), absl::StatusCode::kInvalidArgument);
  PreparedTurn stop_oov = Turn({0}, 2);
  stop_oov.stopping.stop_token_ids = {kVocab + 3};
  EXPECT_EQ(sched->Submit(a, stop_oov, &sink).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched->Submit(a + 100, Turn({0}, 2), &sink).code(), absl::StatusCode::kNotFound);
  PreparedTurn empty_stop = Turn({0}, 2);
  empty_stop.stopping.stop_sequences = {"ok", ""};
  EXPECT_EQ(sched->Submit(a, empty_stop, &sink).code(), absl::StatusCode::kInvalidArgument);

  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 2), &sink).ok());
  RecordingSink other;
  EXPECT_EQ(sched->Submit(a, Turn({0}, 2), &other).code(), absl::StatusCode::kFailedPrecondition);
  world_.Resume();
  ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(other.calls(), 0);
}

TEST_F(SchedulerTest, EndOfGenerationAndStopTokensEndTheTurn) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  RecordingSink eog;
  ASSERT_TRUE(sched->Submit(a, Turn({28}, 10), &eog).ok());  // 29, 30, 31 = EOG
  ASSERT_TRUE(eog.WaitEnd());
  EXPECT_EQ(eog.end().reason, FinishReason::kStopToken);
  EXPECT_EQ(eog.ids(), (std::vector<int32_t>{29, 30, 31}));
  EXPECT_EQ(eog.text(), "de");  // 29 % 26 = 3 -> 'd', 30 -> 'e'; the stop token's text is not output

  SessionId b = *sched->Open();
  PreparedTurn ignore = Turn({28}, 5);
  ignore.stopping.ignore_eos = true;
  RecordingSink ign;
  ASSERT_TRUE(sched->Submit(b, ignore, &ign).ok());
  ASSERT_TRUE(ign.WaitEnd());
  EXPECT_EQ(ign.end().reason, FinishReason::kLength);
  EXPECT_EQ(ign.ids(), (std::vector<int32_t>{29, 30, 31, 0, 1}));

  SessionId c = *sched->Open();
  PreparedTurn stop_ids = Turn({2}, 10);
  stop_ids.stopping.stop_token_ids = {5};
  RecordingSink st;
  ASSERT_TRUE(sched->Submit(c, stop_ids, &st).ok());
  ASSERT_TRUE(st.WaitEnd());
  EXPECT_EQ(st.end().reason, FinishReason::kStopToken);
  EXPECT_EQ(st.ids(), (std::vector<int32_t>{3, 4, 5}));
}

TEST_F(SchedulerTest, StopSequenceEndsTheTurnAndIsNotEmitted) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  PreparedTurn t = Turn({0}, 10);  // 1 2 3 4 ... -> "b" "c" "d" "e"
  t.stopping.stop_sequences = {"de"};
  RecordingSink sink;
  ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(sink.end().reason, FinishReason::kStopSequence);
  EXPECT_EQ(sink.text(), "bc");
  EXPECT_EQ(sink.ids(), (std::vector<int32_t>{1, 2, 3, 4}));
}

TEST_F(SchedulerTest, FullContextEndsTheTurn) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/4);
  SessionId a = *sched->Open();
  RecordingSink sink;
  ASSERT_TRUE(sched->Submit(a, Turn({0, 1}, 10), &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  // Two prompt tokens + two fed generated tokens fill 4 positions; the third
  // sampled token has no room.
  EXPECT_EQ(sink.end().reason, FinishReason::kContextFull);
  EXPECT_EQ(sink.ids(), (std::vector<int32_t>{2, 3, 4}));
  RecordingSink more;
  EXPECT_EQ(sched->Submit(a, Turn({0}, 1), &more).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, PromptLogprobsScoreEveryPromptTokenAcrossChunks) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/512);
  SessionId a = *sched->Open();
  // 200 tokens = two prefill chunks; token i+1 is the successor of token i
  // except at every 10th position.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 200; ++i) prompt.push_back(i % 10 == 0 ? 7 : (prompt.empty() ? 0 : (prompt.back() + 1) % kVocab));
  PreparedTurn t = Turn(prompt, 0);
  t.prompt_logprobs = true;
  RecordingSink sink;
  ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(sink.end().reason, FinishReason::kLength);
  EXPECT_TRUE(sink.ids().empty());
  const std::vector<float> lp = sink.end().prompt_logprobs;
  ASSERT_EQ(lp.size(), prompt.size() - 1);
  // Softmax over one logit kHot and kVocab-1 zeros.
  const double denom = std::log(std::exp(double{kHot}) + (kVocab - 1));
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const bool successor = prompt[i + 1] == (prompt[i] + 1) % kVocab;
    const double expected = (successor ? kHot : 0.0) - denom;
    EXPECT_NEAR(lp[i], expected, 1e-4) << "position " << i;
  }
}

TEST_F(SchedulerTest, PenaltiesSeeThePrompt) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  // Greedy would pick 2, the successor of the last prompt token; 2 also
  // appears in the prompt, so the penalties push it to 5 / 10 - 2 - 2 < 0.
  PreparedTurn t = Turn({2, 0, 1}, 1);
  t.sampling.presence_penalty = 2.0f;
  t.sampling.frequency_penalty = 2.0f;
  t.sampling.repetition_penalty = 10.0f;
  RecordingSink sink;
  ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  ASSERT_EQ(sink.ids().size(), 1u);
  EXPECT_NE(sink.ids()[0], 2);
}

}  // namespace
}  // namespace decoded::serving
