#include "engine/serving/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/backend.h"
#include "engine/serving/turn_field.h"

namespace decoded::serving {

struct Scheduler::Session {
  explicit Session(SessionId id) : id(id) {}
  const SessionId id;
  std::unique_ptr<DecodeContext> ctx;
  std::vector<int32_t> carry;  // tokens of the context not yet in the KV cache
  // Every context token in order: the KV cache's, then the carry.
  std::vector<int32_t> history;
  // The chat conversation (messages and the model's replies) whose rendering
  // the context is, while `follows_conversation`. A text or token turn breaks
  // that link; chat turns after it are rendered on their own and appended.
  std::vector<ChatMessage> conversation;
  bool follows_conversation = true;
  // Changes whenever a turn starts or ends, so a conversation rendered from
  // a snapshot outside the lock is known to be current (or not).
  uint64_t version = 0;
  // The current turn; null when idle. Owned here, stepped by one worker at a time.
  std::unique_ptr<TurnRunner> turn;
  TurnSink* sink = nullptr;
  bool turn_started = false;
  // Set when the turn is to end before its next step (kCancelled, kShutdown).
  std::optional<FinishReason> end_request;
  // A turn submitted after a cancel, started when the cancelled turn ends.
  struct Held {
    PreparedTurn turn;
    TurnSink* sink;
    Clock::time_point accepted;
    bool cancelled = false;  // a cancel came after it: it ends CANCELLED without a step
  };
  std::optional<Held> held;
  int credits = 0;        // token events the client may still leave unconsumed
  bool queued = false;    // in runnable_
  bool running = false;   // a worker holds it (stepping or emitting)
  Clock::time_point step_started;  // when the worker took it (valid while running)
  Clock::time_point idle_since;    // when its last turn ended (or it opened)
  // Leading carry tokens that are context whose KV blocks were given back
  // (preemption): the next turn computes them again as context, not input.
  int32_t recompute = 0;
  // Prefix caching: its context's registered KV blocks, in order.
  PrefixChain prefix;
  uint64_t turn_seq = 0;           // order its current turn started in (later: newer)
  bool closing = false;
  std::vector<absl::AnyInvocable<void()>> on_released;

  int32_t context_tokens() const { return ctx->cached_len() + static_cast<int32_t>(carry.size()); }
  // After its KV cache gave every block back (Rewind(0)): its whole context
  // is carry, the tokens that were cached counting as recomputed context.
  void ContextToCarry() {
    recompute = static_cast<int32_t>(history.size() - (carry.size() - static_cast<size_t>(recompute)));
    carry = history;
  }
  // Has a step to run: a turn that may advance, or one that is to end.
  bool HasStep() const { return turn != nullptr && !closing && (credits > 0 || end_request.has_value()); }
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
  // No worker runs now: every session can go, with its callbacks.
  std::vector<std::unique_ptr<Session>> left;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, s] : sessions_) left.push_back(std::move(s));
    sessions_.clear();
    runnable_.clear();
  }
  for (std::unique_ptr<Session>& s : left) Release(std::move(s));
}

absl::StatusOr<SessionId> Scheduler::Open() {
  SessionId id;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("the server is shutting down");
    if (open_ >= options_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the server holds its maximum of ", options_.max_sessions, " sessions (--max_sessions)"));
    }
    id = next_id_++;
    // Reserve the slot now so concurrent opens cannot overshoot while the KV
    // cache is allocated outside the lock.
    sessions_[id] = std::make_unique<Session>(id);
    ++open_;
  }
  absl::StatusOr<std::unique_ptr<DecodeContext>> ctx = model_->NewContext(options_.context_length);
  absl::MutexLock lock(&mu_);
  auto refuse = [&](absl::Status status) {
    sessions_.erase(id);
    --open_;
    return status;
  };
  if (!ctx.ok()) return refuse(ctx.status());
  if (options_.kv_budget_bytes > 0 && model_->kv_blocks().block_tokens == 0) {
    // KV memory is reserved at open (committed lazily as the context fills),
    // so the budget bounds what sessions can grow to. Closing sessions still
    // hold theirs until their running step returns.
    int64_t reserved = (*ctx)->kv_bytes();
    for (const auto& [other, session] : sessions_) {
      if (session->ctx != nullptr) reserved += session->ctx->kv_bytes();
    }
    if (reserved > options_.kv_budget_bytes) {
      return refuse(absl::ResourceExhaustedError(absl::StrCat(
          "another session would reserve ", reserved, " KV bytes, over the server's budget of ",
          options_.kv_budget_bytes, " (--kv_budget_mb)")));
    }
  }
  Session* s = sessions_[id].get();
  s->ctx = *std::move(ctx);
  s->credits = std::max(1, options_.max_unconsumed_events);
  s->idle_since = Clock::now();
  return id;
}

