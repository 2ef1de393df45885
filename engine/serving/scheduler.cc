#include "engine/serving/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/backend.h"

namespace decoded::serving {

struct Scheduler::Session {
  std::unique_ptr<DecodeContext> ctx;
  bool fresh = true;           // no turn accepted yet
  std::vector<int32_t> carry;  // sampled tokens not yet in the KV cache
  // The current turn; null when idle. Owned here, stepped by one worker at a time.
  std::unique_ptr<TurnRunner> turn;
  TurnSink* sink = nullptr;
  bool turn_started = false;
  bool cancel = false;    // end the turn before its next step
  bool queued = false;    // in runnable_
  bool running = false;   // a worker holds it (stepping or emitting)
  Clock::time_point step_started;  // when the worker took it (valid while running)
  bool closing = false;
};

Scheduler::Scheduler(const ServingModel* model, SchedulerOptions options)
    : model_(model), options_(std::move(options)) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

absl::StatusOr<SessionId> Scheduler::Open() {
  SessionId id;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server holds its maximum of ", options_.max_sessions, " sessions"));
    }
    id = next_id_++;
    // Reserve the slot now so concurrent opens cannot overshoot while the KV
    // cache is allocated outside the lock.
    sessions_[id] = std::make_unique<Session>();
  }
  absl::StatusOr<std::unique_ptr<DecodeContext>> ctx = model_->NewContext(options_.context_length);
  absl::MutexLock lock(&mu_);
  if (!ctx.ok()) {
    sessions_.erase(id);
    return ctx.status();
  }
  if (options_.kv_budget_bytes > 0) {
    // KV memory is reserved at open (committed lazily as the context fills),
    // so the budget bounds what open sessions can grow to.
    int64_t reserved = (*ctx)->kv_bytes();
    for (const auto& [other, session] : sessions_) {
      if (session->ctx != nullptr) reserved += session->ctx->kv_bytes();
    }
    if (reserved > options_.kv_budget_bytes) {
      sessions_.erase(id);
      return absl::ResourceExhaustedError(absl::StrCat("another session would reserve ", reserved,
                                                       " KV bytes, over the server's budget of ",
                                                       options_.kv_budget_bytes));
    }
  }
  sessions_[id]->ctx = *std::move(ctx);
  return id;
}

absl::StatusOr<bool> Scheduler::IsFresh(SessionId id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->closing) return absl::NotFoundError("no such session");
  return it->second->fresh;
}

absl::Status Scheduler::Submit(SessionId id, PreparedTurn turn, TurnSink* sink) {
  const Clock::time_point accepted = Clock::now();
  if (turn.prompt.empty()) return absl::InvalidArgumentError("the turn's input is empty");
  const int32_t vocab = model_->vocab_size();
  for (int32_t t : turn.prompt) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (int32_t t : turn.stopping.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (turn.stopping.max_new_tokens < 0) return absl::InvalidArgumentError("max_new_tokens must be >= 0");
  for (const std::string& stop : turn.stopping.stop_sequences) {
    if (stop.empty()) return absl::InvalidArgumentError("stop sequences must not be empty");
  }
  if (absl::Status s = ValidateSamplingParams(turn.sampling); !s.ok()) return s;

  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->closing || it->second->ctx == nullptr) {
    return absl::NotFoundError("no such session");
  }
  Session* s = it->second.get();
  if (s->turn != nullptr) {
    return absl::FailedPreconditionError("a turn is still running on this session; wait for its end or cancel it");
  }
  // No step runs on ctx here: either the session is idle or its worker is
  // only emitting the previous turn's events.
  const int32_t cached = s->ctx->cached_len();
  const int64_t needed = static_cast<int64_t>(s->carry.size()) + static_cast<int64_t>(turn.prompt.size());
  const int64_t room = s->ctx->capacity() - cached;
  if (needed > room) {
    return absl::InvalidArgumentError(absl::StrCat("the input needs ", needed, " tokens but the session's context has ",
                                                   room, " of ", s->ctx->capacity(), " left"));
  }
  if (not_started_ >= options_.max_queued) {
    return absl::ResourceExhaustedError(absl::StrCat("the server has ", options_.max_queued, " turns queued"));
  }
  s->turn = std::make_unique<TurnRunner>(*model_, std::move(turn), std::move(s->carry), cached, accepted);
  s->carry.clear();
  s->sink = sink;
  s->fresh = false;
  s->turn_started = false;
  s->cancel = false;
  ++not_started_;
  // A running session's worker queues it once it has finished emitting.
  if (!s->running) Enqueue(s);
  return absl::OkStatus();
}

