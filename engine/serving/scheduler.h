// The worker pool: W workers step decode sessions one step at a time.
//
// Contract (engine.h states what callers see):
// - Runnable sessions wait in one FIFO queue. A worker takes one step's
//   sessions out of it, runs the step, emits the step's events, and pushes
//   each session back if its turn has more work. A step is one of: ending a
//   turn asked to end (alone; with mixed steps the first such session
//   wherever it waits, so a cancel never waits for its turn); else, with
//   max_step_tokens > 0, a mixed step: the next token of every session
//   waiting to decode (up to max_batch, in queue order), then prefill spans
//   of the waiting prompts in queue order, each as many of its tokens as
//   the step's token budget has left (max_step_tokens minus the decode
//   rows), all in one BatchDecoder::Step. With max_step_tokens == 0: one
//   prefill chunk of the front session alone, or one decode step of every
//   session waiting to decode, up to max_batch, in queue order. Either way
//   continuous batching: a session joins the batch at its next token and
//   leaves it when its turn ends, is cancelled or its client goes, without
//   stalling the others. A session is in at most one place at a time (queue
//   or one worker): its steps never overlap.
// - Decode latency bound: with mixed steps, every decoding session (up to
//   max_batch) is in every step, so a burst of prompts delays its next token
//   by at most one step of max_step_tokens tokens, however many prompts
//   arrive. Without: round-robin puts every other runnable session's step
//   between two decode steps of a running session, and a prefill step is one
//   chunk of at most kSharedPrefillChunk tokens while other sessions wait.
// - A worker holds its plans (one per (rows, output rows) bucket pair) while any
//   session is open and releases them, with every binding, when none is.
// - The scheduler is the one owner of a session's turn state: the running
//   turn, a turn held behind a cancelled one, the carry token, the cancel and
//   shutdown requests, and the client's event credit.
// - A turn asked to end (cancel, shutdown) ends when its session is next
//   picked, before any further step.
// - Backpressure: each emitted token event spends one credit of the session
//   (max_unconsumed_events); EventsConsumed returns credits. A session without
//   credit is parked (not runnable) until credits come back or its turn is
//   asked to end.
// - Close never waits: the session stops counting against max_sessions at
//   once and leaves the run queue; it is destroyed (KV cache and bindings
//   freed) on the closing thread when no step runs, else by the worker right
//   after its step. Its release callbacks run then; no sink call follows.
// - Admission: at most max_sessions open sessions, and max_queued accepted
//   turns that have not yet started; beyond either, RESOURCE_EXHAUSTED.
//   Contiguous KV (no pool): each open session's reservation within
//   kv_budget_bytes, else RESOURCE_EXHAUSTED at open.
// - Paged KV (ServingModel::kv_blocks): a turn whose input needs more blocks
//   than the pool has is refused (RESOURCE_EXHAUSTED). A prompt's first
//   prefill span maps the blocks of its whole prompt; when the pool cannot
//   give them, blocks are taken back (preemption) from idle sessions, least
//   recently used first, then from sessions whose queued turn has not
//   started, newest turn first; such a session's next (or queued) turn
//   prefills its cached context again, as context: penalties, prompt
//   logprobs and Usage::cached_tokens see the same turn input as without
//   the preemption. Nothing is taken back unless that makes room. If the
//   prompt still does not fit it waits in the queue, and new prompts behind
//   it too (first come, first served); prompts whose blocks are mapped
//   already, and decode rows, go on past it, and the worker sleeps while
//   nothing can step until a step ends or a session is queued or goes. When
//   a step's decode rows need blocks and none is free, even after that, the
//   newest of their turns ends RESOURCE_EXHAUSTED (its tokens so far stand)
//   and its session's blocks go back at once (its next turn recomputes its
//   context), until the older rows have theirs; no running turn's blocks are
//   ever written by another. A turn's blocks past its context go back when
//   it ends. Without mixed steps (max_step_tokens == 0) nothing is taken
//   back: a prefill or decode step the pool refuses ends its turn
//   RESOURCE_EXHAUSTED.
//
// Each worker owns one Executor (made by `make_executor` on its own thread).
// Sink calls and release callbacks happen with no scheduler lock held.
#ifndef DECODED_ENGINE_SERVING_SCHEDULER_H_
#define DECODED_ENGINE_SERVING_SCHEDULER_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime.h"
#include "engine/serving/engine.h"
#include "engine/serving/heap_trimmer.h"
#include "engine/serving/serving_model.h"
#include "engine/serving/turn_runner.h"