absl::Status Scheduler::Submit(SessionId id, PreparedTurn turn, TurnSink* sink) {
  const Clock::time_point accepted = Clock::now();
  if (turn.chat ? turn.messages.empty() : turn.prompt.empty()) {
    return TurnFieldError(TurnField::kInput, "the turn's input is empty");
  }
  const int32_t vocab = model_->vocab_size();
  for (int32_t t : turn.prompt) {
    if (t < 0 || t >= vocab) {
      return TurnFieldError(TurnField::kInput,
                            absl::StrCat("token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (int32_t t : turn.stopping.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return TurnFieldError(TurnField::kStopTokenIds,
                            absl::StrCat("stop token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (const auto& [t, bias] : turn.sampling.logit_bias) {
    if (t < 0 || t >= vocab) {
      return TurnFieldError(TurnField::kLogitBias,
                            absl::StrCat("logit_bias token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (turn.stopping.max_new_tokens < 0) {
    return TurnFieldError(TurnField::kMaxNewTokens, "max_new_tokens must be >= 0");
  }
  for (const std::string& stop : turn.stopping.stop_sequences) {
    if (stop.empty()) return TurnFieldError(TurnField::kStopSequences, "stop sequences must not be empty");
  }
  if (absl::Status s = ValidateSamplingParams(turn.sampling); !s.ok()) return s;

  // A chat turn on an idle session is rendered and tokenized here, outside
  // the lock (about 0.5 us per token of the conversation); StartTurn uses it
  // if the session has not moved on meanwhile.
  std::optional<RenderedConversation> rendered;
  if (turn.chat) {
    std::vector<ChatMessage> conversation;
    bool idle = false;
    RenderedConversation r;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(id);
      if (it != sessions_.end() && it->second->turn == nullptr) {
        idle = true;
        r.version = it->second->version;
        if (it->second->follows_conversation) conversation = it->second->conversation;
      }
    }
    if (idle) {
      conversation.insert(conversation.end(), turn.messages.begin(), turn.messages.end());
      absl::StatusOr<std::vector<int32_t>> ids = model_->EncodeConversation(conversation);
      if (!ids.ok()) return ids.status();
      r.ids = *std::move(ids);
      rendered = std::move(r);
    }
  }

  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->closing || it->second->ctx == nullptr) {
    return absl::NotFoundError("no such session");
  }
  if (shutting_down_) return absl::UnavailableError("the server is shutting down");
  Session* s = it->second.get();
  if (s->turn != nullptr) {
    if (s->end_request == FinishReason::kCancelled && !s->held) {
      // Sent right after a cancel: starts when the cancelled turn has ended.
      s->held = Session::Held{std::move(turn), sink, accepted};
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError("a turn is still running on this session; wait for its end or cancel it");
  }
  if (not_started_ >= options_.max_queued) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server has its maximum of ", options_.max_queued, " turns queued (--max_queued)"));
  }
  return StartTurn(s, std::move(turn), sink, accepted, rendered ? &*rendered : nullptr);
}

absl::Status Scheduler::StartTurn(Session* s, PreparedTurn turn, TurnSink* sink, Clock::time_point accepted,
                                  const RenderedConversation* rendered) {
  // No step runs on ctx here: the session is idle, or its worker is past its
  // last step of the previous turn.
  int32_t context = s->context_tokens();
  // The context tokens the turn keeps: all, except where a chat turn's
  // rendering of the whole conversation departs from them.
  int32_t keep = context;
  if (turn.chat) {
    absl::StatusOr<std::vector<int32_t>> ids;
    if (rendered != nullptr && rendered->version == s->version) {
      ids = rendered->ids;
    } else {
      // A turn held behind a cancelled one: the conversation grew since.
      std::vector<ChatMessage> conversation;
      if (s->follows_conversation) conversation = s->conversation;
      conversation.insert(conversation.end(), turn.messages.begin(), turn.messages.end());
      ids = model_->EncodeConversation(conversation);
    }
    if (!ids.ok()) return ids.status();
    if (ids->empty()) return absl::FailedPreconditionError("the chat template rendered nothing");
    if (s->follows_conversation) {
      // Prefix reuse: the context already holds the longest common prefix of
      // the two; only the rest is prefilled, so after every turn the context
      // is, token for token, the rendering of the whole conversation. The
      // prefix stops short of the end so the turn feeds at least one token.
      const size_t limit = std::min(s->history.size(), ids->size() - 1);
      size_t common = 0;
      while (common < limit && s->history[common] == (*ids)[common]) ++common;
      keep = static_cast<int32_t>(common);
      turn.prompt.assign(ids->begin() + common, ids->end());
    } else {
      // Appended after text or token turns: the template's BOS only opens a context.
      if (context > 0 && ids->size() > 1 && ids->front() == model_->bos_id()) ids->erase(ids->begin());
      turn.prompt = *std::move(ids);
    }
  } else if (turn.bos_id >= 0 && context == 0 && turn.prompt.front() != turn.bos_id) {
    // BOS follows from what the context holds, not from which turns came
    // before: a first turn cancelled before its first step leaves it empty.
    turn.prompt.insert(turn.prompt.begin(), turn.bos_id);
  }
  const int64_t room = s->ctx->capacity() - keep;
  if (static_cast<int64_t>(turn.prompt.size()) > room) {
    return TurnFieldError(TurnField::kInput, absl::StrCat("the input needs ", turn.prompt.size(),
                                                          " tokens but the session's context has ", room, " of ",
                                                          s->ctx->capacity(), " left"));
  }
  if (turn.stopping.max_new_tokens_must_fit &&
      static_cast<int64_t>(turn.prompt.size()) + turn.stopping.max_new_tokens > room) {
    return TurnFieldError(TurnField::kMaxNewTokens,
                          absl::StrCat("the input needs ", turn.prompt.size(), " tokens and the output asks for up to ",
                                       turn.stopping.max_new_tokens, " but the session's context has ", room, " of ",
                                       s->ctx->capacity(), " left; ask for at most ",
                                       room - static_cast<int64_t>(turn.prompt.size()), " (or a shorter input)"));
  }
  if (const KvBlockCounts pool = model_->kv_blocks(); pool.block_tokens > 0) {
    // A prompt maps all its blocks at its first span (MapPromptKvLocked):
    // a block of every layer group per range, sliding groups' included.
    const int64_t bt = pool.block_tokens;
    const int64_t blocks =
        (static_cast<int64_t>(keep) + static_cast<int64_t>(turn.prompt.size()) + bt - 1) / bt * pool.groups;
    if (blocks > pool.total) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the input needs ", blocks, " KV blocks of ", bt, " tokens; the server's pool holds ", pool.total,
          " (--kv_budget_mb)"));
    }
  }
  if (keep < context) {
    // Forget the departing tail: KV rows past `keep` and carry tokens alike.
    const int32_t cached = s->ctx->cached_len();
    if (keep < cached) {
      if (absl::Status rewound = RewindLocked(s, keep); !rewound.ok()) return rewound;
    } else {
      s->carry.resize(keep - cached);
      s->recompute = std::min(s->recompute, keep - cached);
    }
    s->history.resize(keep);
    context = keep;
  }
  if (!turn.chat) {
    s->follows_conversation = false;
    s->conversation.clear();
  }
  ++s->version;
  s->turn_seq = ++turns_started_;
  s->turn =
      std::make_unique<TurnRunner>(*model_, std::move(turn), std::move(s->carry), context, accepted, s->recompute);
  s->carry.clear();
  s->recompute = 0;
  s->sink = sink;
  s->turn_started = false;
  s->end_request.reset();
  ++not_started_;
  MaybeEnqueue(s);
  return absl::OkStatus();
}

absl::Status Scheduler::Cancel(SessionId id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->closing) return absl::NotFoundError("no such session");
  Session* s = it->second.get();
  if (s->turn == nullptr) return absl::OkStatus();
  if (!s->end_request) {
    s->end_request = FinishReason::kCancelled;
    MaybeEnqueue(s);  // a turn waiting for its client ends too
  } else if (s->held) {
    // The running turn is already ending; this cancel is for the turn held
    // behind it, which then ends CANCELLED as soon as it starts.
    s->held->cancelled = true;
  }
  return absl::OkStatus();
}

void Scheduler::Close(SessionId id, absl::AnyInvocable<void()> on_released) {
  std::unique_ptr<Session> dropped;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) {
      Session* s = it->second.get();
      if (on_released) s->on_released.push_back(std::move(on_released));
      if (s->closing) return;  // released with the first Close
      s->closing = true;
      --open_;
      if (s->queued) {
        runnable_.erase(std::find(runnable_.begin(), runnable_.end(), s));
        s->queued = false;
      }
      if (s->turn != nullptr && !s->turn_started) --not_started_;
      if (s->running) return;  // the worker destroys it after its step
      dropped = TakeClosedLocked(s);
    }
  }
  if (dropped != nullptr) {
    Release(std::move(dropped));
    return;
  }
  // Unknown or already released: nothing calls its sinks any more.
  if (on_released) on_released();
}

