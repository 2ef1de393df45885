// The Engine facade over the real model: tokenization of turn input, the
// warm-up, and the adapter that shows Model + Tokenizer to the scheduler.
#include "engine/serving/engine.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/backend.h"
#include "engine/cpu_isa.h"
#include "engine/runtime.h"
#include "engine/serving/scheduler.h"
#include "engine/serving/serving_model.h"
#include "engine/serving/turn_field.h"
#include "engine/serving/turn_runner.h"
#include "engine/tokenizer/utf8.h"

namespace decoded::serving {
namespace {

class DetokenizerText final : public TextDecoder {
 public:
  explicit DetokenizerText(const Tokenizer* tokenizer) : detok_(tokenizer) {}
  std::string Push(int32_t id) override { return detok_.Push(id); }
  std::string Flush() override { return detok_.Flush(); }

 private:
  IncrementalDetokenizer detok_;
};

class RealServingModel final : public ServingModel {
 public:
  RealServingModel(std::shared_ptr<const Model> model, std::shared_ptr<KvPool> pool,
                   bool parse_special_in_chat_content)
      : model_(std::move(model)), pool_(std::move(pool)),
        parse_special_in_chat_content_(parse_special_in_chat_content) {}
  int32_t vocab_size() const override { return model_->tokenizer().vocab_size(); }
  bool IsEndOfGeneration(int32_t id) const override { return model_->tokenizer().IsEndOfGeneration(id); }
  std::unique_ptr<TextDecoder> NewTextDecoder() const override {
    return std::make_unique<DetokenizerText>(&model_->tokenizer());
  }
  absl::StatusOr<std::unique_ptr<DecodeContext>> NewContext(int32_t max_seq_len) const override {
    return model_->NewContext(max_seq_len, pool_);
  }
  absl::StatusOr<std::vector<int32_t>> EncodeConversation(absl::Span<const ChatMessage> messages) const override {
    return model_->tokenizer().EncodeChat(messages, /*add_generation_prompt=*/true, parse_special_in_chat_content_);
  }
  int32_t bos_id() const override { return model_->tokenizer().bos_id(); }
  absl::StatusOr<std::unique_ptr<BatchDecoder>> NewBatchDecoder(int32_t max_batch,
                                                                int32_t max_step_tokens) const override {
    return model_->NewBatchDecoder(max_batch, max_step_tokens);
  }
  absl::Status health() const override { return model_->backend().health(); }
  bool prefill_depends_on_chunk_rows() const override { return model_->backend().prefill_depends_on_chunk_rows(); }
  void TrimKv() const override {
    if (pool_ != nullptr) pool_->Trim();
  }
  KvBlockCounts kv_blocks() const override {
    if (pool_ == nullptr) return {};
    return KvBlockCounts{pool_->block_tokens(), pool_->groups().n_groups(), pool_->n_blocks(), pool_->free_blocks(),
                         pool_->cached_free_blocks()};
  }
  int32_t KvBlocksFreedByReleasing(absl::Span<const DecodeContext* const> contexts) const override {
    if (pool_ == nullptr) return ServingModel::KvBlocksFreedByReleasing(contexts);
    std::vector<int32_t> blocks;
    for (const DecodeContext* c : contexts) {
      for (int32_t i = 0; i < c->kv_blocks(); ++i) blocks.push_back(c->kv_block(i));
    }
    return pool_->FreedByGiving(blocks);
  }
  int32_t AdoptCachedPrefix(DecodeContext& ctx, absl::Span<const int32_t> tokens, PrefixChain* chain) const override {
    if (pool_ == nullptr) return 0;
    PrefixChain found;
    pool_->LookupPrefix(tokens, &found);
    if (found.empty()) return 0;
    std::vector<int32_t> blocks, taken;
    for (const KvPool::PrefixBlock& range : found) {
      for (const int32_t b : range.blocks) {
        blocks.push_back(b);
        if (b >= 0) taken.push_back(b);
      }
    }
    if (!ctx.AdoptKvBlocks(blocks).ok()) {
      pool_->Give(taken);
      return 0;
    }
    chain->insert(chain->end(), found.begin(), found.end());
    return static_cast<int32_t>(found.size()) * pool_->block_tokens();
  }
  void CachePrefix(const DecodeContext& ctx, absl::Span<const int32_t> tokens, PrefixChain* chain) const override {
    if (pool_ == nullptr) return;
    const size_t bt = static_cast<size_t>(pool_->block_tokens());
    const KvGroups& groups = pool_->groups();
    std::vector<int32_t> blocks(static_cast<size_t>(groups.n_groups()));
    for (size_t start = 0; start + bt <= tokens.size(); start += bt) {
      const int32_t range = static_cast<int32_t>(chain->size());
      for (int32_t g = 0; g < groups.n_groups(); ++g) {
        blocks[static_cast<size_t>(g)] = ctx.kv_range_block(g, range);
        // A full-attention group holds every range; without it the range
        // cannot be matched (a sliding group's may be gone already).
        if (blocks[static_cast<size_t>(g)] < 0 && !groups.sliding(g)) return;
      }
      const KvPool::PrefixBlock parent = chain->empty() ? KvPool::PrefixBlock{} : chain->back();
      chain->push_back(pool_->RegisterPrefix(blocks, parent, tokens.subspan(start, bt)));
    }
  }
  const Model& model() const { return *model_; }