absl::Status Scheduler::Cancel(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->closing) return absl::NotFoundError("no such session");
  if (it->second->turn != nullptr) it->second->cancel = true;
  return absl::OkStatus();
}

void Scheduler::Close(SessionId id) {
  std::unique_ptr<Session> dropped;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    if (it->second->closing) {
      // Another Close is waiting for the step: return only once it is done,
      // so every caller gets the no-more-sink-calls guarantee.
      struct Gone {
        Scheduler* self;
        SessionId id;
      } gone{this, id};
      mu_.Await(absl::Condition(
          +[](Gone* g) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !g->self->sessions_.contains(g->id); }, &gone));
      return;
    }
    Session* s = it->second.get();
    s->closing = true;
    if (s->queued) {
      runnable_.erase(std::find(runnable_.begin(), runnable_.end(), s));
      s->queued = false;
    }
    if (s->turn != nullptr && !s->turn_started) --not_started_;
    // Await releases mu_: other sessions may be opened meanwhile and rehash
    // the map, so look the entry up again afterwards (`s` itself is stable).
    mu_.Await(absl::Condition(
        +[](Session* session) { return !session->running; }, s));
    auto again = sessions_.find(id);
    dropped = std::move(again->second);
    sessions_.erase(again);
  }
  // The KV cache and plan bindings go here, outside the lock.
  dropped.reset();
}

EngineStats Scheduler::Stats() const {
  absl::MutexLock lock(&mu_);
  EngineStats stats;
  stats.sessions_active = static_cast<int64_t>(sessions_.size());
  stats.turns_queued = static_cast<int64_t>(runnable_.size());
  stats.workers_busy = busy_;
  const Clock::time_point now = Clock::now();
  for (const auto& [id, session] : sessions_) {
    if (!session->running) continue;
    stats.longest_running_step_seconds = std::max(
        stats.longest_running_step_seconds, std::chrono::duration<double>(now - session->step_started).count());
  }
  return stats;
}

bool Scheduler::HasWorkOrStopping() const { return stopping_ || !runnable_.empty(); }

void Scheduler::Enqueue(Session* s) {
  s->queued = true;
  runnable_.push_back(s);
}

void Scheduler::WorkerLoop() {
  std::unique_ptr<Executor> executor = options_.make_executor();
  for (;;) {
    // Pick the next session.
    Session* s;
    TurnRunner* turn;
    TurnSink* sink;
    bool cancel;
    bool others_waiting;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Scheduler::HasWorkOrStopping));
      if (stopping_) return;
      s = runnable_.front();
      runnable_.pop_front();
      s->queued = false;
      s->running = true;
      s->step_started = Clock::now();
      ++busy_;
      if (!s->turn_started) {
        s->turn_started = true;
        --not_started_;
      }
      turn = s->turn.get();
      sink = s->sink;
      cancel = s->cancel;
      others_waiting = !runnable_.empty();
    }

    // Step it (or end it, when cancelled before this step).
    StepOutput out;
    if (cancel) {
      out.end = turn->Cancel();
    } else {
      out = turn->Step(*s->ctx, *executor, others_waiting ? kSharedPrefillChunk : kMaxPrefillChunk);
      if (options_.on_step && out.seconds > 0) options_.on_step(out.prefill, out.seconds);
    }

    // The session is idle for new turns before its end event goes out, so a
    // client that answers the TurnEnd at once is never refused.
    std::unique_ptr<TurnRunner> finished;
    if (out.end) {
      absl::MutexLock lock(&mu_);
      s->carry = turn->TakeCarry();
      finished = std::move(s->turn);
      s->sink = nullptr;
      s->cancel = false;
    }

    // Emit its events. `running` still holds the session: Close waits and no
    // other worker can pick it, so the sink calls of one session never overlap.
    for (const TokenEvent& event : out.tokens) sink->OnToken(event);
    if (out.end) sink->OnTurnEnd(*out.end);
    finished.reset();

    absl::MutexLock lock(&mu_);
    s->running = false;
    --busy_;
    if (!s->closing && s->turn != nullptr) Enqueue(s);
  }
}

}  // namespace decoded::serving