std::unique_ptr<Scheduler::Session> Scheduler::TakeClosedLocked(Session* s) {
  auto it = sessions_.find(s->id);
  std::unique_ptr<Session> taken = std::move(it->second);
  sessions_.erase(it);
  return taken;
}

void Scheduler::Release(std::unique_ptr<Session> s) {
  std::vector<absl::AnyInvocable<void()>> callbacks = std::move(s->on_released);
  // The KV cache, the held plan and the turn go here, outside the lock.
  s.reset();
  {
    absl::MutexLock lock(&mu_);
    ++wake_gen_;  // its KV blocks are free: a waiting prompt may fit now
  }
  heap_trimmer_.Request();
  for (auto& callback : callbacks) callback();
}

void Scheduler::EventsConsumed(SessionId id, int count) {
  if (count <= 0) return;
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session* s = it->second.get();
  s->credits = std::min(std::max(1, options_.max_unconsumed_events), s->credits + count);
  MaybeEnqueue(s);
}

void Scheduler::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (auto& [id, s] : sessions_) {
    if (s->turn == nullptr || s->closing) continue;
    if (!s->end_request) s->end_request = FinishReason::kShutdown;
    MaybeEnqueue(s.get());
  }
}

EngineStats Scheduler::Stats() const {
  absl::MutexLock lock(&mu_);
  EngineStats stats;
  stats.sessions_active = open_;
  stats.turns_queued = static_cast<int64_t>(runnable_.size());
  stats.workers_busy = busy_;
  stats.workers = options_.workers;
  stats.kv_budget_bytes = options_.kv_budget_bytes;
  stats.nonfinite_logits_turns = nonfinite_logits_turns_;
  if (const KvBlockCounts pool = model_->kv_blocks(); pool.block_tokens > 0) {
    stats.kv_blocks_total = pool.total;
    stats.kv_blocks_used = pool.total - pool.free;
    stats.kv_block_tokens = pool.block_tokens;
    stats.kv_blocks_cached = pool.cached_free;
  }
  stats.kv_preemptions = kv_preemptions_;
  stats.kv_exhausted_turns = kv_exhausted_turns_;
  stats.prefix_cache_queried_tokens = prefix_queried_tokens_;
  stats.prefix_cache_hit_tokens = prefix_hit_tokens_;
  stats.turns_waiting = not_started_;
  const Clock::time_point now = Clock::now();
  for (const auto& [id, session] : sessions_) {
    if (session->turn != nullptr && session->turn_started) ++stats.turns_running;
    if (session->turn != nullptr && !session->closing && !session->running && !session->HasStep()) {
      ++stats.sessions_waiting_for_client;
    }
    if (!session->running) continue;
    stats.longest_running_step_seconds = std::max(
        stats.longest_running_step_seconds, std::chrono::duration<double>(now - session->step_started).count());
  }
  return stats;
}