 private:
  std::shared_ptr<const Model> model_;
  std::shared_ptr<KvPool> pool_;  // null: contiguous caches
  const bool parse_special_in_chat_content_;
};

// "model" is accepted as Gemma's spelling of "assistant"; templates see the
// common role names only.
absl::Status NormalizeRoles(std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string& role = messages[i].role;
    if (role == "model") role = "assistant";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return TurnFieldError(TurnField::kInput, absl::StrCat("messages[", i, "]: unknown role \"", ToValidUtf8(role),
                                                            "\" (expected system, user, assistant, model or tool)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckEngineOptions(const EngineOptions& o) {
  if (o.workers < 1) return absl::InvalidArgumentError("workers must be >= 1");
  if (o.threads_per_worker < 1) return absl::InvalidArgumentError("threads_per_worker must be >= 1");
  if (o.max_sessions < 1) return absl::InvalidArgumentError("max_sessions must be >= 1");
  if (o.max_queued < 1) return absl::InvalidArgumentError("max_queued must be >= 1");
  if (o.context_length < 1) return absl::InvalidArgumentError("context_length must be >= 1");
  if (o.kv_budget_bytes < -1) return absl::InvalidArgumentError("kv_budget_bytes must be >= -1");
  if (o.kv_block_tokens < 0 || o.kv_block_tokens > kMaxKvBlockTokens) {
    return absl::InvalidArgumentError(absl::StrCat("kv_block_tokens must be in [0, ", kMaxKvBlockTokens, "]"));
  }
  if (o.max_unconsumed_events < 1) return absl::InvalidArgumentError("max_unconsumed_events must be >= 1");
  if (o.max_batch < 1 || o.max_batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch must be in [1, ", kMaxBatch, "]"));
  }
  if (o.max_step_tokens != 0 && (o.max_step_tokens <= o.max_batch || o.max_step_tokens > kMaxStepTokens)) {
    return absl::InvalidArgumentError(absl::StrCat("max_step_tokens must be 0 or in (max_batch = ", o.max_batch,
                                                   ", ", kMaxStepTokens, "]"));
  }
  if (o.limits.max_text_bytes < 1 || o.limits.max_chat_messages < 1 || o.limits.max_token_ids < 1 ||
      o.limits.max_stop_sequences < 0) {
    return absl::InvalidArgumentError(
        "max_text_bytes, max_chat_messages and max_token_ids must be >= 1, max_stop_sequences >= 0");
  }
  return absl::OkStatus();
}

namespace {

// One Prefill and two Decode steps on a scratch context, so the first client
// does not pay for first-touch page faults of the weights and lazy set-up.
absl::Status WarmUp(const Model& model, Executor& executor) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<int32_t> prompt = tok.Encode("Hello", /*add_bos=*/true, /*parse_special=*/false);
  if (prompt.empty()) prompt.push_back(std::max(0, tok.bos_id()));
  const int32_t len = std::min<int32_t>(model.info().context_length, static_cast<int32_t>(prompt.size()) + 2);
  absl::StatusOr<std::unique_ptr<DecodeContext>> ctx = model.NewContext(len);
  if (!ctx.ok()) return ctx.status();
  absl::StatusOr<absl::Span<const float>> logits = (*ctx)->Prefill(prompt, false, executor);
  if (!logits.ok()) return logits.status();
  for (int i = 0; i < 2 && (*ctx)->cached_len() < (*ctx)->capacity(); ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    logits = (*ctx)->Decode(next, executor);
    if (!logits.ok()) return logits.status();
  }
  return absl::OkStatus();
}

// EngineOptions::kv_budget_bytes made concrete for `backend` once the model
// is loaded and warmed up.
absl::StatusOr<int64_t> ResolveKvBudget(int64_t requested, const Backend& backend) {
  const int64_t capacity = backend.memory_capacity_bytes();
  if (capacity == 0) {
    if (requested >= 0) return requested;
    const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    return physical / 4 * 3;
  }
  const int64_t left = std::max<int64_t>(0, capacity - backend.allocated_bytes());
  if (requested < 0) return left / 4 * 3;
  if (requested == 0 || requested <= left) return requested;
  return absl::ResourceExhaustedError(absl::StrCat(
      "a KV budget of ", requested >> 20, " MiB does not fit ", backend.device_name(), ": its ", capacity >> 20,
      " MiB of memory hold ", backend.allocated_bytes() >> 20, " MiB of weights and buffers, leaving ", left >> 20,
      " MiB"));
}

namespace {

// The pool of paged KV: as many blocks as the budget holds, and no more than
// every session at its full context needs (more could never be used). A
// budget of 0 (no limit) is the latter. On the CPU the pool's pages are
// committed as blocks are first written, so an idle pool costs no memory.
absl::StatusOr<std::shared_ptr<KvPool>> MakeKvPool(const Model& model, const EngineOptions& options,
                                                   int32_t session_len, int64_t session_kv_bytes,
                                                   int64_t kv_budget_bytes) {
  const int32_t bt = options.kv_block_tokens;
  // A block holds one layer group's positions (engine/kv_groups.h): a
  // position range takes a block of each group.
  absl::StatusOr<std::shared_ptr<KvPool>> probe = model.NewKvPool(bt, 1);
  if (!probe.ok()) return probe.status();
  const int64_t groups = (*probe)->groups().n_groups();
  const int64_t block_bytes = (*probe)->block_bytes();
  probe->reset();
  const int64_t per_session = (session_len + bt - 1) / bt * groups;
  int64_t n_blocks = std::min<int64_t>(per_session * options.max_sessions, std::numeric_limits<int32_t>::max());
  if (kv_budget_bytes > 0) n_blocks = std::min(n_blocks, kv_budget_bytes / block_bytes);
  if (n_blocks < 1) {
    return absl::ResourceExhaustedError(absl::StrCat("a KV budget of ", kv_budget_bytes, " bytes holds no block of ",
                                                     bt, " tokens (", block_bytes, " bytes)"));
  }
  return model.NewKvPool(bt, static_cast<int32_t>(n_blocks));
}

}  // namespace

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::unique_ptr<RealServingModel> model, const EngineOptions& options, int32_t session_len,
             int64_t session_kv_bytes, int64_t kv_budget_bytes, std::shared_ptr<std::atomic<int>> lent_threads,
             std::vector<std::unique_ptr<Executor>> executors)
      : model_(std::move(model)), limits_(options.limits), executors_(std::move(executors)),
        lent_threads_(std::move(lent_threads)) {
    const decoded::ModelInfo& mi = model_->model().info();
    const Tokenizer& tok = model_->model().tokenizer();
    // general.name is file data, taken as is; clients receive it as a proto string.
    info_.family = mi.family;
    info_.name = ToValidUtf8(mi.name);
    info_.context_length = mi.context_length;
    info_.vocab_size = mi.vocab_size;
    info_.n_layers = mi.n_layers;
    info_.hidden_size = mi.hidden_size;
    info_.sliding_window = mi.sliding_window;
    info_.weight_dtype = mi.file_type.empty() ? mi.weight_dtype : mi.file_type;
    info_.tensor_dtype = mi.weight_dtype;
    info_.backend = mi.backend;
    info_.device = mi.device;
    if (info_.backend == "cpu") info_.cpu_isa = CpuIsaName(ActiveCpuIsa());
    info_.session_context_length = session_len;
    info_.session_kv_bytes = session_kv_bytes;
    info_.kv_type = mi.kv_type;
    info_.max_sessions = options.max_sessions;
    info_.bos_id = tok.bos_id();
    info_.eos_id = tok.eos_id();
    info_.tokenizer = tok.model() == "gpt2" ? "byte_level_bpe" : "sentencepiece";
    info_.pre_tokenizer = tok.pre_tokenizer();
    info_.chat_template = ToValidUtf8(tok.chat_template());
    info_.chat_template_error = ToValidUtf8(std::string(tok.chat_template_status().message()));
    info_.end_of_generation_ids = tok.end_of_generation_ids();
    // The longest text a turn can need: every token spells at most this many
    // bytes, so longer input cannot fit a session's context whatever it says,
    // and is refused before the tokenizer spends time on it.
    int64_t max_token_bytes = 1;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      max_token_bytes = std::max<int64_t>(max_token_bytes, tok.TokenBytes(id, /*render_special=*/true).size());
    }
    max_input_bytes_ = max_token_bytes * session_len;
    SchedulerOptions so;
    so.workers = options.workers;
    so.max_sessions = options.max_sessions;
    so.max_queued = options.max_queued;
    so.context_length = session_len;
    so.kv_budget_bytes = kv_budget_bytes;
    so.max_unconsumed_events = options.max_unconsumed_events;
    // Made by Create (so a device that cannot give one fails there); each
    // worker takes one as it starts.
    so.make_executor = [this] {
      absl::MutexLock lock(&executors_mu_);
      std::unique_ptr<Executor> e = std::move(executors_.back());
      executors_.pop_back();
      return e;
    };
    so.max_batch = options.max_batch;
    so.max_step_tokens = options.max_step_tokens;
    so.prefix_cache = options.prefix_cache;
    so.on_step = options.on_step;
    so.on_device_lost = options.on_device_lost;
    scheduler_ = std::make_unique<Scheduler>(model_.get(), std::move(so));
  }

