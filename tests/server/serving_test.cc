// Scheduler semantics with a scripted fake model: fairness, one step at a time
// per session, cancellation before a step, closing, admission, validation and
// the stop rules. The fake's logits make the greedy continuation of token t
// be (t + 1) % kVocab, so expected tokens follow from arithmetic, not from
// running the scheduler.
#include <atomic>
#include <functional>
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
  std::vector<bool> step_is_prefill ABSL_GUARDED_BY(mu);  // per entry of step_order
  std::vector<int> batch_sizes ABSL_GUARDED_BY(mu);       // contexts per batched decode step
  std::vector<std::vector<int>> step_spans ABSL_GUARDED_BY(mu);  // span sizes per mixed step
  std::vector<std::vector<int>> step_tags ABSL_GUARDED_BY(mu);   // context tag per span per mixed step
  std::atomic<int> plan_releases{0};                      // BatchDecoder::Release calls with plans held
  std::atomic<int> overlaps{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> next_tag{0};
  absl::Duration step_sleep = absl::ZeroDuration();
  // When >= 0: the logits row of the token at this context position is NaN.
  std::atomic<int> nan_at_position{-1};
  // FakeModel::health() is UNAVAILABLE once set (a lost GPU).
  std::atomic<bool> device_lost{false};
  // FakeModel::prefill_depends_on_chunk_rows() (Vulkan's tiled mat-mat).
  std::atomic<bool> chunk_dependent_prefill{false};

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
  std::vector<int> BatchSizes() {
    absl::MutexLock l(&mu);
    return batch_sizes;
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
    Enter(/*prefill=*/true);
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
    Enter(/*prefill=*/false);
    logits_.clear();
    history_.push_back(token);
    AppendRow(token);
    Leave();
    return absl::Span<const float>(logits_);
  }

  absl::Status ReserveKv(int32_t n_tokens) override {
    if (cached_len() + n_tokens > capacity_) return absl::ResourceExhaustedError("full");
    return absl::OkStatus();
  }
  int32_t kv_blocks() const override { return 1; }

  absl::Status Rewind(int32_t len) override {
    if (len < 0 || len > cached_len()) return absl::InvalidArgumentError("bad rewind");
    history_.resize(len);
    return absl::OkStatus();
  }

  int64_t kv_bytes() const override { return int64_t{capacity_} * 16; }  // any positive size
  int64_t bound_nodes() const override { return 0; }

 private:
  void Enter(bool prefill) {
    if (in_step_.exchange(true)) world_->overlaps++;
    absl::MutexLock l(&world_->mu);
    world_->steps_started++;
    world_->step_order.push_back(tag_);
    world_->step_is_prefill.push_back(prefill);
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
    if (static_cast<int>(history_.size()) - 1 == world_->nan_at_position.load()) logits_[base + 3] = NAN;
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

// The worker's batched decoder over fake contexts: records each step's size,
// then decodes the contexts one by one; "holds plans" once it has run.
class FakeBatchDecoder final : public BatchDecoder {
 public:
  FakeBatchDecoder(FakeWorld* world, int32_t max_batch, int32_t max_step_tokens)
      : world_(world), max_batch_(max_batch), max_step_tokens_(std::max(max_batch, max_step_tokens)) {}
  absl::StatusOr<absl::Span<const float>> Decode(absl::Span<DecodeContext* const> contexts,
                                                 absl::Span<const int32_t> tokens, Executor& executor) override {
    if (contexts.empty() || static_cast<int32_t>(contexts.size()) > max_batch_) {
      return absl::InvalidArgumentError("bad batch");
    }
    {
      absl::MutexLock l(&world_->mu);
      world_->batch_sizes.push_back(static_cast<int>(contexts.size()));
    }
    held_ = true;
    logits_.clear();
    for (size_t i = 0; i < contexts.size(); ++i) {
      auto row = contexts[i]->Decode(tokens[i], executor);
      if (!row.ok()) return row.status();
      logits_.insert(logits_.end(), row->begin(), row->end());
    }
    return absl::Span<const float>(logits_);
  }
  // A mixed step: records its spans' sizes (a decode row is a span of 1),
  // then runs them one by one: a decode row through Decode, a prefill span
  // through Prefill (chunks of at most kMaxPrefillChunk).
  absl::StatusOr<absl::Span<const float>> Step(absl::Span<const StepSpan> spans, Executor& executor) override {
    std::vector<int> sizes, tags;
    int total = 0;
    for (const StepSpan& span : spans) {
      sizes.push_back(static_cast<int>(span.tokens.size()));
      tags.push_back(static_cast<FakeContext*>(span.context)->tag());
      total += sizes.back();
    }
    if (spans.empty() || total > max_step_tokens_) return absl::InvalidArgumentError("bad step");
    {
      absl::MutexLock l(&world_->mu);
      world_->step_spans.push_back(sizes);
      world_->step_tags.push_back(tags);
    }
    held_ = true;
    logits_.clear();
    for (const StepSpan& span : spans) {
      if (span.tokens.size() == 1 && span.logits == SpanLogits::kLast) {
        auto row = span.context->Decode(span.tokens[0], executor);
        if (!row.ok()) return row.status();
        logits_.insert(logits_.end(), row->begin(), row->end());
        continue;
      }
      for (size_t at = 0; at < span.tokens.size(); at += kMaxPrefillChunk) {
        const auto chunk = span.tokens.subspan(at, kMaxPrefillChunk);
        const bool all = span.logits == SpanLogits::kAll;
        auto rows = span.context->Prefill(chunk, all, executor);
        if (!rows.ok()) return rows.status();
        if (all || (span.logits == SpanLogits::kLast && at + chunk.size() == span.tokens.size())) {
          logits_.insert(logits_.end(), rows->begin(), rows->end());
        }
      }
    }
    return absl::Span<const float>(logits_);
  }
  int32_t max_batch() const override { return max_batch_; }
  int32_t max_step_tokens() const override { return max_step_tokens_; }
  int32_t plan_rows(int32_t n) const override { return n; }
  void Release() override {
    if (held_) world_->plan_releases++;
    held_ = false;
  }
  int64_t bound_nodes() const override { return held_ ? 1 : 0; }

 private:
  FakeWorld* world_;
  int32_t max_batch_;
  int32_t max_step_tokens_;
  bool held_ = false;
  std::vector<float> logits_;
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
  // The fake chat template: BOS, then per message its role's open token,
  // its content's letters ('a' + id) and kEndTurn; then the generation
  // prompt kAssistant. Fails like a template's raise_exception on "!".
  absl::StatusOr<std::vector<int32_t>> EncodeConversation(absl::Span<const ChatMessage> messages) const override {
    {
      absl::MutexLock l(&mu_);
      ++conversations_encoded_;
    }
    std::vector<int32_t> ids = {kBos};
    for (const ChatMessage& m : messages) {
      if (m.content == "!") return absl::InvalidArgumentError("the template rejects \"!\"");
      ids.push_back(m.role == "user" ? kUser : m.role == "assistant" ? kAssistant : kSystem);
      for (char c : m.content) ids.push_back(c - 'a');
      ids.push_back(kEndTurn);
    }
    ids.push_back(kAssistant);
    return ids;
  }
  int32_t bos_id() const override { return kBos; }
  absl::StatusOr<std::unique_ptr<BatchDecoder>> NewBatchDecoder(int32_t max_batch,
                                                                int32_t max_step_tokens) const override {
    return std::unique_ptr<BatchDecoder>(new FakeBatchDecoder(world_, max_batch, max_step_tokens));
  }
  bool prefill_depends_on_chunk_rows() const override { return world_->chunk_dependent_prefill; }
  absl::Status health() const override {
    return world_->device_lost ? absl::UnavailableError("fake device was lost") : absl::OkStatus();
  }
  int conversations_encoded() const {
    absl::MutexLock l(&mu_);
    return conversations_encoded_;
  }
  static constexpr int32_t kUser = 26, kAssistant = 27, kSystem = 28, kEndTurn = 29, kBos = 30;

  // The n-th context created (tags count from 0).
  FakeContext* context(int n) const {
    absl::MutexLock l(&mu_);
    return contexts_[n];
  }

 private:
  FakeWorld* world_;
  mutable absl::Mutex mu_;
  mutable std::vector<FakeContext*> contexts_ ABSL_GUARDED_BY(mu_);
  mutable int conversations_encoded_ ABSL_GUARDED_BY(mu_) = 0;
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

constexpr int32_t kBos = 30;  // the fake's BOS for text-like turns

// A text-like turn: the scheduler places BOS from the context's state.
PreparedTurn TextLikeTurn(std::vector<int32_t> prompt, int max_new_tokens) {
  PreparedTurn t = Turn(std::move(prompt), max_new_tokens);
  t.bos_id = kBos;
  return t;
}

// A sink that consumes its events as they arrive, like a reading client.
class ConsumingSink : public RecordingSink {
 public:
  ConsumingSink(Scheduler* s, SessionId id) : sched_(s), id_(id) {}
  void OnToken(const TokenEvent& e) override {
    RecordingSink::OnToken(e);
    sched_->EventsConsumed(id_, 1);
  }

 private:
  Scheduler* sched_;
  SessionId id_;
};

// Every scheduler test runs twice: without mixed steps (param 0: a prefill
// chunk of one session per step) and with them (a 64-token step budget).
// Tests of one mode's step shapes skip the other.
class SchedulerTest : public ::testing::TestWithParam<int32_t> {
 protected:
  bool mixed() const { return GetParam() > 0; }
  std::unique_ptr<Scheduler> MakeScheduler(int workers, int max_sessions = 8, int max_queued = 8,
                                           int32_t context_length = 64, int max_unconsumed_events = 1 << 20,
                                           int max_batch = 1,
                                           std::function<void(const absl::Status&)> on_device_lost = nullptr) {
    SchedulerOptions o;
    o.on_device_lost = std::move(on_device_lost);
    o.workers = workers;
    o.max_batch = max_batch;
    o.max_step_tokens = GetParam();
    o.max_sessions = max_sessions;
    o.max_queued = max_queued;
    o.context_length = context_length;
    // Recording sinks never report consumed events; tests of backpressure
    // set their own limit.
    o.max_unconsumed_events = max_unconsumed_events;
    o.make_executor = [] { return std::make_unique<FakeExecutor>(); };
    return std::make_unique<Scheduler>(&model_, o);
  }

  FakeWorld world_;
  FakeModel model_{&world_};
};

TEST_P(SchedulerTest, SessionsAreSteppedRoundRobin) {
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
  // Mixed steps: a alone, then a's decode row beside b's and c's prompts.
  EXPECT_EQ(world_.Order(), mixed() ? (std::vector<int>{0, 0, 1, 2, 0, 1, 2, 1, 2})
                                    : (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(sa.ids(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(sa.end().reason, FinishReason::kLength);
}

// Continuous batching: every session waiting to decode joins one step, up to
// max_batch; sessions join at their next token (after their prefill) and
// leave when their turn ends, and each still follows its own token chain.
TEST_P(SchedulerTest, DecodingSessionsAreSteppedTogetherUpToMaxBatch) {
  if (mixed()) GTEST_SKIP() << "a chunk-per-step schedule";
  auto sched = MakeScheduler(1, 8, 8, 64, 1 << 20, /*max_batch=*/4);
  std::vector<RecordingSink> sinks(6);
  std::vector<SessionId> ids;
  world_.Pause();
  for (int i = 0; i < 6; ++i) {
    ids.push_back(*sched->Open());
    // Different lengths: sessions leave the batch at different steps.
    ASSERT_TRUE(sched->Submit(ids[i], Turn({static_cast<int32_t>(i)}, 3 + i), &sinks[i]).ok());
  }
  world_.Resume();
  for (auto& s : sinks) ASSERT_TRUE(s.WaitEnd());
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> expected;
    for (int k = 1; k <= 3 + i; ++k) expected.push_back(i + k);
    EXPECT_EQ(sinks[i].ids(), expected) << "session " << i;
    EXPECT_EQ(sinks[i].end().reason, FinishReason::kLength);
  }
  const std::vector<int> sizes = world_.BatchSizes();
  ASSERT_FALSE(sizes.empty());
  EXPECT_EQ(*std::max_element(sizes.begin(), sizes.end()), 4);
  EXPECT_EQ(sizes.back(), 1);  // the longest turn finishes alone
  // Every decode step of every session ran in some batch: 2 + 3 + ... + 7.
  int decoded = 0;
  for (int n : sizes) decoded += n;
  EXPECT_EQ(decoded, 2 + 3 + 4 + 5 + 6 + 7);
}

// The prefill interleaving bound: while a 300-token prompt is prefilled, the
// running sessions' decode steps alternate with its chunks, each of at most
// kSharedPrefillChunk tokens.
TEST_P(SchedulerTest, ALongPromptDelaysRunningSessionsByOneSharedChunkPerToken) {
  if (mixed()) GTEST_SKIP() << "a chunk-per-step schedule";
  auto sched = MakeScheduler(1, 8, 8, 512, 1 << 20, /*max_batch=*/8);
  RecordingSink a, b, c;
  SessionId sa = *sched->Open(), sb = *sched->Open(), sc = *sched->Open();
  world_.Pause();
  ASSERT_TRUE(sched->Submit(sa, Turn({1}, 40), &a).ok());
  ASSERT_TRUE(sched->Submit(sb, Turn({2}, 40), &b).ok());
  world_.WaitStepsStarted(1);
  std::vector<int32_t> long_prompt(300, 5);
  ASSERT_TRUE(sched->Submit(sc, Turn(long_prompt, 2), &c).ok());
  world_.Resume();
  ASSERT_TRUE(a.WaitEnd() && b.WaitEnd() && c.WaitEnd());
  std::vector<int> order;
  std::vector<bool> prefill;
  std::vector<size_t> chunk_sizes;
  {
    absl::MutexLock l(&world_.mu);
    order = world_.step_order;
    prefill = world_.step_is_prefill;
    chunk_sizes = world_.prefill_sizes;
  }
  // Session c (tag 2) has its chunks; between two decode steps of session a
  // (tag 0) at most one of them runs, and none exceeds the shared chunk
  // while a and b wait.
  int chunks_since_a = 0, max_chunks_between = 0, c_chunks = 0;
  bool a_decoding = false;
  size_t prefill_index = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (prefill[i]) {
      const size_t n = chunk_sizes[prefill_index++];
      if (order[i] == 2) {
        ++c_chunks;
        if (a_decoding) ++chunks_since_a;
        if (a_decoding) EXPECT_LE(n, static_cast<size_t>(kSharedPrefillChunk));
      }
    } else if (order[i] == 0) {
      max_chunks_between = std::max(max_chunks_between, chunks_since_a);
      chunks_since_a = 0;
      a_decoding = true;
    }
  }
  EXPECT_GE(c_chunks, 300 / kSharedPrefillChunk);
  EXPECT_EQ(max_chunks_between, 1);
}

// A mixed step takes every decoding session's next token and fills the rest
// of its token budget with the waiting prompts, in queue order; a decoding
// session is in every step from its first token to its last, so a burst of
// prompts delays each of its tokens by one step at most.
TEST_P(SchedulerTest, MixedStepsPackDecodeRowsAndPromptSpansUnderTheBudget) {
  if (!mixed()) GTEST_SKIP() << "mixed steps only";
  auto sched = MakeScheduler(1, 8, 8, 256, 1 << 20, /*max_batch=*/4);
  std::vector<RecordingSink> sinks(5);
  std::vector<SessionId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(*sched->Open());
  std::vector<std::vector<int32_t>> prompts = {{0}, {1}, {2}, std::vector<int32_t>(50, 3), std::vector<int32_t>(40, 4)};
  world_.Pause();
  ASSERT_TRUE(sched->Submit(ids[0], Turn(prompts[0], 12), &sinks[0]).ok());
  world_.WaitStepsStarted(1);  // the worker holds session 0's first step
  for (int i = 1; i < 5; ++i) ASSERT_TRUE(sched->Submit(ids[i], Turn(prompts[i], i < 3 ? 12 : 3), &sinks[i]).ok());
  world_.Resume();
  for (auto& s : sinks) ASSERT_TRUE(s.WaitEnd());

  for (int i = 0; i < 5; ++i) {
    // Each follows its own successor chain from its prompt's last token.
    std::vector<int32_t> expected;
    for (int k = 1; k <= (i < 3 ? 12 : 3); ++k) expected.push_back((prompts[i].back() + k) % kVocab);
    EXPECT_EQ(sinks[i].ids(), expected) << "session " << i;
    std::vector<int32_t> history = prompts[i];
    history.insert(history.end(), expected.begin(), expected.end() - 1);  // the last is the carry
    EXPECT_EQ(model_.context(i)->history(), history) << "session " << i;
  }
  std::vector<std::vector<int>> sizes, tags;
  {
    absl::MutexLock l(&world_.mu);
    sizes = world_.step_spans;
    tags = world_.step_tags;
  }
  ASSERT_GE(sizes.size(), 2u);
  for (const auto& step : sizes) {
    int total = 0;
    for (int n : step) total += n;
    EXPECT_LE(total, GetParam());
  }
  // Step 2: session 0's decode row, then 1 and 2's one-token prompts, then
  // 3's whole prompt, and of 4's what the budget leaves (64 - 53).
  EXPECT_EQ(tags[1], (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(sizes[1], (std::vector<int>{1, 1, 1, 50, 64 - 53}));
  // Sessions 0..2 decode in every step from their first to their last.
  for (int t = 0; t < 3; ++t) {
    std::vector<size_t> in;
    for (size_t s = 0; s < tags.size(); ++s) {
      if (std::count(tags[s].begin(), tags[s].end(), t) > 0) in.push_back(s);
    }
    ASSERT_FALSE(in.empty());
    EXPECT_EQ(in.back() - in.front() + 1, in.size()) << "session " << t << " sat out a step";
  }
}

// A cancel is a step of its own wherever the session waits: it does not wait
// for the prompts queued ahead of it to come round (each of them takes a
// step's whole budget while its prefill lasts).
TEST_P(SchedulerTest, ACancelDoesNotWaitBehindTheMixedStepsAheadOfIt) {
  if (!mixed()) GTEST_SKIP() << "mixed steps only";
  world_.step_sleep = absl::Milliseconds(5);
  auto sched = MakeScheduler(1, 8, 8, 1024, 1 << 20, /*max_batch=*/4);
  constexpr int kSessions = 7;  // 0 held in its first step, 1..5 queued, 6 cancelled
  std::vector<RecordingSink> sinks(kSessions);
  std::vector<SessionId> ids;
  for (int i = 0; i < kSessions; ++i) ids.push_back(*sched->Open());
  world_.Pause();
  ASSERT_TRUE(sched->Submit(ids[0], Turn(std::vector<int32_t>(300, 0), 1), &sinks[0]).ok());
  world_.WaitStepsStarted(1);
  for (int i = 1; i < kSessions; ++i) {
    ASSERT_TRUE(sched->Submit(ids[i], Turn(std::vector<int32_t>(300, i), 1), &sinks[i]).ok());
  }
  ASSERT_TRUE(sched->Cancel(ids[6]).ok());
  world_.Resume();
  ASSERT_TRUE(sinks[6].WaitEnd());
  size_t steps_when_cancelled = 0;
  {
    absl::MutexLock l(&world_.mu);
    steps_when_cancelled = world_.step_spans.size();
  }
  EXPECT_EQ(sinks[6].end().reason, FinishReason::kCancelled);
  // The cancel comes right after the held step (a second may have started
  // before the end was emitted); waiting for its turn at the queue's front
  // it would come after sessions 1..5 had a step each (6 steps).
  EXPECT_LE(steps_when_cancelled, 2u);
  for (int i = 0; i < kSessions - 1; ++i) {
    ASSERT_TRUE(sinks[i].WaitEnd());
    EXPECT_EQ(sinks[i].ids().size(), 1u) << "session " << i;
  }
}

// Prompt-logprobs spans return a row per token: all of them together take at
// most kMaxPrefillChunk rows a step, however many such turns wait.
TEST_P(SchedulerTest, PromptLogprobsSpansShareOneChunkOfOutputRowsPerStep) {
  if (!mixed()) GTEST_SKIP() << "mixed steps only";
  SchedulerOptions o;
  o.workers = 1;
  o.max_batch = 4;
  o.max_step_tokens = 512;
  o.max_sessions = 8;
  o.max_queued = 8;
  o.context_length = 1024;
  o.max_unconsumed_events = 1 << 20;
  o.make_executor = [] { return std::make_unique<FakeExecutor>(); };
  Scheduler sched(&model_, std::move(o));
  std::vector<RecordingSink> sinks(3);
  std::vector<SessionId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(*sched.Open());
  world_.Pause();
  ASSERT_TRUE(sched.Submit(ids[0], Turn({5}, 4), &sinks[0]).ok());
  world_.WaitStepsStarted(1);
  for (int i = 1; i < 3; ++i) {
    PreparedTurn t = Turn(std::vector<int32_t>(100, i), 1);
    t.prompt_logprobs = true;
    ASSERT_TRUE(sched.Submit(ids[i], std::move(t), &sinks[i]).ok());
  }
  world_.Resume();
  for (auto& sink : sinks) ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(sinks[1].end().prompt_logprobs.size(), 99u);
  EXPECT_EQ(sinks[2].end().prompt_logprobs.size(), 99u);
  std::vector<std::vector<int>> sizes, tags;
  {
    absl::MutexLock l(&world_.mu);
    sizes = world_.step_spans;
    tags = world_.step_tags;
  }
  ASSERT_GE(sizes.size(), 2u);
  // Step 2: session 0's decode row, all of 1's prompt, 28 of 2's.
  EXPECT_EQ(tags[1], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(sizes[1], (std::vector<int>{1, 100, kMaxPrefillChunk - 100}));
}

// A worker's plans (and their bindings) go when the last session closes.
TEST_P(SchedulerTest, WorkersReleaseTheirPlansWhenNoSessionIsOpen) {
  auto sched = MakeScheduler(2, 8, 8, 64, 1 << 20, /*max_batch=*/4);
  RecordingSink s1, s2;
  SessionId a = *sched->Open(), b = *sched->Open();
  ASSERT_TRUE(sched->Submit(a, Turn({1}, 4), &s1).ok());
  ASSERT_TRUE(sched->Submit(b, Turn({2}, 4), &s2).ok());
  ASSERT_TRUE(s1.WaitEnd() && s2.WaitEnd());
  EXPECT_EQ(world_.plan_releases.load(), 0);  // sessions still open: plans kept
  sched->Close(a);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(world_.plan_releases.load(), 0);
  sched->Close(b);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (world_.plan_releases.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_GE(world_.plan_releases.load(), 1);
}

// A cancel reaches a batched session before its next step; the others of
// its batch go on.
TEST_P(SchedulerTest, CancellingOneSessionOfABatchLeavesTheOthersRunning) {
  world_.step_sleep = absl::Milliseconds(2);
  auto sched = MakeScheduler(1, 8, 8, 64, 1 << 20, /*max_batch=*/4);
  std::vector<RecordingSink> sinks(3);
  std::vector<SessionId> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(*sched->Open());
    ASSERT_TRUE(sched->Submit(ids[i], Turn({static_cast<int32_t>(i)}, 20), &sinks[i]).ok());
  }
  while (sinks[1].ids().size() < 3) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(sched->Cancel(ids[1]).ok());
  for (auto& s : sinks) ASSERT_TRUE(s.WaitEnd());
  EXPECT_EQ(sinks[1].end().reason, FinishReason::kCancelled);
  EXPECT_LT(sinks[1].ids().size(), 20u);
  EXPECT_EQ(sinks[0].end().reason, FinishReason::kLength);
  EXPECT_EQ(sinks[2].end().reason, FinishReason::kLength);
  EXPECT_EQ(sinks[2].ids().size(), 20u);
}

TEST_P(SchedulerTest, StepsOfOneSessionNeverOverlapAcrossWorkers) {
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

TEST_P(SchedulerTest, CancelledQueuedTurnEndsWithoutAStep) {
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

TEST_P(SchedulerTest, CancelMidTurnKeepsTheSessionUsable) {
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
  // The token sampled before the cancel is context already; the next turn
  // feeds it first.
  EXPECT_EQ(second.end().usage.cached_tokens, 2);
  EXPECT_EQ(second.end().usage.prompt_tokens, 1);
  EXPECT_EQ(second.end().usage.prefilled_tokens, 2);
  EXPECT_EQ(second.end().usage.context_tokens, 5);
  EXPECT_EQ(model_.context(0)->history(), (std::vector<int32_t>{0, 1, 7, 8}));
}

TEST_P(SchedulerTest, CloseDropsAQueuedTurnAndItsContext) {
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

// Close runs on gRPC callback threads: it must never wait for a step, and a
// closed session must stop counting against admission at once.
TEST_P(SchedulerTest, CloseReturnsAtOnceAndReleasesAfterTheRunningStep) {
  auto sched = MakeScheduler(1, /*max_sessions=*/1);
  SessionId a = *sched->Open();
  RecordingSink sa;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 50), &sa).ok());
  world_.WaitStepsStarted(1);
  absl::Notification released;
  int calls_at_release = -1;
  sched->Close(a, [&] {
    calls_at_release = sa.calls();
    released.Notify();
  });
  // Returned with the step still running; the slot is free already.
  EXPECT_FALSE(released.HasBeenNotified());
  EXPECT_EQ(world_.destroyed.load(), 0);
  EXPECT_EQ(sched->Stats().sessions_active, 0);
  absl::StatusOr<SessionId> b = sched->Open();
  EXPECT_TRUE(b.ok()) << b.status();
  world_.Resume();
  ASSERT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(world_.destroyed.load(), 1);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(sa.calls(), calls_at_release) << "sink called after the session's release";
  EXPECT_LE(calls_at_release, 1);  // at most the token of the step that was running
  // The closed session's turn was never stepped again.
  for (int tag : world_.Order()) EXPECT_EQ(tag, 0);
  EXPECT_EQ(world_.Order().size(), 1u);
}

TEST_P(SchedulerTest, ReleaseOfAnIdleOrUnknownSessionRunsAtOnce) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  bool released = false;
  sched->Close(a, [&] { released = true; });
  EXPECT_TRUE(released);
  EXPECT_EQ(world_.destroyed.load(), 1);
  bool again = false;
  sched->Close(a, [&] { again = true; });
  EXPECT_TRUE(again);
}

// The age of a running step is what health watches for a wedged worker loop.
TEST_P(SchedulerTest, StatsReportTheAgeOfTheRunningStep) {
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
  absl::Notification released;
  sched->Close(a, [&] { released.Notify(); });
  ASSERT_TRUE(released.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(sched->Stats().longest_running_step_seconds, 0);
}

// Prefills a 300-token prompt on session a while session b, submitted first,
// decodes 40 tokens beside it (b is queued behind a whenever a is picked);
// returns the sizes of a's prefill chunks (b's prefill is its one token).
std::vector<size_t> LongPromptChunksBesideADecodingSession(Scheduler& sched, FakeWorld& world) {
  SessionId a = *sched.Open();
  SessionId b = *sched.Open();
  RecordingSink sa, sb;
  world.Pause();
  EXPECT_TRUE(sched.Submit(b, Turn({1}, 40), &sb).ok());
  EXPECT_TRUE(sched.Submit(a, Turn(std::vector<int32_t>(300, 1), 1), &sa).ok());
  world.Resume();
  EXPECT_TRUE(sa.WaitEnd());
  EXPECT_TRUE(sb.WaitEnd());
  std::vector<size_t> a_chunks;
  absl::MutexLock l(&world.mu);
  for (size_t n : world.prefill_sizes) {
    if (n > 1) a_chunks.push_back(n);
  }
  world.prefill_sizes.clear();
  return a_chunks;
}

// A long prompt is prefilled in small chunks while another session waits, and
// in full chunks when it runs alone.
TEST_P(SchedulerTest, PrefillChunksShrinkWhileOthersWait) {
  if (mixed()) GTEST_SKIP() << "a chunk-per-step schedule";
  auto sched = MakeScheduler(1, 8, 8, 1024);
  // a's 300 tokens come in chunks of kSharedPrefillChunk while b is decoding,
  // so a needs at least 300 / 32 calls.
  const std::vector<size_t> a_chunks = LongPromptChunksBesideADecodingSession(*sched, world_);
  for (size_t n : a_chunks) EXPECT_LE(n, static_cast<size_t>(kSharedPrefillChunk));
  EXPECT_GE(a_chunks.size(), static_cast<size_t>(300 / kSharedPrefillChunk));
  SessionId alone_session = *sched->Open();
  RecordingSink alone;
  ASSERT_TRUE(sched->Submit(alone_session, Turn(std::vector<int32_t>(300, 1), 1), &alone).ok());
  ASSERT_TRUE(alone.WaitEnd());
  absl::MutexLock l(&world_.mu);
  EXPECT_EQ(world_.prefill_sizes.front(), static_cast<size_t>(kMaxPrefillChunk));
}

// Where a chunk's size changes its results (Backend::
// prefill_depends_on_chunk_rows), a long prompt is cut into the same full
// chunks while another session waits as alone: its tokens cannot depend on
// the load.
TEST_P(SchedulerTest, PrefillChunksStayFullWhereTheirSizeChangesResults) {
  if (mixed()) GTEST_SKIP() << "a chunk-per-step schedule";
  world_.chunk_dependent_prefill = true;
  auto sched = MakeScheduler(1, 8, 8, 1024);
  // 300 = 128 + 128 + 44, as alone.
  EXPECT_EQ(LongPromptChunksBesideADecodingSession(*sched, world_),
            (std::vector<size_t>{static_cast<size_t>(kMaxPrefillChunk), static_cast<size_t>(kMaxPrefillChunk),
                                 static_cast<size_t>(300 - 2 * kMaxPrefillChunk)}));
}

// Sessions reserve KV at open; the budget caps how many fit.
TEST_P(SchedulerTest, KvBudgetLimitsOpenSessions) {
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

TEST_P(SchedulerTest, SessionAndQueueLimitsAreEnforced) {
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

TEST_P(SchedulerTest, BadTurnsAreRefusedWithTheirCodes) {
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

TEST_P(SchedulerTest, EndOfGenerationAndStopTokensEndTheTurn) {
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

TEST_P(SchedulerTest, StopSequenceEndsTheTurnAndIsNotEmitted) {
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

// Text held back as a possible stop-sequence start is not lost when the turn
// is cancelled: it comes with the TurnEnd, so the events spell every token
// the turn put in the context.
TEST_P(SchedulerTest, CancelledTurnEndCarriesTheTextHeldBack) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  PreparedTurn t = Turn({0}, 10);  // 1 2 3 ... -> "b" "c" "d"
  t.stopping.stop_sequences = {"bz"};  // "b" could begin it: held back
  CancelOnFirstToken sink(sched.get(), a);
  ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(sink.end().reason, FinishReason::kCancelled);
  EXPECT_EQ(sink.ids(), (std::vector<int32_t>{1}));
  EXPECT_EQ(sink.text(), "");
  EXPECT_EQ(sink.end().text, "b");
}

TEST_P(SchedulerTest, FullContextEndsTheTurn) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/4);
  SessionId a = *sched->Open();
  RecordingSink sink;
  ASSERT_TRUE(sched->Submit(a, Turn({0, 1}, 10), &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  // Two prompt tokens, one fed generated token and the last sampled one (fed
  // at the next turn's start) fill the 4 positions.
  EXPECT_EQ(sink.end().reason, FinishReason::kContextFull);
  EXPECT_EQ(sink.ids(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(sink.end().usage.context_tokens, 4);
  RecordingSink more;
  EXPECT_EQ(sched->Submit(a, Turn({0}, 1), &more).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(SchedulerTest, PromptLogprobsScoreEveryPromptTokenAcrossChunks) {
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

// The prompt reaches the repetition penalty only; presence and frequency
// penalties count generated tokens (OpenAI's formula, as vLLM).
TEST_P(SchedulerTest, PromptTokensReachTheRepetitionPenaltyOnly) {
  auto sched = MakeScheduler(1);
  // Greedy picks 2, the successor of the last prompt token (logit 5); 2 is
  // in the prompt three times, which with presence and frequency 2 counted
  // would give 5 - 2 - 6 < 0 and another token.
  {
    SessionId a = *sched->Open();
    PreparedTurn t = Turn({2, 2, 2, 0, 1}, 1);
    t.sampling.presence_penalty = 2.0f;
    t.sampling.frequency_penalty = 2.0f;
    RecordingSink sink;
    ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
    ASSERT_TRUE(sink.WaitEnd());
    EXPECT_EQ(sink.ids(), std::vector<int32_t>{2});
  }
  // The repetition penalty does see the prompt: 5 / 10 falls below token 3's
  // biased logit 1 (without the penalty 2 would win).
  for (const float repetition : {1.0f, 10.0f}) {
    SessionId a = *sched->Open();
    PreparedTurn t = Turn({2, 2, 2, 0, 1}, 1);
    t.sampling.repetition_penalty = repetition;
    t.sampling.logit_bias = {{3, 1.0f}};
    RecordingSink sink;
    ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
    ASSERT_TRUE(sink.WaitEnd());
    EXPECT_EQ(sink.ids(), std::vector<int32_t>{repetition == 1.0f ? 2 : 3}) << repetition;
  }
}

// The carry (the previous turn's last sampled token, fed at the start of
// this turn) is context from an earlier turn: penalties do not see it, as
// they would not had it been cached (an outside tester found it counted).
TEST_P(SchedulerTest, PenaltiesDoNotSeeThePreviousTurnsLastToken) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  RecordingSink first, second;
  ASSERT_TRUE(sched->Submit(a, Turn({5}, 1), &first).ok());
  ASSERT_TRUE(first.WaitEnd());
  ASSERT_EQ(first.ids(), std::vector<int32_t>{6});  // carried into the next turn
  // Context 5 6 | 5: the successor 6 (logit 5) is not in this turn's input,
  // so repetition 10 leaves it above token 3's biased logit 1.
  PreparedTurn t = Turn({5}, 1);
  t.sampling.repetition_penalty = 10.0f;
  t.sampling.logit_bias = {{3, 1.0f}};
  ASSERT_TRUE(sched->Submit(a, t, &second).ok());
  ASSERT_TRUE(second.WaitEnd());
  EXPECT_EQ(second.ids(), std::vector<int32_t>{6});
}

// BOS belongs to the start of the context, so whether a turn gets one
// follows from the context, not from whether an earlier turn was accepted:
// a first turn cancelled while queued leaves the context empty.
TEST_P(SchedulerTest, BosFollowsTheContextAfterACancelAtEveryPhase) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/1024);
  // Cancelled while queued: nothing entered the context.
  {
    SessionId busy = *sched->Open(), a = *sched->Open();
    RecordingSink sb, first, second;
    world_.Pause();
    ASSERT_TRUE(sched->Submit(busy, Turn({1}, 2), &sb).ok());
    world_.WaitStepsStarted(1);
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn({5, 6}, 3), &first).ok());
    ASSERT_TRUE(sched->Cancel(a).ok());
    world_.Resume();
    ASSERT_TRUE(first.WaitEnd() && sb.WaitEnd());
    EXPECT_EQ(first.end().usage.context_tokens, 0);
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn({7, 8}, 1), &second).ok());
    ASSERT_TRUE(second.WaitEnd());
    EXPECT_EQ(model_.context(1)->history(), (std::vector<int32_t>{kBos, 7, 8}));
    EXPECT_EQ(second.end().usage.prompt_tokens, 3);
  }
  // Cancelled during prefill: the first chunk (with its BOS) is context, the
  // next turn continues it without another BOS.
  {
    SessionId a = *sched->Open();
    std::vector<int32_t> long_prompt(kMaxPrefillChunk + 10, 4);
    RecordingSink first, second;
    world_.Pause();
    const int started = [&] {
      absl::MutexLock l(&world_.mu);
      return world_.steps_started;
    }();
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn(long_prompt, 3), &first).ok());
    world_.WaitStepsStarted(started + 1);  // the first chunk's step
    ASSERT_TRUE(sched->Cancel(a).ok());
    world_.Resume();
    ASSERT_TRUE(first.WaitEnd());
    EXPECT_EQ(first.end().reason, FinishReason::kCancelled);
    const int32_t kept = first.end().usage.context_tokens;
    EXPECT_EQ(kept, mixed() ? GetParam() : kMaxPrefillChunk);  // one chunk, or one step's budget
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn({9}, 1), &second).ok());
    ASSERT_TRUE(second.WaitEnd());
    std::vector<int32_t> expected = {kBos};
    expected.insert(expected.end(), long_prompt.begin(), long_prompt.begin() + kept - 1);
    expected.push_back(9);
    EXPECT_EQ(model_.context(2)->history(), expected);
    EXPECT_EQ(second.end().usage.cached_tokens, kept);
  }
  // Cancelled during decode: the context has BOS, prompt and generated tokens.
  {
    SessionId a = *sched->Open();
    CancelOnFirstToken first(sched.get(), a);
    RecordingSink second;
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn({2}, 10), &first).ok());
    ASSERT_TRUE(first.WaitEnd());
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn({9}, 1), &second).ok());
    ASSERT_TRUE(second.WaitEnd());
    EXPECT_EQ(model_.context(3)->history(), (std::vector<int32_t>{kBos, 2, 3, 9}));
  }
}

// The token sampled last by a turn is context; a turn cancelled before its
// first step must hand it on, not drop it.
TEST_P(SchedulerTest, CarryTokenSurvivesATurnCancelledBeforeItsFirstStep) {
  auto sched = MakeScheduler(1);
  SessionId busy = *sched->Open(), a = *sched->Open();
  RecordingSink t1, sb, t2, t3;
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 2), &t1).ok());  // samples 1, 2; 2 is not fed
  ASSERT_TRUE(t1.WaitEnd());
  world_.Pause();
  ASSERT_TRUE(sched->Submit(busy, Turn({20}, 2), &sb).ok());
  world_.WaitStepsStarted(3);  // t1 took two steps; busy's first holds the worker
  ASSERT_TRUE(sched->Submit(a, Turn({7}, 2), &t2).ok());
  ASSERT_TRUE(sched->Cancel(a).ok());
  world_.Resume();
  ASSERT_TRUE(t2.WaitEnd() && sb.WaitEnd());
  EXPECT_EQ(t2.end().usage.context_tokens, 3);
  ASSERT_TRUE(sched->Submit(a, Turn({9}, 1), &t3).ok());
  ASSERT_TRUE(t3.WaitEnd());
  EXPECT_EQ(model_.context(1)->history(), (std::vector<int32_t>{0, 1, 2, 9}));
  EXPECT_EQ(t3.end().usage.cached_tokens, 3);
  EXPECT_EQ(t3.end().usage.prefilled_tokens, 2);
}