void Scheduler::RecordTurn(Session* s, const TurnRunner& turn) {
  ++s->version;
  turn.AppendContextTokens(s->history);
  if (!turn.turn().chat || !s->follows_conversation) return;
  // A turn whose prompt was cut short (cancel or shutdown during prefill) is
  // not part of the conversation; the next chat turn's prefix reuse rewinds
  // the partial prompt it left.
  if (!turn.prompt_complete()) return;
  s->conversation.insert(s->conversation.end(), turn.turn().messages.begin(), turn.turn().messages.end());
  if (turn.generated() > 0) s->conversation.push_back(ChatMessage{"assistant", turn.reply_text()});
}

bool Scheduler::WorkerHasWork(WorkerWake* wake) {
  const Scheduler* self = wake->scheduler;
  self->mu_.AssertReaderHeld();
  // Queued sessions are work unless the last pick found none of them could
  // step (prompts waiting for KV blocks) and nothing has changed since.
  const bool queued_work = !self->runnable_.empty() && self->wake_gen_ != self->stalled_gen_;
  return self->stopping_ || queued_work || (*wake->holds_plans && self->open_ == 0);
}

void Scheduler::MaybeEnqueue(Session* s) {
  ++wake_gen_;  // its state changed: a waiting prompt may fit now, or it may step
  if (s->queued || s->running || !s->HasStep()) return;
  s->queued = true;
  runnable_.push_back(s);
}

absl::Status Scheduler::ReserveKvLocked(Session* s, int32_t n_tokens) {
  absl::Status reserved = s->ctx->ReserveKv(n_tokens);
  const KvBlockCounts pool = model_->kv_blocks();
  if (reserved.ok() || pool.block_tokens == 0 || !absl::IsResourceExhausted(reserved)) return reserved;
  const int64_t need = s->ctx->KvBlocksToReserve(n_tokens);
  if (need > pool.total) return reserved;  // past the context or the pool: nothing to take back
  // Whose blocks can go back: idle sessions, least recently used first, then
  // sessions whose queued turn has not started, newest turn first (they
  // would otherwise hold blocks while waiting behind this very prompt).
  std::vector<Session*> idle, unstarted;
  std::vector<const DecodeContext*> victims;
  for (const auto& [id, other] : sessions_) {
    Session* o = other.get();
    if (o == s || o->running || o->closing || o->ctx == nullptr || o->ctx->kv_blocks() == 0) continue;
    if (o->turn == nullptr) {
      idle.push_back(o);
    } else if (!o->turn_started) {
      unstarted.push_back(o);
    } else {
      continue;
    }
    victims.push_back(o->ctx.get());
  }
  // Taking blocks back that cannot make room only makes their owners
  // recompute: then nothing is taken, and the caller waits. Blocks a
  // running session also reads (a shared prefix) would stay taken, so only
  // what the pool would get back counts.
  if (pool.free + model_->KvBlocksFreedByReleasing(victims) < need) return reserved;
  std::sort(idle.begin(), idle.end(), [](const Session* a, const Session* b) { return a->idle_since < b->idle_since; });
  std::sort(unstarted.begin(), unstarted.end(),
            [](const Session* a, const Session* b) { return a->turn_seq > b->turn_seq; });
  idle.insert(idle.end(), unstarted.begin(), unstarted.end());
  for (Session* victim : idle) {
    if (model_->kv_blocks().free >= need) break;
    const int32_t cached = victim->ctx->cached_len();
    if (!victim->ctx->Rewind(0).ok()) continue;
    victim->prefix.clear();
    if (victim->turn == nullptr) {
      victim->ContextToCarry();  // the next turn prefills it again
    } else {
      // The queued turn prefills the context it had cached first.
      victim->turn->PrependRecompute(absl::MakeConstSpan(victim->history.data(), static_cast<size_t>(cached)));
    }
    ++kv_preemptions_;
  }
  return s->ctx->ReserveKv(n_tokens);
}

