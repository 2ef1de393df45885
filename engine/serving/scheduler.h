// The worker pool: W workers step decode sessions one step at a time.
//
// Contract (DESIGN.md section 4):
// - Runnable sessions wait in one FIFO queue. A worker pops the front session,
//   runs ONE step of its turn (a prefill chunk, or one decode step and its
//   sampling), emits that step's events, and pushes the session to the back if
//   its turn has more work. So a session is in at most one place at a time
//   (queue or one worker): its steps never overlap and every runnable session
//   gets a step per round (round-robin fairness).
// - A cancelled turn ends (kCancelled) when its session is next picked,
//   before any further step; a closed session is removed from the queue at
//   once, so a queued turn of a gone client never runs.
// - Close waits for a running step (and its event emission) to return, then
//   destroys the session's DecodeContext.
// - Admission: at most max_sessions open sessions and max_queued accepted
//   turns that have not yet started; beyond either, RESOURCE_EXHAUSTED.
//
// Each worker owns one Executor (made by `make_executor` on its own thread).
// Sink calls happen on worker threads with no scheduler lock held.
#ifndef DECODED_ENGINE_SERVING_SCHEDULER_H_
#define DECODED_ENGINE_SERVING_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime.h"
#include "engine/serving/engine.h"
#include "engine/serving/serving_model.h"
#include "engine/serving/turn_runner.h"

namespace decoded::serving {

// Prefill chunk while other sessions wait for a worker: a 32-token chunk of
// the default model costs about as much as a few decode steps, so a long
// prompt delays other streams' tokens by that much, not by a whole
// kMaxPrefillChunk chunk.
inline constexpr int32_t kSharedPrefillChunk = 32;

struct SchedulerOptions {
  int workers = 1;
  int max_sessions = 16;
  int max_queued = 64;
  int32_t context_length = 2048;  // KV capacity of each session
  // Upper bound on the KV bytes all open sessions reserve (capacity, not
  // live length); opening one more beyond it is RESOURCE_EXHAUSTED. 0: none.
  int64_t kv_budget_bytes = 0;
  std::function<std::unique_ptr<Executor>()> make_executor;
  std::function<void(bool prefill, double seconds)> on_step;  // may be empty
};

class Scheduler {
 public:
  // Starts the workers. `model` must outlive the scheduler.
  Scheduler(const ServingModel* model, SchedulerOptions options);
  // Stops the workers after their current step; remaining sessions are
  // destroyed without sink calls.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // RESOURCE_EXHAUSTED beyond max_sessions; NewContext errors pass through.
  absl::StatusOr<SessionId> Open();

  // True until the session's first turn has been accepted (the Engine adds
  // BOS only then). NOT_FOUND for an unknown session.
  absl::StatusOr<bool> IsFresh(SessionId id) const;

  // Validates and queues a turn; see Engine::SubmitTurn for the errors.
  absl::Status Submit(SessionId id, PreparedTurn turn, TurnSink* sink);

  // See Engine::CancelTurn.
  absl::Status Cancel(SessionId id);

  // See Engine::CloseSession.
  void Close(SessionId id);

  // sessions_active, turns_queued, workers_busy.
  EngineStats Stats() const;

 private:
  struct Session;

  void WorkerLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes `s` to the back of the run queue.
  void Enqueue(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServingModel* model_;
  const SchedulerOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<SessionId, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::deque<Session*> runnable_ ABSL_GUARDED_BY(mu_);
  SessionId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int not_started_ ABSL_GUARDED_BY(mu_) = 0;  // accepted turns before their first step
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::thread> workers_;
};

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_SCHEDULER_H_