// Usage adds up: each turn's context = cached + prompt + generated, the next
// turn's cached is this turn's context, and the last context is the sum of
// all prompts and generated tokens, which is what the KV cache plus the
// pending token hold.
TEST_P(SchedulerTest, UsageAddsUpOverTurns) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/256);
  SessionId a = *sched->Open();
  struct Spec {
    std::vector<int32_t> prompt;
    int max_new_tokens;
  };
  const std::vector<Spec> turns = {{{1, 2, 3}, 4}, {{5}, 0}, {{6, 7}, 1}, {{28}, 10}, {{8, 9, 10, 11}, 2}};
  int32_t sum = 0, previous_context = 0;
  for (const Spec& spec : turns) {
    RecordingSink sink;
    ASSERT_TRUE(sched->Submit(a, TextLikeTurn(spec.prompt, spec.max_new_tokens), &sink).ok());
    ASSERT_TRUE(sink.WaitEnd());
    const TurnUsage u = sink.end().usage;
    EXPECT_EQ(u.cached_tokens, previous_context);
    EXPECT_EQ(u.context_tokens, u.cached_tokens + u.prompt_tokens + u.generated_tokens);
    EXPECT_EQ(u.generated_tokens, static_cast<int32_t>(sink.ids().size()));
    sum += u.prompt_tokens + u.generated_tokens;
    previous_context = u.context_tokens;
  }
  EXPECT_EQ(previous_context, sum);
  // 3+1 (BOS) + 4 generated, 1, 2 + 1, 1 + 3 (29 30 31=EOG), 4 + 2.
  EXPECT_EQ(sum, 4 + 4 + 1 + 2 + 1 + 1 + 3 + 4 + 2);
  const int32_t in_kv = static_cast<int32_t>(model_.context(0)->history().size());
  EXPECT_EQ(in_kv + 1, sum);  // the last sampled token waits for the next turn
  // Exactly the room the context reports is accepted.
  RecordingSink fill, over;
  EXPECT_EQ(sched->Submit(a, Turn(std::vector<int32_t>(256 - sum + 1, 1), 0), &over).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(sched->Submit(a, Turn(std::vector<int32_t>(256 - sum, 1), 0), &fill).ok());
  ASSERT_TRUE(fill.WaitEnd());
  EXPECT_EQ(fill.end().usage.context_tokens, 256);
  EXPECT_EQ(model_.context(0)->history().size(), 256u);
}