bool Scheduler::MapPromptKvLocked(Session* s) {
  // Prefix caching: a context that starts empty maps the cached blocks its
  // tokens start with (whole blocks, one token short of the end, so the
  // last is computed for its logits). Prompt logprobs need every row
  // computed.
  int32_t hit = 0;
  const bool lookup = PrefixCaching() && !s->turn_started && s->ctx->cached_len() == 0 &&
                      s->ctx->kv_blocks() == 0 && !s->turn->turn().prompt_logprobs;
  if (lookup) {
    const absl::Span<const int32_t> tokens = s->turn->prefill_tokens();
    hit = model_->AdoptCachedPrefix(*s->ctx, tokens.first(tokens.size() - 1), &s->prefix);
    if (hit > 0) s->turn->SkipCachedPrefill(hit);
  }
  if (!ReserveKvLocked(s, s->turn->PrefillRemaining()).ok()) {
    if (hit > 0) {
      // It waits without them (they stay cached) and looks them up again.
      s->turn->SkipCachedPrefill(0);
      s->ctx->Rewind(0).IgnoreError();
      s->prefix.clear();
    }
    return false;
  }
  if (lookup) {
    prefix_queried_tokens_ += static_cast<int64_t>(s->turn->prefill_tokens().size());
    prefix_hit_tokens_ += hit;
  }
  return true;
}

absl::Status Scheduler::RewindLocked(Session* s, int32_t len) {
  const int32_t bt = model_->kv_blocks().block_tokens;
  int32_t to = len;
  if (bt > 0 && len % bt != 0 && static_cast<size_t>(len / bt) < s->prefix.size()) to = len / bt * bt;
  // Where sliding-window layers gave back blocks `to` would read, the whole
  // context is recomputed.
  to = s->ctx->RewindableTo(to);
  if (absl::Status rewound = s->ctx->Rewind(to); !rewound.ok()) return rewound;
  if (bt > 0 && s->prefix.size() > static_cast<size_t>(to / bt)) s->prefix.resize(static_cast<size_t>(to / bt));
  s->carry.assign(s->history.begin() + to, s->history.begin() + len);
  s->recompute = len - to;
  return absl::OkStatus();
}

void Scheduler::CacheFullBlocksLocked(Session* s, const TurnRunner& turn) {
  const int32_t bt = model_->kv_blocks().block_tokens;
  const size_t cached = static_cast<size_t>(s->ctx->cached_len());
  const size_t full = cached / static_cast<size_t>(bt);
  const size_t fed = turn.fed_tokens();
  if (full <= s->prefix.size() || fed > cached) return;
  // KV positions before `base` hold the context the turn began with; the
  // rest are the turn's.
  const size_t base = cached - fed;
  if (base > s->history.size()) return;
  std::vector<int32_t> tokens;
  for (size_t pos = s->prefix.size() * static_cast<size_t>(bt); pos < full * static_cast<size_t>(bt); ++pos) {
    tokens.push_back(pos < base ? s->history[pos] : turn.FedToken(pos - base));
  }
  model_->CachePrefix(*s->ctx, tokens, &s->prefix);
}

void Scheduler::ReserveDecodeRowsLocked(std::vector<Picked>& rows) {
  // Each decode row's block before any prompt takes more: a decoding session
  // goes first for KV as for the step's rows.
  for (Picked& p : rows) {
    if (!p.kv_refused.ok()) continue;  // gave its blocks up below
    absl::Status reserved = ReserveKvLocked(p.session, 1);
    while (!reserved.ok()) {
      // The newest turn among the rows still in the step gives its blocks
      // up (vLLM preempts the newest too), so older turns finish instead of
      // every session of a batch running dry together.
      Picked* newest = &p;
      for (Picked& q : rows) {
        if (q.kv_refused.ok() && q.session->turn_seq > newest->session->turn_seq) newest = &q;
      }
      newest->kv_refused = absl::ResourceExhaustedError(absl::StrCat(
          "the KV pool ran out of blocks while this turn decoded (", reserved.message(),
          "); the newest turn gives its blocks to the older ones (--kv_budget_mb)"));
      ++kv_exhausted_turns_;
      // Its context becomes carry when its turn ends (FinishStep); its
      // blocks go back now, before this step runs.
      newest->kv_released = newest->session->ctx->Rewind(0).ok();
      newest->session->prefix.clear();
      if (newest == &p) break;
      reserved = ReserveKvLocked(p.session, 1);
    }
  }
}

bool Scheduler::DecodeReady(const Session* s) const {
  return !s->end_request && s->turn->PendingDecodeToken().has_value();
}