namespace decoded::serving {

// Prefill chunk while other sessions wait for a worker: a 32-token chunk of
// the default model costs about as much as a few decode steps, so a long
// prompt delays other streams' tokens by that much, not by a whole
// kMaxPrefillChunk chunk. Not on a backend whose prefill results depend on
// the chunk's size (Backend::prefill_depends_on_chunk_rows), where every
// chunk is kMaxPrefillChunk.
inline constexpr int32_t kSharedPrefillChunk = 32;

struct SchedulerOptions {
  int workers = 1;
  int max_sessions = 16;
  int max_queued = 64;
  int32_t context_length = 2048;  // KV capacity of each session
  // Upper bound on the KV bytes all sessions reserve (capacity, not live
  // length); opening one more beyond it is RESOURCE_EXHAUSTED. 0: none.
  int64_t kv_budget_bytes = 0;
  int max_unconsumed_events = 8;  // see EngineOptions
  std::function<std::unique_ptr<Executor>()> make_executor;
  int max_batch = 1;  // decode sessions stepped together (see EngineOptions)
  // Token budget of a mixed step (see EngineOptions); 0: no mixed steps.
  // A value <= max_batch is raised to max_batch + 1.
  int32_t max_step_tokens = 0;
  // Prefix caching (see EngineOptions); only with a KV pool and mixed steps.
  bool prefix_cache = false;
  std::function<void(const StepInfo&)> on_step;  // may be empty
  std::function<void(const absl::Status&)> on_device_lost;  // see EngineOptions; may be empty
};

class Scheduler {
 public:
  // Starts the workers. `model` must outlive the scheduler.
  Scheduler(const ServingModel* model, SchedulerOptions options);
  // Stops the workers after their current step; remaining sessions are
  // destroyed without sink calls (their release callbacks do run).
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // RESOURCE_EXHAUSTED beyond max_sessions or the KV budget; UNAVAILABLE
  // after BeginShutdown; NewContext errors pass through.
  absl::StatusOr<SessionId> Open();

  // Validates and queues a turn (BOS placed from the context's state); see
  // Engine::SubmitTurn for the errors.
  absl::Status Submit(SessionId id, PreparedTurn turn, TurnSink* sink);

  // See Engine::CancelTurn, CloseSession, EventsConsumed, BeginShutdown.
  absl::Status Cancel(SessionId id);
  void Close(SessionId id, absl::AnyInvocable<void()> on_released = nullptr);
  void EventsConsumed(SessionId id, int count);
  void BeginShutdown();

  EngineStats Stats() const;

 private:
  struct Session;

  // A session a worker took for one step, with what the step needs of it.
  struct Picked {
    Session* session;
    TurnRunner* turn;
    TurnSink* sink;
    std::optional<FinishReason> end_request;
    // Prompt tokens a mixed step prefills for it; 0: a decode row (or an end).
    int32_t span_tokens = 0;
    // Not OK: the KV pool had no block for its decode row; its turn ends with this.
    absl::Status kv_refused;
    // Its KV blocks were given up for older turns' rows (kv_refused is set):
    // its context is carry from its turn's end on.
    bool kv_released = false;
  };
  // What a worker waits for: work, stop, or (holding plans) no open session.
  struct WorkerWake {
    const Scheduler* scheduler;
    const bool* holds_plans;
  };
  static bool WorkerHasWork(WorkerWake* wake);