TEST_P(SchedulerTest, TurnSubmittedAfterACancelStartsWhenTheCancelledTurnEnds) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/16);
  SessionId a = *sched->Open();
  RecordingSink first, second;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 10), &first).ok());
  world_.WaitStepsStarted(1);
  ASSERT_TRUE(sched->Cancel(a).ok());
  ASSERT_TRUE(sched->Submit(a, Turn({7}, 2), &second).ok());
  RecordingSink third;
  EXPECT_EQ(sched->Submit(a, Turn({7}, 2), &third).code(), absl::StatusCode::kFailedPrecondition);
  world_.Resume();
  ASSERT_TRUE(first.WaitEnd() && second.WaitEnd());
  EXPECT_EQ(first.end().reason, FinishReason::kCancelled);
  EXPECT_EQ(second.end().reason, FinishReason::kLength);
  EXPECT_EQ(second.ids(), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(model_.context(0)->history(), (std::vector<int32_t>{0, 1, 7, 8}));

  // A held turn that no longer fits when it is due is refused through its sink.
  CancelOnFirstToken fourth(sched.get(), a);
  RecordingSink too_long;
  world_.Pause();
  const int before = world_.Order().size();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 10), &fourth).ok());
  world_.WaitStepsStarted(before + 1);
  ASSERT_TRUE(sched->Cancel(a).ok());
  ASSERT_TRUE(sched->Submit(a, Turn(std::vector<int32_t>(12, 1), 2), &too_long).ok());
  world_.Resume();
  ASSERT_TRUE(too_long.WaitEnd());
  EXPECT_EQ(too_long.end().reason, FinishReason::kError);
  EXPECT_EQ(too_long.end().error.code(), absl::StatusCode::kInvalidArgument);
}