void Scheduler::PickLocked(std::vector<Picked>& picked) {
  auto first = runnable_.begin();
  auto take = [&](std::deque<Session*>::iterator it, int32_t span_tokens = 0) {
    Session* s = *it;
    s->queued = false;
    s->running = true;
    s->step_started = Clock::now();
    if (!s->turn_started) {
      s->turn_started = true;
      --not_started_;
    }
    picked.push_back(Picked{s, s->turn.get(), s->sink, s->end_request, span_tokens});
    return runnable_.erase(it);
  };
  const size_t max_batch = static_cast<size_t>(MaxBatch());
  if (const int32_t budget = MaxStepTokens(); budget > 0) {
    // A turn asked to end ends in a step of its own (no model call) wherever
    // it waits: a cancel never waits behind the mixed steps of those queued
    // ahead of it.
    for (auto it = runnable_.begin(); it != runnable_.end(); ++it) {
      if ((*it)->end_request) {
        take(it);
        return;
      }
    }
    // Decode rows first, so a decoding session waits at most one step
    // whatever arrives; prompts share what the budget leaves.
    size_t decode_rows = 0;
    for (auto it = runnable_.begin(); it != runnable_.end() && decode_rows < max_batch;) {
      if (!DecodeReady(*it)) {
        ++it;
        continue;
      }
      it = take(it);
      ++decode_rows;
    }
    if (model_->kv_blocks().block_tokens > 0) ReserveDecodeRowsLocked(picked);
    int32_t left = budget - static_cast<int32_t>(decode_rows);
    // Every row of a prompt-logprobs span is an output row ([n, vocab]
    // logits): no more of them per step, over all its spans, than one D1
    // chunk computes, so a held plan's logits stay as small as D1's were.
    int32_t all_rows_left = kMaxPrefillChunk;
    bool kv_blocked = false;  // a prompt waits for KV blocks
    for (auto it = runnable_.begin(); it != runnable_.end() && left > 0;) {
      const Session* s = *it;
      const bool all_rows = s->turn->turn().prompt_logprobs;
      if (s->turn->PrefillRemaining() == 0 || (all_rows && all_rows_left == 0)) {
        ++it;
        continue;
      }
      // A prompt maps its whole prompt's blocks at its first span, so it
      // never stalls half-prefilled; one that cannot waits, and so do the
      // new prompts behind it (first come, first served). Prompts whose
      // blocks are mapped already go on past it: they hold blocks, and
      // finishing is how they give them back.
      // (Mapped means positions: the blocks a context holds are summed over
      // its layer groups and cannot say which positions they cover.)
      if (model_->kv_blocks().block_tokens > 0) {
        const bool mapped =
            static_cast<int64_t>(s->ctx->cached_len()) + s->turn->PrefillRemaining() <= s->ctx->kv_mapped_len();
        if (!mapped && (kv_blocked || !MapPromptKvLocked(*it))) {
          kv_blocked = true;
          ++it;
          continue;
        }
      }
      int32_t n = std::min(left, s->turn->PrefillRemaining());
      if (all_rows) {
        n = std::min(n, all_rows_left);
        all_rows_left -= n;
      }
      left -= n;
      it = take(it, n);
    }
    return;
  }
  const bool batch = DecodeReady(*first);
  take(first);
  if (!batch) return;
  // Continuous batching: every other session waiting to decode joins this
  // step, in queue order, up to max_batch.
  for (auto it = runnable_.begin(); it != runnable_.end() && picked.size() < max_batch;) {
    it = DecodeReady(*it) ? take(it) : it + 1;
  }
}