  absl::StatusOr<SessionId> OpenSession() override {
    // A lost device runs nothing again: refuse rather than fail at the first step.
    if (absl::Status health = model_->model().backend().health(); !health.ok()) return health;
    return scheduler_->Open();
  }

  absl::Status SubmitTurn(SessionId session, const TurnRequest& turn, TurnSink* sink) override {
    const Tokenizer& tok = model_->model().tokenizer();
    if (absl::Status s = CheckInputSize(turn); !s.ok()) return s;
    PreparedTurn prepared;
    // Text and chat input are encoded without BOS: the scheduler prepends it
    // when the turn opens an empty context.
    switch (turn.kind) {
      case TurnRequest::InputKind::kText: {
        if (turn.text.empty()) return TurnFieldError(TurnField::kInput, "the turn's text is empty");
        const ThreadLoan loan(lent_threads_.get(), turn.text.size() >= kLoanBytes);
        prepared.prompt = tok.Encode(turn.text, /*add_bos=*/false, /*parse_special=*/true);
        prepared.bos_id = tok.prompt_bos_id();
        break;
      }
      case TurnRequest::InputKind::kMessages: {
        if (turn.messages.empty()) return TurnFieldError(TurnField::kInput, "the turn has no messages");
        // Text and token turns keep working on a model whose template is
        // missing or beyond the renderer; chat turns say why they cannot.
        if (absl::Status usable = tok.chat_template_status(); !usable.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("this model cannot serve chat turns: ", usable.message()));
        }
        // Rendered when the turn starts, with the session's whole conversation.
        prepared.chat = true;
        prepared.messages = turn.messages;
        if (absl::Status s = NormalizeRoles(prepared.messages); !s.ok()) return s;
        break;
      }
      case TurnRequest::InputKind::kTokens:
        prepared.prompt = turn.tokens;
        break;
    }
    prepared.sampling = turn.sampling;
    prepared.stopping = turn.stopping;
    prepared.prompt_logprobs = turn.prompt_logprobs;
    return scheduler_->Submit(session, std::move(prepared), sink);
  }