// turn, cancel, turn, cancel: the second cancel is for the held turn, which
// ends CANCELLED without running (not dropped because the first turn was
// already ending).
TEST_P(SchedulerTest, CancelAfterAHeldTurnCancelsTheHeldTurn) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/32);
  SessionId a = *sched->Open();
  RecordingSink first, second;
  world_.Pause();
  ASSERT_TRUE(sched->Submit(a, Turn({0}, 10), &first).ok());
  world_.WaitStepsStarted(1);
  ASSERT_TRUE(sched->Cancel(a).ok());
  ASSERT_TRUE(sched->Submit(a, Turn({7}, 5), &second).ok());
  ASSERT_TRUE(sched->Cancel(a).ok());
  world_.Resume();
  ASSERT_TRUE(first.WaitEnd() && second.WaitEnd());
  EXPECT_EQ(first.end().reason, FinishReason::kCancelled);
  EXPECT_EQ(second.end().reason, FinishReason::kCancelled);
  EXPECT_TRUE(second.ids().empty());
  // The held turn's input is not in the context: it never ran. The session
  // takes a new turn.
  RecordingSink third;
  ASSERT_TRUE(sched->Submit(a, Turn({7}, 1), &third).ok());
  ASSERT_TRUE(third.WaitEnd());
  EXPECT_EQ(third.end().reason, FinishReason::kLength);
}