void Scheduler::WorkerLoop() {
  std::unique_ptr<Executor> executor = options_.make_executor();
  // The worker's held decode plans, one per batch-size bucket. A model that
  // cannot make them gets ServingModel's one-context-at-a-time decoder.
  absl::StatusOr<std::unique_ptr<BatchDecoder>> made = model_->NewBatchDecoder(MaxBatch(), MaxStepTokens());
  if (!made.ok()) made = model_->ServingModel::NewBatchDecoder(MaxBatch(), MaxStepTokens());
  std::unique_ptr<BatchDecoder> decoder = *std::move(made);
  bool holds_plans = false;
  std::vector<Picked> picked;
  std::vector<StepOutput> outs;
  std::vector<DecodeContext*> contexts;
  std::vector<int32_t> tokens;
  for (;;) {
    picked.clear();
    bool others_waiting = false;
    {
      absl::MutexLock lock(&mu_);
      WorkerWake wake{this, &holds_plans};
      mu_.Await(absl::Condition(&Scheduler::WorkerHasWork, &wake));
      if (stopping_) return;
      if (!runnable_.empty()) {
        PickLocked(picked);
        if (!picked.empty()) busy_ += 1;
        others_waiting = !runnable_.empty();
        // Nothing queued can step (its prompts wait for KV blocks): sleep
        // until a step ends, a session goes or one is queued.
        if (picked.empty()) stalled_gen_ = wake_gen_;
      }
    }
    if (picked.empty()) {
      if (others_waiting) continue;
      // No session is open: give the plans' memory and bindings back; they
      // are rebuilt by the next decode step.
      decoder->Release();
      holds_plans = false;
      heap_trimmer_.Request();
      continue;
    }

    // Step: end a turn asked to end, run a mixed step, a prefill chunk, or
    // one decode step for every picked session at once.
    outs.assign(picked.size(), StepOutput{});
    const Picked& p0 = picked.front();
    if (MaxStepTokens() > 0 && !p0.end_request) {
      RunMixedStep(picked, *decoder, *executor, outs);
      holds_plans = decoder->bound_nodes() > 0;
    } else if (picked.size() == 1 && (p0.end_request || !p0.turn->PendingDecodeToken())) {
      if (p0.end_request) {
        outs[0].end = p0.turn->End(*p0.end_request);
      } else {
        outs[0] = p0.turn->Step(*p0.session->ctx, *executor, PrefillChunk(others_waiting));
        if (options_.on_step && outs[0].seconds > 0) {
          options_.on_step(StepInfo{outs[0].prefill, outs[0].seconds, outs[0].fed, outs[0].prefill ? 0 : 1});
        }
      }
    } else {
      contexts.clear();
      tokens.clear();
      for (const Picked& p : picked) {
        contexts.push_back(p.session->ctx.get());
        tokens.push_back(*p.turn->PendingDecodeToken());
      }
      const Clock::time_point start = Clock::now();
      absl::StatusOr<absl::Span<const float>> logits = decoder->Decode(contexts, tokens, *executor);
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (logits.ok() || picked.size() == 1) {
        const size_t vocab = picked.size() == 1 || !logits.ok() ? 0 : logits->size() / picked.size();
        // Each turn samples its own row (its sampler, stop rules and text
        // decoder are its own): spread over the worker's threads.
        executor->ParallelFor(static_cast<int64_t>(picked.size()), [&](int64_t i) {
          const size_t k = static_cast<size_t>(i);
          absl::StatusOr<absl::Span<const float>> row =
              logits.ok() ? absl::StatusOr<absl::Span<const float>>(
                                picked.size() == 1 ? *logits : logits->subspan(k * vocab, vocab))
                          : logits.status();
          outs[k] = picked[k].turn->FinishDecode(std::move(row), seconds, *contexts[k]);
        });
        const auto rows = static_cast<int32_t>(picked.size());
        if (options_.on_step) options_.on_step(StepInfo{false, seconds, rows, rows});
      } else {
        // A batched step refuses as a whole (nothing is written): step each
        // session alone so the error lands on the session it belongs to.
        for (size_t i = 0; i < picked.size(); ++i) {
          outs[i] = picked[i].turn->Step(*contexts[i], *executor);
          if (options_.on_step && outs[i].seconds > 0) options_.on_step(StepInfo{false, outs[i].seconds, 1, 1});
        }
      }
      holds_plans = decoder->bound_nodes() > 0;
    }
    ReportDeviceLoss(outs);
    for (size_t i = 0; i < picked.size(); ++i) FinishStep(picked[i], std::move(outs[i]));
    {
      absl::MutexLock lock(&mu_);
      busy_ -= 1;
    }
  }
}

void Scheduler::RunMixedStep(const std::vector<Picked>& picked, BatchDecoder& decoder, Executor& executor,
                             std::vector<StepOutput>& outs) {
  // The step's spans: every picked session but those the KV pool refused,
  // whose turns end here.
  std::vector<size_t> live;  // indices into picked (and outs)
  for (size_t i = 0; i < picked.size(); ++i) {
    const Picked& p = picked[i];
    if (p.kv_refused.ok()) {
      live.push_back(i);
    } else {
      outs[i] = p.turn->FinishDecode(p.kv_refused, 0, *p.session->ctx);
    }
  }
  const size_t n = live.size();
  if (n == 0) return;
  std::vector<int32_t> decode_tokens(n);  // a decode row's token (a span points at it)
  std::vector<StepSpan> spans(n);
  StepInfo info;
  for (size_t k = 0; k < n; ++k) {
    const Picked& p = picked[live[k]];
    spans[k].context = p.session->ctx.get();
    if (p.span_tokens > 0) {
      spans[k].tokens = p.turn->NextPrefill(p.span_tokens);
      spans[k].logits = p.turn->PrefillLogits(p.span_tokens);
      info.prefill = true;
    } else {
      decode_tokens[k] = *p.turn->PendingDecodeToken();
      spans[k].tokens = absl::MakeConstSpan(&decode_tokens[k], 1);
      spans[k].logits = SpanLogits::kLast;
      ++info.decode_rows;
    }
    info.tokens += static_cast<int32_t>(spans[k].tokens.size());
  }
  // Rows of the step's logits that belong to span k.
  auto rows_of = [&](size_t k) -> size_t {
    switch (spans[k].logits) {
      case SpanLogits::kNone: return 0;
      case SpanLogits::kLast: return 1;
      case SpanLogits::kAll: return spans[k].tokens.size();
    }
    return 0;
  };
  auto finish = [&](size_t k, absl::StatusOr<absl::Span<const float>> rows, double seconds) {
    const Picked& p = picked[live[k]];
    outs[live[k]] = p.span_tokens > 0
                        ? p.turn->FinishPrefill(p.span_tokens, std::move(rows), seconds, *spans[k].context)
                        : p.turn->FinishDecode(std::move(rows), seconds, *spans[k].context);
  };

  const Clock::time_point start = Clock::now();
  absl::StatusOr<absl::Span<const float>> logits = decoder.Step(spans, executor);
  info.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (logits.ok() || n == 1) {
    const size_t vocab = static_cast<size_t>(model_->vocab_size());
    std::vector<size_t> first_row(n, 0);
    for (size_t k = 1; k < n; ++k) first_row[k] = first_row[k - 1] + rows_of(k - 1);
    // Each turn samples its own row (its sampler, stop rules and text
    // decoder are its own): spread over the worker's threads.
    executor.ParallelFor(static_cast<int64_t>(n), [&](int64_t j) {
      const size_t k = static_cast<size_t>(j);
      absl::StatusOr<absl::Span<const float>> rows =
          logits.ok() ? absl::StatusOr<absl::Span<const float>>(
                            logits->subspan(first_row[k] * vocab, rows_of(k) * vocab))
                      : logits.status();
      finish(k, std::move(rows), info.seconds);
    });
    if (options_.on_step) options_.on_step(info);
    return;
  }
  // A step refuses as a whole (nothing is written): step each span alone so
  // the error lands on the session it belongs to, through the same plans.
  for (size_t k = 0; k < n; ++k) {
    const Clock::time_point alone = Clock::now();
    absl::StatusOr<absl::Span<const float>> rows = decoder.Step(absl::MakeConstSpan(&spans[k], 1), executor);
    const double seconds = std::chrono::duration<double>(Clock::now() - alone).count();
    finish(k, std::move(rows), seconds);
    if (options_.on_step) {
      const bool prefill = picked[live[k]].span_tokens > 0;
      options_.on_step(StepInfo{prefill, seconds, static_cast<int32_t>(spans[k].tokens.size()), prefill ? 0 : 1});
    }
  }
}