  absl::Status CancelTurn(SessionId session) override { return scheduler_->Cancel(session); }
  void CloseSession(SessionId session, absl::AnyInvocable<void()> on_released) override {
    scheduler_->Close(session, std::move(on_released));
  }
  void EventsConsumed(SessionId session, int count) override { scheduler_->EventsConsumed(session, count); }
  void BeginShutdown() override { scheduler_->BeginShutdown(); }

  absl::StatusOr<std::vector<int32_t>> Tokenize(std::string_view text, bool add_bos,
                                                bool parse_special) const override {
    if (static_cast<int64_t>(text.size()) > limits_.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("text has ", text.size(), " bytes, over the server's limit of ",
                                                     limits_.max_text_bytes, " (max_text_bytes)"));
    }
    const ThreadLoan loan(lent_threads_.get(), text.size() >= kLoanBytes);
    return model_->model().tokenizer().Encode(text, add_bos, parse_special);
  }

  absl::StatusOr<std::string> Detokenize(absl::Span<const int32_t> ids, bool render_special) const override {
    if (static_cast<int64_t>(ids.size()) > limits_.max_token_ids) {
      return absl::InvalidArgumentError(absl::StrCat(ids.size(), " ids, over the server's limit of ",
                                                     limits_.max_token_ids, " (max_token_ids)"));
    }
    const ThreadLoan loan(lent_threads_.get(), ids.size() >= kLoanIds);
    // Valid UTF-8 (a protobuf string must be), by the same rule as streamed text.
    absl::StatusOr<std::string> text = model_->model().tokenizer().Detokenize(ids, render_special);
    if (text.ok() && static_cast<int64_t>(text->size()) > limits_.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the text of these ids has ", text->size(),
                                                     " bytes, over the server's limit of ", limits_.max_text_bytes,
                                                     " (max_text_bytes)"));
    }
    return text;
  }

  absl::StatusOr<std::vector<std::string>> DetokenizePieces(absl::Span<const int32_t> ids) const override {
    // Detokenize checks the ids and the limits (and its text is what the
    // pieces add up to).
    absl::StatusOr<std::string> whole = Detokenize(ids, /*render_special=*/false);
    if (!whole.ok()) return whole.status();
    IncrementalDetokenizer pieces(&model_->model().tokenizer(), /*render_special=*/false);
    std::vector<std::string> out;
    out.reserve(ids.size());
    for (const int32_t id : ids) out.push_back(pieces.Push(id));
    if (!out.empty()) out.back() += pieces.Flush();
    return out;
  }

  const EngineModelInfo& ModelInfo() const override { return info_; }

  EngineStats Stats() const override {
    EngineStats stats = scheduler_->Stats();
    const EngineCounters c = GetEngineCounters();
    stats.graph_builds = c.graph_builds;
    stats.optimizer_runs = c.optimizer_runs;
    stats.rebinds = c.rebinds;
    stats.bound_nodes = c.bound_nodes;
    stats.kv_bytes = c.kv_bytes;
    stats.live_contexts = c.live_contexts;
    const Backend& backend = model_->model().backend();
    stats.device_memory_bytes = backend.allocated_bytes();
    stats.device_memory_capacity_bytes = backend.memory_capacity_bytes();
    stats.device_lost = !backend.health().ok();
    stats.device_validation_messages = backend.validation_messages();
    return stats;
  }

 private:
  // Host work at least this large borrows a compute thread of every worker
  // while it runs (EngineOptions::lend_threads_to_host_work).
  static constexpr size_t kLoanBytes = size_t{64} << 10;
  static constexpr size_t kLoanIds = 16384;

  // Lends one compute thread of every worker's team while it lives (a no-op
  // unless `lend`, or unless the engine lends threads at all).
  class ThreadLoan {
   public:
    ThreadLoan(std::atomic<int>* lent, bool lend) : lent_(lend ? lent : nullptr) {
      if (lent_ != nullptr) lent_->fetch_add(1, std::memory_order_relaxed);
    }
    ~ThreadLoan() {
      if (lent_ != nullptr) lent_->fetch_sub(1, std::memory_order_relaxed);
    }
    ThreadLoan(const ThreadLoan&) = delete;
    ThreadLoan& operator=(const ThreadLoan&) = delete;

   private:
    std::atomic<int>* const lent_;
  };

  // INVALID_ARGUMENT for input beyond RequestLimits, and for text or chat
  // content with more bytes than a session's context could hold as tokens (a
  // cheap bound: the tokenizer's cost grows with the input, the context's
  // capacity does not).
  absl::Status CheckInputSize(const TurnRequest& turn) const {
    // The context's bound first: it says why such input can never be served.
    int64_t bytes = 0;
    if (turn.kind == TurnRequest::InputKind::kText) bytes = static_cast<int64_t>(turn.text.size());
    if (turn.kind == TurnRequest::InputKind::kMessages) {
      for (const ChatMessage& m : turn.messages) bytes += static_cast<int64_t>(m.content.size());
    }
    if (bytes > max_input_bytes_) {
      return TurnFieldError(TurnField::kInput, absl::StrCat(
          "the turn's input has ", bytes, " bytes, more than a session's context of ", info_.session_context_length,
          " tokens can hold (", max_input_bytes_, " bytes at most: no token of this vocabulary spells more than ",
          max_input_bytes_ / info_.session_context_length, ")"));
    }
    if (turn.kind == TurnRequest::InputKind::kText && bytes > limits_.max_text_bytes) {
      return TurnFieldError(TurnField::kInput, absl::StrCat("the turn's text has ", bytes,
                                                            " bytes, over the server's limit of ",
                                                            limits_.max_text_bytes, " (max_text_bytes)"));
    }
    if (turn.kind == TurnRequest::InputKind::kMessages) {
      if (static_cast<int64_t>(turn.messages.size()) > limits_.max_chat_messages) {
        return TurnFieldError(TurnField::kInput, absl::StrCat("the turn has ", turn.messages.size(),
                                                              " messages, over the server's limit of ",
                                                              limits_.max_chat_messages, " (max_chat_messages)"));
      }
      int64_t total = 0;
      for (const ChatMessage& m : turn.messages) {
        total += static_cast<int64_t>(m.role.size() + m.content.size()) + kChatMessageOverheadBytes;
      }
      if (total > limits_.max_text_bytes) {
        return TurnFieldError(TurnField::kInput, absl::StrCat(
            "the turn's messages count ", total, " bytes (roles and contents, ", kChatMessageOverheadBytes,
            " more per message), over the server's limit of ", limits_.max_text_bytes, " (max_text_bytes)"));
      }
    }
    const std::vector<std::string>& stops = turn.stopping.stop_sequences;
    if (static_cast<int64_t>(stops.size()) > limits_.max_stop_sequences) {
      return TurnFieldError(TurnField::kStopSequences,
                            absl::StrCat("the turn has ", stops.size(), " stop sequences, over the server's limit of ",
                                         limits_.max_stop_sequences, " (max_stop_sequences)"));
    }
    int64_t stop_bytes = 0;
    for (const std::string& stop : stops) stop_bytes += static_cast<int64_t>(stop.size());
    if (stop_bytes > limits_.max_text_bytes) {
      return TurnFieldError(TurnField::kStopSequences,
                            absl::StrCat("the turn's stop sequences have ", stop_bytes,
                                         " bytes, over the server's limit of ", limits_.max_text_bytes,
                                         " (max_text_bytes)"));
    }
    if (turn.stopping.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
      return TurnFieldError(TurnField::kStopTokenIds,
                            absl::StrCat("the turn has ", turn.stopping.stop_token_ids.size(),
                                         " stop token ids, over the server's limit of ", kMaxStopTokenIds));
    }
    if (turn.kind == TurnRequest::InputKind::kTokens &&
        static_cast<int64_t>(turn.tokens.size()) > limits_.max_token_ids) {
      return TurnFieldError(TurnField::kInput, absl::StrCat("the turn has ", turn.tokens.size(),
                                                            " tokens, over the server's limit of ",
                                                            limits_.max_token_ids, " (max_token_ids)"));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<RealServingModel> model_;
  const RequestLimits limits_;
  absl::Mutex executors_mu_;
  std::vector<std::unique_ptr<Executor>> executors_ ABSL_GUARDED_BY(executors_mu_);
  int64_t max_input_bytes_ = 0;
  EngineModelInfo info_;
  // Threads lent to host work now; read by the workers' executors when the
  // engine lends (they were given it then). Const calls lend too.
  const std::shared_ptr<std::atomic<int>> lent_threads_;
  std::unique_ptr<Scheduler> scheduler_;  // last: its workers stop before the model goes
};

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (absl::Status s = CheckEngineOptions(options); !s.ok()) return s;
  ModelLoadOptions load;
  load.chat_template_override = options.chat_template;
  load.load = options.mmap_weights ? GgufLoad::kMap : GgufLoad::kCopy;
  load.backend = options.backend;
  load.kv_type = options.kv_type;
  absl::StatusOr<std::shared_ptr<const Model>> model = Model::Load(options.model_path, load);
  if (!model.ok()) return model.status();
  Backend& backend = (*model)->backend();
  const int32_t session_len = std::min<int32_t>(options.context_length, (*model)->info().context_length);
  // One session's KV reservation (on the CPU its buffers are committed
  // lazily, so this scratch context costs no memory).
  absl::StatusOr<std::unique_ptr<DecodeContext>> probe = (*model)->NewContext(session_len);
  if (!probe.ok()) return probe.status();
  const int64_t session_kv_bytes = (*probe)->kv_bytes();
  probe->reset();
  // Every worker's executor now, so a device that cannot give one fails here.
  auto lent = std::make_shared<std::atomic<int>>(0);
  std::vector<std::unique_ptr<Executor>> executors;
  for (int w = 0; w < options.workers; ++w) {
    absl::StatusOr<std::unique_ptr<Executor>> e = backend.CreateExecutor(
        options.threads_per_worker, options.lend_threads_to_host_work ? lent.get() : nullptr);
    if (!e.ok()) return e.status();
    executors.push_back(*std::move(e));
  }
  if (absl::Status s = WarmUp(**model, *executors.front()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("warm-up failed: ", s.message()));
  }
  // After the warm-up has freed its context: what the idle engine holds.
  absl::StatusOr<int64_t> kv_budget_bytes = ResolveKvBudget(options.kv_budget_bytes, backend);
  if (!kv_budget_bytes.ok()) return kv_budget_bytes.status();
  std::shared_ptr<KvPool> pool;
  if (options.kv_block_tokens > 0) {
    absl::StatusOr<std::shared_ptr<KvPool>> made =
        MakeKvPool(**model, options, session_len, session_kv_bytes, *kv_budget_bytes);
    if (!made.ok()) return made.status();
    pool = *std::move(made);
  }
  // With paged KV the budget in force is the pool's bytes (capped at every
  // session's full context), which is what the metrics report.
  const int64_t budget = pool != nullptr ? pool->bytes() : *kv_budget_bytes;
  return std::unique_ptr<Engine>(new EngineImpl(
      std::make_unique<RealServingModel>(*std::move(model), std::move(pool), options.parse_special_in_chat_content),
      options, session_len, session_kv_bytes, budget, std::move(lent), std::move(executors)));
}

}  // namespace decoded::serving