// A client that does not read gets at most max_unconsumed_events events
// ahead; its session is then not stepped and its worker time goes to others.
TEST_P(SchedulerTest, SessionWithoutCreditWaitsForItsClient) {
  auto sched = MakeScheduler(1, 8, 8, 256, /*max_unconsumed_events=*/3);
  SessionId slow = *sched->Open(), fast = *sched->Open();
  RecordingSink slow_sink;  // never consumes
  ConsumingSink fast_sink(sched.get(), fast);
  PreparedTurn long_turn = Turn({10}, 40);
  long_turn.stopping.ignore_eos = true;
  ASSERT_TRUE(sched->Submit(slow, Turn({0}, 100), &slow_sink).ok());
  ASSERT_TRUE(sched->Submit(fast, long_turn, &fast_sink).ok());
  ASSERT_TRUE(fast_sink.WaitEnd());
  EXPECT_EQ(fast_sink.ids().size(), 40u);
  EXPECT_EQ(slow_sink.ids().size(), 3u);
  EXPECT_EQ(sched->Stats().sessions_waiting_for_client, 1);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(slow_sink.ids().size(), 3u);
  // Two consumed events buy two more steps.
  sched->EventsConsumed(slow, 2);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (slow_sink.ids().size() < 5u && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(slow_sink.ids().size(), 5u);
  // A cancel ends a turn that waits for its client.
  ASSERT_TRUE(sched->Cancel(slow).ok());
  ASSERT_TRUE(slow_sink.WaitEnd());
  EXPECT_EQ(slow_sink.end().reason, FinishReason::kCancelled);
  EXPECT_EQ(sched->Stats().sessions_waiting_for_client, 0);
}

// A client may consume an event before the worker that emitted it is done:
// the credit must be spent before the event goes out, or the returned credit
// is lost and a reading client's session parks for good. With one credit the
// loss would stop the turn after its first token.
TEST_P(SchedulerTest, CreditConsumedDuringEmissionIsNotLost) {
  auto sched = MakeScheduler(1, 8, 8, 256, /*max_unconsumed_events=*/1);
  SessionId a = *sched->Open();
  ConsumingSink sink(sched.get(), a);  // consumes inside OnToken, on the worker
  PreparedTurn t = Turn({0}, 30);
  t.stopping.ignore_eos = true;
  ASSERT_TRUE(sched->Submit(a, t, &sink).ok());
  ASSERT_TRUE(sink.WaitEnd(absl::Seconds(5)));
  EXPECT_EQ(sink.ids().size(), 30u);
}

TEST_P(SchedulerTest, BeginShutdownEndsEveryTurnWithShutdown) {
  auto sched = MakeScheduler(1, 8, 8, 256, /*max_unconsumed_events=*/2);
  SessionId running = *sched->Open(), queued = *sched->Open(), parked = *sched->Open();
  RecordingSink parked_sink;
  ASSERT_TRUE(sched->Submit(parked, Turn({0}, 100), &parked_sink).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (sched->Stats().sessions_waiting_for_client == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(sched->Stats().sessions_waiting_for_client, 1);
  ConsumingSink running_sink(sched.get(), running), queued_sink(sched.get(), queued);
  world_.Pause();
  ASSERT_TRUE(sched->Submit(running, Turn({0}, 100), &running_sink).ok());
  world_.WaitStepsStarted(3);
  ASSERT_TRUE(sched->Submit(queued, Turn({0}, 100), &queued_sink).ok());
  sched->BeginShutdown();
  world_.Resume();
  for (RecordingSink* sink : std::vector<RecordingSink*>{&parked_sink, &running_sink, &queued_sink}) {
    ASSERT_TRUE(sink->WaitEnd());
    EXPECT_EQ(sink->end().reason, FinishReason::kShutdown);
  }
  EXPECT_EQ(queued_sink.ids().size(), 0u);
  EXPECT_LE(running_sink.ids().size(), 1u);  // at most the step that was running
  RecordingSink late;
  EXPECT_EQ(sched->Submit(running, Turn({0}, 1), &late).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sched->Open().status().code(), absl::StatusCode::kUnavailable);
}

// Logits with a NaN are never sampled from: the turn ends with INTERNAL and
// the count of such turns rises.
TEST_P(SchedulerTest, NonFiniteLogitsEndTheTurnWithAnError) {
  auto sched = MakeScheduler(1);
  SessionId a = *sched->Open();
  world_.nan_at_position = 3;  // prompt 0 1, decode 2, decode 3 -> NaN row
  RecordingSink sink;
  ASSERT_TRUE(sched->Submit(a, Turn({0, 1}, 10), &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(sink.end().reason, FinishReason::kError);
  EXPECT_EQ(sink.end().error.code(), absl::StatusCode::kInternal);
  EXPECT_NE(sink.end().error.message().find("non-finite"), std::string::npos) << sink.end().error;
  EXPECT_EQ(sink.ids(), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(sched->Stats().nonfinite_logits_turns, 1);
  // The same for the row a prefill samples from.
  SessionId b = *sched->Open();
  world_.nan_at_position = 1;
  RecordingSink prefill_sink;
  ASSERT_TRUE(sched->Submit(b, Turn({0, 1}, 10), &prefill_sink).ok());
  ASSERT_TRUE(prefill_sink.WaitEnd());
  EXPECT_EQ(prefill_sink.end().reason, FinishReason::kError);
  EXPECT_TRUE(prefill_sink.ids().empty());
  EXPECT_EQ(sched->Stats().nonfinite_logits_turns, 2);
}

// A step that fails while the model's device reports itself lost calls
// on_device_lost once, before that turn's end reaches its sink (so health can
// be NOT_SERVING by the time a client sees the error); a failing step on a
// healthy device does not, and neither does a second failure after the loss.
TEST_P(SchedulerTest, AFailedStepOnALostDeviceReportsTheLossOnceBeforeTheTurnEnds) {
  std::atomic<int> reports{0};
  RecordingSink healthy_sink, sink, later_sink;
  auto sched = MakeScheduler(1, 8, 8, 64, 1 << 20, 1, [&](const absl::Status& why) {
    EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable) << why;
    EXPECT_FALSE(sink.WaitEnd(absl::ZeroDuration())) << "reported after the failed turn ended";
    reports.fetch_add(1);
  });
  world_.nan_at_position = 1;  // every turn's prefill row fails
  SessionId a = *sched->Open();
  ASSERT_TRUE(sched->Submit(a, Turn({0, 1}, 4), &healthy_sink).ok());
  ASSERT_TRUE(healthy_sink.WaitEnd());
  EXPECT_EQ(healthy_sink.end().reason, FinishReason::kError);
  EXPECT_EQ(reports.load(), 0) << "a failed step on a healthy device is not a lost device";

  world_.nan_at_position = 3;  // prompt 0 1, decode 2, decode 3 -> fails
  world_.device_lost = true;
  SessionId b = *sched->Open();
  ASSERT_TRUE(sched->Submit(b, Turn({0, 1}, 10), &sink).ok());
  ASSERT_TRUE(sink.WaitEnd());
  EXPECT_EQ(sink.end().reason, FinishReason::kError);
  EXPECT_EQ(reports.load(), 1);

  SessionId c = *sched->Open();
  ASSERT_TRUE(sched->Submit(c, Turn({0, 1}, 10), &later_sink).ok());
  ASSERT_TRUE(later_sink.WaitEnd());
  EXPECT_EQ(reports.load(), 1) << "reported twice";
}

}  // namespace
}  // namespace decoded::serving

namespace decoded::serving {
namespace {

PreparedTurn ChatTurn(std::vector<ChatMessage> messages, int max_new_tokens) {
  PreparedTurn t;
  t.chat = true;
  t.messages = std::move(messages);
  t.stopping.max_new_tokens = max_new_tokens;
  return t;
}

std::vector<int32_t> Rendered(const FakeModel& model, const std::vector<ChatMessage>& conversation) {
  return *model.EncodeConversation(conversation);
}

// After each chat turn's prefill the context is, token for token, the
// template's rendering of the whole conversation so far: the model's replies
// (as the client received them) included, whatever the replies' own tokens
// were (the fake's reply ids 28, 29, ... re-encode as letters 2, 3, ..., so
// the context is rewound to the generation prompt and the reply re-fed).
TEST_P(SchedulerTest, ChatContextIsTheRenderingOfTheWholeConversation) {
  auto sched = MakeScheduler(1);
  SessionId id = *sched->Open();
  std::vector<ChatMessage> conversation = {{"system", "be"}, {"user", "hi"}};
  RecordingSink t1;
  ASSERT_TRUE(sched->Submit(id, ChatTurn(conversation, 2), &t1).ok());
  ASSERT_TRUE(t1.WaitEnd());
  EXPECT_EQ(t1.ids(), (std::vector<int32_t>{28, 29}));
  std::vector<int32_t> kv = Rendered(model_, conversation);
  kv.push_back(28);  // 29, the last sampled token, is the carry (not in the KV cache)
  EXPECT_EQ(model_.context(0)->history(), kv);
  conversation.push_back({"assistant", t1.text()});
  EXPECT_EQ(t1.text(), "cd");

  // Prefill only: the context is then exactly the whole rendering.
  conversation.push_back({"user", "ok"});
  RecordingSink t2;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "ok"}}, 0), &t2).ok());
  ASSERT_TRUE(t2.WaitEnd());
  EXPECT_EQ(model_.context(0)->history(), Rendered(model_, conversation));
  // cached: the tokens up to the first reply's start were reused.
  const int32_t reused = static_cast<int32_t>(Rendered(model_, {conversation[0], conversation[1]}).size());
  EXPECT_EQ(t2.end().usage.context_tokens, static_cast<int32_t>(Rendered(model_, conversation).size()));
  EXPECT_EQ(t2.end().usage.cached_tokens, reused);

  // A prefill-only turn leaves a user message without a reply; the next
  // turn renders it followed by the new one.
  conversation.push_back({"user", "go"});
  RecordingSink t3;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "go"}}, 0), &t3).ok());
  ASSERT_TRUE(t3.WaitEnd());
  EXPECT_EQ(model_.context(0)->history(), Rendered(model_, conversation));
}