int32_t Scheduler::PrefillChunk(bool others_waiting) const {
  // Where a chunk's size changes its results, a load-dependent size would
  // make a session's tokens depend on the other sessions: every chunk is the
  // largest then, and the fairness bound is one such chunk.
  if (!others_waiting || model_->prefill_depends_on_chunk_rows()) return kMaxPrefillChunk;
  return kSharedPrefillChunk;
}

void Scheduler::ReportDeviceLoss(const std::vector<StepOutput>& outs) {
  if (!options_.on_device_lost) return;
  const bool failed = std::any_of(outs.begin(), outs.end(), [](const StepOutput& o) {
    return o.end.has_value() && o.end->reason == FinishReason::kError;
  });
  if (!failed) return;
  // Only a failed step can be the one that lost the device, so health is
  // asked only then (it is cheap, but a step is the hot path).
  absl::Status health = model_->health();
  if (health.ok() || device_loss_reported_.exchange(true)) return;
  options_.on_device_lost(health);
}

void Scheduler::FinishStep(const Picked& p, StepOutput out) {
  Session* s = p.session;
  TurnRunner* turn = p.turn;
  TurnSink* sink = p.sink;
  // The session is idle for new turns before its end event goes out, so a
  // client that answers the TurnEnd at once is never refused. A turn held
  // behind a cancelled one starts now, from the context the cancel left.
  std::unique_ptr<TurnRunner> finished;
  TurnSink* refused_sink = nullptr;
  TurnEnd refused;
  {
    absl::MutexLock lock(&mu_);
    // Spent before the events go out: the client may consume them (and
    // give the credit back) before this worker is done emitting.
    s->credits -= static_cast<int>(out.tokens.size());
    if (PrefixCaching() && !p.kv_released) CacheFullBlocksLocked(s, *turn);
    if (out.end) {
      if (out.nonfinite_logits) ++nonfinite_logits_turns_;
      s->recompute = turn->UnfedRecompute();
      s->carry = turn->TakeCarry();
      RecordTurn(s, *turn);
      // Blocks mapped for a prompt the turn did not finish go back.
      s->ctx->Rewind(s->ctx->cached_len()).IgnoreError();
      // A turn that gave its blocks up: its whole context is recomputed by
      // the session's next turn.
      if (p.kv_released) s->ContextToCarry();
      s->idle_since = Clock::now();
      finished = std::move(s->turn);
      s->sink = nullptr;
      s->end_request.reset();
      if (std::optional<Session::Held> held = std::exchange(s->held, std::nullopt); held && !s->closing) {
        absl::Status started = shutting_down_ ? absl::UnavailableError("the server is shutting down")
                                              : StartTurn(s, std::move(held->turn), held->sink, held->accepted);
        if (started.ok() && held->cancelled) {
          s->end_request = FinishReason::kCancelled;
        } else if (!started.ok()) {
          refused_sink = held->sink;
          refused.reason = FinishReason::kError;
          refused.error = std::move(started);
        }
      }
    }
  }

  // Emit its events. `running` still holds the session: no other worker can
  // pick it and it cannot be destroyed, so the sink calls of one session
  // never overlap and never outlive it.
  for (const TokenEvent& event : out.tokens) sink->OnToken(event);
  if (out.end) sink->OnTurnEnd(*out.end);
  if (refused_sink != nullptr) refused_sink->OnTurnEnd(refused);
  finished.reset();

  std::unique_ptr<Session> dropped;
  {
    absl::MutexLock lock(&mu_);
    s->running = false;
    ++wake_gen_;  // the step freed blocks, or the session steps again
    if (s->closing) {
      dropped = TakeClosedLocked(s);
    } else {
      MaybeEnqueue(s);
    }
  }
  if (dropped != nullptr) Release(std::move(dropped));
}

}  // namespace decoded::serving