  void WorkerLoop();
  // Sessions one decode step takes: options_.max_batch within [1, kMaxBatch].
  int32_t MaxBatch() const { return std::clamp(options_.max_batch, 1, kMaxBatch); }
  // Token budget of a mixed step; 0 without mixed steps.
  int32_t MaxStepTokens() const {
    if (options_.max_step_tokens <= 0) return 0;
    return std::clamp(options_.max_step_tokens, MaxBatch() + 1, kMaxStepTokens);
  }
  // A queued session whose next step is a decode step (no end requested).
  bool DecodeReady(const Session* s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the sessions of one step out of the run queue (see the contract).
  void PickLocked(std::vector<Picked>& picked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one mixed step of `picked` (BatchDecoder::Step) into `outs`.
  void RunMixedStep(const std::vector<Picked>& picked, BatchDecoder& decoder, Executor& executor,
                    std::vector<StepOutput>& outs);
  // After a step: credits, turn end, events, re-queue or release.
  void FinishStep(const Picked& p, StepOutput out) ABSL_LOCKS_EXCLUDED(mu_);
  // Tokens of the next prefill step: kSharedPrefillChunk while other sessions
  // wait, unless the model's backend makes prefill depend on chunk size.
  int32_t PrefillChunk(bool others_waiting) const;
  // Calls on_device_lost once when a failed step left the backend unhealthy.
  void ReportDeviceLoss(const std::vector<StepOutput>& outs);
  // A chat turn's whole conversation tokenized before the lock was taken,
  // valid while the session's version is unchanged.
  struct RenderedConversation {
    uint64_t version = 0;
    std::vector<int32_t> ids;
  };
  // Queues `s` at the back when it has a step to run and is neither queued
  // nor held by a worker.
  void MaybeEnqueue(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that `turn` fits `s`'s context, places BOS and makes it the
  // running turn. A chat turn's prompt is derived here: the whole
  // conversation is rendered and tokenized, the context is rewound to the
  // longest prefix it shares with that, and the rest becomes the prompt.
  absl::Status StartTurn(Session* s, PreparedTurn turn, TurnSink* sink, Clock::time_point accepted,
                         const RenderedConversation* rendered = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records an ended turn in its session: the context tokens it added, and
  // for a chat turn its messages and the model's reply (the text the client
  // received) in the session's conversation.
  void RecordTurn(Session* s, const TurnRunner& turn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Paged KV: maps the blocks `n_tokens` more tokens of `s` need, taking
  // back idle sessions' blocks (least recently used first) when the pool is
  // short. The pool's error when even that is not enough.
  absl::Status ReserveKvLocked(Session* s, int32_t n_tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Paged KV: maps the blocks of the rest of `s`'s prompt at its first span,
  // first from the prefix cache where its context starts empty, then from
  // the pool (ReserveKvLocked). False, with nothing mapped, when they do not
  // fit now.
  bool MapPromptKvLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Paged KV: one position's block for each decode row of a step; where the
  // pool runs dry the newest turn among `rows` gives its blocks up and ends
  // RESOURCE_EXHAUSTED (Picked::kv_refused, kv_released).
  void ReserveDecodeRowsLocked(std::vector<Picked>& rows) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prefix caching is on: a KV pool, mixed steps, the option.
  bool PrefixCaching() const {
    return options_.prefix_cache && MaxStepTokens() > 0 && model_->kv_blocks().block_tokens > 0;
  }
  // Rewinds `s`'s context to `len` (<= cached_len) and forgets the
  // registered blocks past it. A registered block is read-only (other
  // contexts may map it): a `len` inside one rewinds to its start, and the
  // kept tokens of it become carry to recompute. OK or Rewind's error.
  absl::Status RewindLocked(Session* s, int32_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers the full KV blocks of `s` that are not yet (prefix caching).
  void CacheFullBlocksLocked(Session* s, const TurnRunner& turn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a closing session that no worker holds out of the map.
  std::unique_ptr<Session> TakeClosedLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys a session taken by TakeClosedLocked and runs its release
  // callbacks (no lock held).
  void Release(std::unique_ptr<Session> s) ABSL_LOCKS_EXCLUDED(mu_);

  const ServingModel* model_;
  const SchedulerOptions options_;
  std::atomic<bool> device_loss_reported_{false};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<SessionId, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::deque<Session*> runnable_ ABSL_GUARDED_BY(mu_);
  SessionId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int open_ ABSL_GUARDED_BY(mu_) = 0;         // sessions not closing
  int not_started_ ABSL_GUARDED_BY(mu_) = 0;  // accepted turns before their first step
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t nonfinite_logits_turns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t kv_preemptions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t kv_exhausted_turns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_queried_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_hit_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t turns_started_ ABSL_GUARDED_BY(mu_) = 0;
  // Counts changes that may let a queued session step; a worker whose pick
  // found nothing to step records it in stalled_gen_ and waits for the next.
  uint64_t wake_gen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stalled_gen_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Gives freed session memory back to the OS: heap, and the KV blocks
  // closed or rewound sessions freed.
  HeapTrimmer heap_trimmer_{absl::Milliseconds(250), [this] { model_->TrimKv(); }};
  std::vector<std::thread> workers_;
};

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_SCHEDULER_H_