TEST_P(SchedulerTest, ChatTurnRefusedByTheTemplateLeavesTheSessionAsItWas) {
  auto sched = MakeScheduler(1);
  SessionId id = *sched->Open();
  RecordingSink t1;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "hi"}}, 1), &t1).ok());
  ASSERT_TRUE(t1.WaitEnd());
  const std::vector<int32_t> before = model_.context(0)->history();
  RecordingSink refused;
  absl::Status s = sched->Submit(id, ChatTurn({{"user", "!"}}, 1), &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(model_.context(0)->history(), before);
  // A too-long chat turn is refused before anything is rewound.
  RecordingSink too_long;
  s = sched->Submit(id, ChatTurn({{"user", std::string(100, 'a')}}, 1), &too_long);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(model_.context(0)->history(), before);
  // The conversation goes on from where it was.
  RecordingSink t2;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "ok"}}, 0), &t2).ok());
  ASSERT_TRUE(t2.WaitEnd());
  EXPECT_EQ(model_.context(0)->history(),
            Rendered(model_, {{"user", "hi"}, {"assistant", "c"}, {"user", "ok"}}));
}

// A turn cancelled during its prefill is not part of the conversation: the
// next turn rewinds the partial prompt it left.
TEST_P(SchedulerTest, ChatTurnCutDuringPrefillIsForgotten) {
  auto sched = MakeScheduler(1, 8, 8, /*context_length=*/512);
  SessionId id = *sched->Open();
  RecordingSink t1;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "hi"}}, 1), &t1).ok());
  ASSERT_TRUE(t1.WaitEnd());
  // 300 letters: three prefill chunks; cancel while the first runs.
  world_.Pause();
  RecordingSink cut;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", std::string(300, 'b')}}, 4), &cut).ok());
  world_.WaitStepsStarted(2);
  ASSERT_TRUE(sched->Cancel(id).ok());
  world_.Resume();
  ASSERT_TRUE(cut.WaitEnd());
  EXPECT_EQ(cut.end().reason, FinishReason::kCancelled);
  // The partial prompt is in the KV cache: a chunk, or a step's budget.
  EXPECT_GT(model_.context(0)->history().size(), mixed() ? 50u : 100u);
  RecordingSink t2;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "ok"}}, 0), &t2).ok());
  ASSERT_TRUE(t2.WaitEnd());
  EXPECT_EQ(model_.context(0)->history(),
            Rendered(model_, {{"user", "hi"}, {"assistant", "c"}, {"user", "ok"}}));
}

// A chat turn on an idle session is rendered once (outside the scheduler's
// lock); one held behind a cancelled turn is rendered when it starts, so the
// cancelled turn's reply (what the client received of it) is part of it.
TEST_P(SchedulerTest, HeldChatTurnRendersTheConversationAsItIsWhenItStarts) {
  auto sched = MakeScheduler(1);
  SessionId id = *sched->Open();
  RecordingSink t1;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "hi"}}, 1), &t1).ok());
  ASSERT_TRUE(t1.WaitEnd());
  EXPECT_EQ(model_.conversations_encoded(), 1);

  world_.Pause();
  RecordingSink cancelled;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "ok"}}, 20), &cancelled).ok());
  world_.WaitStepsStarted(2);  // its prefill runs (and samples a token)
  ASSERT_TRUE(sched->Cancel(id).ok());
  RecordingSink held;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "go"}}, 0), &held).ok());
  world_.Resume();
  ASSERT_TRUE(cancelled.WaitEnd() && held.WaitEnd());
  EXPECT_EQ(cancelled.end().reason, FinishReason::kCancelled);
  ASSERT_EQ(cancelled.ids().size(), 1u);
  EXPECT_EQ(held.end().reason, FinishReason::kLength);
  EXPECT_EQ(model_.context(0)->history(),
            Rendered(model_, {{"user", "hi"}, {"assistant", "c"}, {"user", "ok"}, {"assistant", cancelled.text()},
                              {"user", "go"}}));
}

// After a text or token turn the context is no conversation's rendering: chat
// turns are then rendered on their own and appended (their BOS dropped).
TEST_P(SchedulerTest, ChatAfterATokenTurnIsAppended) {
  auto sched = MakeScheduler(1);
  SessionId id = *sched->Open();
  RecordingSink t1;
  ASSERT_TRUE(sched->Submit(id, Turn({5, 6}, 0), &t1).ok());
  ASSERT_TRUE(t1.WaitEnd());
  RecordingSink t2;
  ASSERT_TRUE(sched->Submit(id, ChatTurn({{"user", "hi"}}, 0), &t2).ok());
  ASSERT_TRUE(t2.WaitEnd());
  std::vector<int32_t> expected = {5, 6};
  std::vector<int32_t> chat = Rendered(model_, {{"user", "hi"}});
  expected.insert(expected.end(), chat.begin() + 1, chat.end());
  EXPECT_EQ(model_.context(0)->history(), expected);
}

INSTANTIATE_TEST_SUITE_P(StepModes, SchedulerTest, ::testing::Values(0, 64),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return info.param == 0 ? std::string("ChunkPerStep") : std::string("MixedSteps");
                         });

}  // namespace
}  // namespace decoded::serving
