// The serving engine: the one header the gRPC server sees.
//
// An Engine loads a model once, warms it up, and runs a fixed pool of workers
// that step decode sessions (see scheduler.h for the scheduling contract). A
// session is one conversation: it owns a KV cache (a DecodeContext) that
// persists across its turns. A turn appends input to the context and
// generates tokens; its events reach the caller through a TurnSink.
//
// Threading: every method may be called from any thread. Sink callbacks run on
// worker threads, never while an Engine lock is held, so a sink may call back
// into the Engine (e.g. SubmitTurn from OnTurnEnd).
#ifndef DECODED_ENGINE_SERVING_ENGINE_H_
#define DECODED_ENGINE_SERVING_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/dtype.h"
#include "engine/sampling/sampler.h"
#include "engine/tokenizer/tokenizer.h"

namespace decoded {
class Backend;
}  // namespace decoded

namespace decoded::serving {

// ----------------------------------------------------------------------------
// Turn input and output.

struct StoppingParams {
  int32_t max_new_tokens = 256;            // 0 = prefill only
  std::vector<std::string> stop_sequences; // text stops; the stop text is not emitted
  std::vector<int32_t> stop_token_ids;     // each in [0, vocab)
  bool ignore_eos = false;                 // end-of-generation ids do not stop
  // The turn is refused (INVALID_ARGUMENT naming TurnField::kMaxNewTokens)
  // when its input plus max_new_tokens do not fit the session's context, as
  // the OpenAI API, vLLM and TGI refuse such a request; otherwise such a turn
  // runs and ends kContextFull when the context is full.
  bool max_new_tokens_must_fit = false;
};

struct TurnRequest {
  // Exactly one input kind is used.
  enum class InputKind { kText, kMessages, kTokens };
  InputKind kind = InputKind::kText;
  std::string text;                   // kText: BOS added on a session's first turn only
  std::vector<ChatMessage> messages;  // kMessages: chat template + generation prompt; content is
                                      // plain text (EngineOptions::parse_special_in_chat_content)
  std::vector<int32_t> tokens;        // kTokens: used verbatim
  SamplingParams sampling;
  StoppingParams stopping;
  bool prompt_logprobs = false;
};

struct TokenEvent {
  int32_t id = 0;
  std::string text;   // UTF-8 safe, stop-sequence safe (may be empty)
  float logprob = 0;  // natural log, temperature 1, unpenalised
  std::vector<TokenLogprob> top;
};

// kShutdown: the server cut the turn short because it is shutting down.
// kError: a step failed (TurnEnd::error says why).
enum class FinishReason { kStopToken, kStopSequence, kLength, kCancelled, kContextFull, kShutdown, kError };

// Token counts of one turn. A session's *context* is every token it has seen:
// the tokens in its KV cache plus the last sampled token, which is fed to the
// model at the start of the next turn. For every turn:
//   context_tokens = (context when the turn began) + prompt tokens that entered the context + generated_tokens
// where every prompt token enters unless the turn was cut during prefill
// (cancel, shutdown, error). cached_tokens is the first term, and so the next
// turn's cached_tokens is this turn's context_tokens, unless KV was
// recomputed after a preemption (less) or mapped from the prefix cache
// (more: a session's first turn may have cached_tokens > 0). So over a session's turns, sum(prompt_tokens +
// generated_tokens) == the last context_tokens when no prefill was cut.
struct TurnUsage {
  int32_t prompt_tokens = 0;     // the turn's input tokens (a BOS the server added included)
  int32_t generated_tokens = 0;  // tokens sampled by this turn
  // Tokens this turn did not compute because their KV was there: the
  // context when the turn began (unless a preemption took its blocks back:
  // then less what was computed again), plus those the prefix cache mapped.
  int32_t cached_tokens = 0;
  // Tokens this turn ran through prefill: its prompt tokens that entered the
  // context plus the previous turn's last sampled token, when there is one,
  // plus any context it recomputed after a preemption, less those the
  // prefix cache mapped.
  int32_t prefilled_tokens = 0;
  int32_t context_tokens = 0;    // context tokens when the turn ended (<= session capacity)
};

// Milliseconds on the monotonic clock, from SubmitTurn's acceptance.
struct TurnTimings {
  double queue_ms = 0;
  double ttft_ms = 0;
  double prefill_ms = 0;
  double decode_ms = 0;
  double mean_inter_token_ms = 0;
  double total_ms = 0;  // acceptance to end: the turn's end-to-end latency
};

struct TurnEnd {
  FinishReason reason = FinishReason::kStopToken;
  // Set with kError only: a step failed inside the engine (INTERNAL, e.g.
  // non-finite logits), or a turn held behind a cancelled one was refused
  // when it was due to start (its SubmitTurn error).
  absl::Status error;
  TurnUsage usage;
  TurnTimings timings;
  // log p(prompt[i+1] | ..prompt[i]) for i in [0, prompt_tokens - 1) when asked.
  std::vector<float> prompt_logprobs;
  // Text of the turn's tokens that no TokenEvent carried: held back as a
  // possible stop-sequence start or an incomplete UTF-8 sequence (then
  // U+FFFD) when the turn was ended from outside (kCancelled, kShutdown).
  // Empty otherwise: the last TokenEvent carries it. Valid UTF-8.
  std::string text;
};

// Receives one turn's events, in order: zero or more OnToken, then exactly one
// OnTurnEnd. Calls for one session never overlap. The Engine calls a sink only
// between the SubmitTurn that accepted it and its OnTurnEnd, and never after
// the session's release (see CloseSession): the caller owns the sink and may
// destroy it after either point.
class TurnSink {
 public:
  virtual ~TurnSink() = default;
  virtual void OnToken(const TokenEvent& event) = 0;
  virtual void OnTurnEnd(const TurnEnd& end) = 0;
};

// ----------------------------------------------------------------------------
// Engine.

// One worker step, as metrics see it.
struct StepInfo {
  bool prefill = false;  // the step ran prompt tokens (alone or beside decode rows)
  double seconds = 0;    // duration of the model call
  // Tokens the step put through the model: its prefill tokens and decode rows.
  int32_t tokens = 0;
  // Sessions the step decoded a token for (its decode batch size).
  int32_t decode_rows = 0;
};

// Bounds on one request, checked before any work is done for it, so the cost
// of a request the engine accepts is bounded whatever a client sends. Each
// refusal is INVALID_ARGUMENT naming the field and the bound.
struct RequestLimits {
  // Text bytes: Tokenize's text; a text turn's text; a chat turn's messages,
  // each counted as its role and content bytes plus kChatMessageOverheadBytes
  // (so empty messages count too); Detokenize's reply.
  int64_t max_text_bytes = int64_t{1} << 20;
  int32_t max_chat_messages = 4096;     // messages of one chat turn
  int32_t max_token_ids = 131072;       // Detokenize's ids; a token turn's tokens
  // Stop sequences of one turn (TGI's --max-stop-sequences; OpenAI allows 4);
  // their bytes count against max_text_bytes too. A turn's stop token ids are
  // bounded by kMaxStopTokenIds.
  int32_t max_stop_sequences = 16;
};
// Stop token ids of one turn: every sampled token is looked up among them.
inline constexpr int32_t kMaxStopTokenIds = 1024;
// What one chat message costs against max_text_bytes beside its role and
// content: about what a template's markup around it renders to.
inline constexpr int64_t kChatMessageOverheadBytes = 16;

struct EngineOptions {
  std::string model_path;
  // The weights: a copy of the file in memory (the default), or a mapping of
  // it (engine/gguf/gguf_file.h: faster to load and shared with other
  // processes, but a file truncated or overwritten while served crashes the
  // process or changes its weights).
  bool mmap_weights = false;
  // The backend that runs every step (engine/device_spec.h: --device); null:
  // the CPU. Workers' executors come from it.
  std::shared_ptr<Backend> backend;
  int workers = 1;              // fixed worker pool size (>= 1)
  int threads_per_worker = 1;   // compute threads of each worker's executor (>= 1)
  // While a large Tokenize, Detokenize or text turn is encoded (64 KiB of
  // text or 16384 ids and more), every worker's team runs one thread narrower
  // (never below one), so that host work gets a core instead of stretching
  // every step: a team as wide as the machine is coupled by a few hundred
  // barriers a step, and one other busy thread made its steps 4-5x longer
  // (2 vCPUs: 20 -> 95 ms beside a 1 MiB Tokenize). For teams that use every
  // CPU; outputs do not depend on the team's width.
  bool lend_threads_to_host_work = false;
  int max_sessions = 16;        // open sessions; beyond: RESOURCE_EXHAUSTED
  int max_queued = 64;          // turns waiting for a worker; beyond: RESOURCE_EXHAUSTED
  int context_length = 2048;    // KV capacity per session, clamped to the model's
  // KV all open sessions may reserve (RESOURCE_EXHAUSTED beyond); 0 = no
  // limit; -1 = three quarters of the memory the KV cache lives in: on a
  // device with its own memory (Backend::memory_capacity_bytes), what the
  // weights leave of it; on the CPU, physical memory. On a device the budget
  // must fit what the weights leave (Create: RESOURCE_EXHAUSTED).
  int64_t kv_budget_bytes = 0;
  // Element type of every session's KV cache (--kv_type; engine/kv_layout.h):
  // f32, f16 (half the bytes of f32) or q8_0 (34 bytes per 32 elements).
  DType kv_type = DType::kF32;
  // Paged KV: positions per block of the one KV pool all sessions share
  // (engine/kv_pool.h), sized by kv_budget_bytes (0 there: every session at
  // its full context). A session holds the blocks its live length needs, so
  // the budget bounds what sessions hold, not what they might grow to; a
  // turn's prompt waits in the queue until its blocks are free, and the
  // blocks of idle sessions are taken back first (least recently used; their
  // next turn recomputes them). 0: each session reserves a contiguous cache
  // of context_length at open (the budget then bounds those reservations).
  // 0..kMaxKvBlockTokens.
  int32_t kv_block_tokens = 16;
  // Prefix caching across sessions (paged KV with mixed steps only): full
  // KV blocks are kept under the chained hash of their tokens after their
  // sessions let go of them, until the pool needs them (least recently used
  // first), and a session whose context starts with cached blocks maps them
  // instead of prefilling those tokens (TurnUsage::cached_tokens counts
  // them). On the CPU a turn's logits are byte-identical with it on or off.
  bool prefix_cache = true;
  // Backpressure: a session whose client has not consumed this many of its
  // token events (see Engine::EventsConsumed) is not stepped until it does,
  // so a client that stops reading costs no worker time and its server-side
  // buffer stays bounded. >= 1.
  int max_unconsumed_events = 8;
  // kMessages turns: whether special-token spellings in message content become
  // their ids. Off, content is plain text and only the chat template's own
  // markup yields control tokens (Tokenizer::EncodeChat), so a client cannot
  // forge turns. For trusted clients only.
  bool parse_special_in_chat_content = false;
  // A Jinja chat template that replaces the model file's own (vLLM's
  // --chat-template): for files without one. "" = the file's. Engine::Create
  // fails with INVALID_ARGUMENT when it cannot be parsed.
  std::string chat_template;
  // Decode sessions one worker steps together (continuous batching: each
  // decode step takes every runnable decoding session, up to this many, into
  // one plan run). 1 steps sessions one at a time. 1..kMaxBatch.
  int max_batch = 16;
  // Tokens one step may run (vLLM's max_num_batched_tokens): each step packs
  // every decoding session's next token (up to max_batch) and fills the rest
  // with prefill spans of waiting prompts, in queue order, all through one
  // held plan run (BatchDecoder::Step). So a burst of prompts is prefilled
  // together, and a decoding session waits at most one such step for its
  // next token. 0: a prefill step is one session's chunk alone, through D1
  // (the behaviour before mixed steps). Else max_batch < it <= kMaxStepTokens.
  int max_step_tokens = 512;
  // Called on the worker thread after every step (for metrics); must be cheap
  // and thread-safe.
  std::function<void(const StepInfo&)> on_step;
  // Called once, on the worker whose step found the backend lost (its
  // health() not OK after a failed step), before that step's turns end: so a
  // client that sees its turn fail UNAVAILABLE already finds health
  // NOT_SERVING. Must not call into the Engine. May be empty.
  std::function<void(const absl::Status&)> on_device_lost;
  RequestLimits limits;
};

// INVALID_ARGUMENT naming the first option out of range (what Engine::Create
// checks before it loads anything), so a caller can refuse bad settings
// before paying for a model load.
absl::Status CheckEngineOptions(const EngineOptions& options);

// Largest EngineOptions::kv_block_tokens accepted.
inline constexpr int32_t kMaxKvBlockTokens = 1024;

struct EngineModelInfo {
  std::string family;
  std::string name;
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  int32_t n_layers = 0;
  int32_t hidden_size = 0;
  int32_t sliding_window = 0;
  std::string weight_dtype;  // the file's type when it names one ("Q4_K_M"), else tensor_dtype
  std::string tensor_dtype;  // the GGML type of most tensor bytes ("q4_K")
  std::string backend;  // "cpu", "vulkan"
  std::string device;   // "cpu", or the GPU's name
  // Instruction-set tier of the CPU kernels (engine/cpu_isa.h: "avx512vnni",
  // "avx2", "scalar"); "" on other devices.
  std::string cpu_isa;
  int32_t session_context_length = 0;
  int64_t session_kv_bytes = 0;  // KV cache of one session at its full context (session_context_length tokens)
  std::string kv_type;           // its element type: "f32", "f16", "q8_0"
  int32_t max_sessions = 0;
  int32_t bos_id = 0;
  int32_t eos_id = 0;
  std::string tokenizer;       // "sentencepiece" or "byte_level_bpe"
  std::string pre_tokenizer;   // tokenizer.ggml.pre ("" for sentencepiece)
  std::string chat_template;   // tokenizer.chat_template ("" = none)
  std::string chat_template_error;  // "" when chat turns can be served
  std::vector<int32_t> end_of_generation_ids;
};

struct EngineStats {
  int64_t sessions_active = 0;  // open sessions (a closed one stops counting at once)
  int64_t turns_queued = 0;   // runnable turns waiting for a worker
  // Turns accepted whose first step has not run, and turns begun and not
  // ended: the model server protocol's queued and running requests (Gateway
  // API Inference Extension).
  int64_t turns_waiting = 0;
  int64_t turns_running = 0;
  int64_t workers_busy = 0;
  // Configured limits (EngineOptions), so a scrape can put usage beside them.
  int64_t workers = 0;
  int64_t kv_budget_bytes = 0;  // 0 = no limit
  // Paged KV (0 without): the pool's blocks, those sessions hold, positions per block.
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_block_tokens = 0;
  // Idle sessions whose KV blocks were taken back for others (their next
  // turn recomputes them), and turns ended RESOURCE_EXHAUSTED because a
  // decoding session needed a block and none was free.
  int64_t kv_preemptions = 0;
  int64_t kv_exhausted_turns = 0;
  // Prefix caching: free blocks holding a cached prefix (part of the free
  // ones), and tokens of turns' prompts looked up in it and found there.
  int64_t kv_blocks_cached = 0;
  int64_t prefix_cache_queried_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  // Sessions with a turn that is not stepped because the client has not
  // consumed max_unconsumed_events of its events.
  int64_t sessions_waiting_for_client = 0;
  // Turns ended with an error because a step produced NaN or infinite logits.
  int64_t nonfinite_logits_turns = 0;
  // Age of the oldest step a worker is running now (0 when idle): a step that
  // runs for seconds means the worker loop is wedged (health reports it).
  double longest_running_step_seconds = 0;
  // The model's backend (Backend): memory its buffers hold now (weights it
  // copied, KV caches, plans), the device memory there is (0: host memory),
  // whether the device still runs plans, and validation-layer reports.
  int64_t device_memory_bytes = 0;
  int64_t device_memory_capacity_bytes = 0;
  bool device_lost = false;
  int64_t device_validation_messages = 0;
  // Process-wide engine counters (GetEngineCounters()).
  int64_t graph_builds = 0;
  int64_t optimizer_runs = 0;
  int64_t rebinds = 0;
  int64_t bound_nodes = 0;
  int64_t kv_bytes = 0;
  int64_t live_contexts = 0;
};

using SessionId = uint64_t;

class Engine {
 public:
  // Loads the model, checks the options (INVALID_ARGUMENT naming the field),
  // runs a warm-up (one Prefill and two Decode steps on a scratch context) and
  // starts the workers. Load errors pass through (NOT_FOUND, ...).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // Stops the workers after their current step; open sessions are dropped
  // without further sink calls.
  virtual ~Engine() = default;

  // RESOURCE_EXHAUSTED when max_sessions sessions are open or (contiguous KV,
  // kv_block_tokens = 0) the KV budget is spent; UNAVAILABLE after
  // BeginShutdown. The context is made here: paged, it holds no KV block yet;
  // contiguous, its whole cache is reserved.
  virtual absl::StatusOr<SessionId> OpenSession() = 0;

  // Validates and queues a turn; text and chat input are tokenized (a chat
  // conversation rendered) on the calling thread, so call it off
  // latency-sensitive threads. Whether the input starts with BOS follows
  // from the session's context: the model's BOS is prepended (never doubled)
  // to text and chat input exactly when the context is empty, whatever
  // earlier turns were accepted and cancelled. Errors (the session is
  // unchanged):
  //   INVALID_ARGUMENT: empty input, token id outside the vocabulary (input or
  //     stop_token_ids), input longer than the remaining context or beyond
  //     RequestLimits, sampling parameter out of range, negative
  //     max_new_tokens;
  //   FAILED_PRECONDITION: a turn of this session is still running (a turn
  //     submitted after CancelTurn, before the cancelled turn's end, is held
  //     instead and starts right after that end; one such turn at a time; if
  //     it no longer fits then, its sink gets a kError TurnEnd with the error);
  //   RESOURCE_EXHAUSTED: max_queued turns are waiting;
  //   UNAVAILABLE: the engine is shutting down;
  //   NOT_FOUND: no such session.
  // `sink` must stay valid until its OnTurnEnd or the session's release.
  virtual absl::Status SubmitTurn(SessionId session, const TurnRequest& turn, TurnSink* sink) = 0;

  // Ends the running turn with kCancelled before its next step (also when it
  // waits for its client). A second cancel, sent after a turn was held behind
  // the first, cancels that held turn: it ends kCancelled without a step. So
  // every cancel ends the newest turn submitted before it. No-op when no turn
  // runs. NOT_FOUND for an unknown session.
  virtual absl::Status CancelTurn(SessionId session) = 0;

  // Closes a session without waiting: it stops counting against max_sessions
  // at once, its queued turn never runs and it is never stepped again. Its
  // DecodeContext (KV cache and bindings) is destroyed as soon as no step of
  // it runs; then `on_released` is called (on this thread when no step runs,
  // else on the worker when the step returns): from then on the engine never
  // calls the session's sinks. Safe to call from gRPC callbacks. A second
  // call's `on_released` runs at the same release (at once for an unknown or
  // already released session).
  virtual void CloseSession(SessionId session, absl::AnyInvocable<void()> on_released = nullptr) = 0;

  // The client has consumed `count` more token events of the session (the
  // transport took them, or the client acknowledged them). See
  // EngineOptions::max_unconsumed_events. Unknown sessions are ignored.
  virtual void EventsConsumed(SessionId session, int count) = 0;

  // Every running and queued turn ends with kShutdown before its next step
  // (a turn waiting for its client too); later OpenSession and SubmitTurn
  // get UNAVAILABLE. Idempotent.
  virtual void BeginShutdown() = 0;

  // Text -> ids (add_bos: the model's BOS, never doubled). INVALID_ARGUMENT
  // when the text exceeds RequestLimits::max_text_bytes. Its cost grows with
  // the text: call it off latency-sensitive threads.
  virtual absl::StatusOr<std::vector<int32_t>> Tokenize(std::string_view text, bool add_bos,
                                                        bool parse_special) const = 0;
  // Ids -> valid UTF-8 text (Tokenizer::Detokenize: ill-formed byte sequences
  // become U+FFFD by the rule streamed text follows too).
  // INVALID_ARGUMENT on an id outside the vocabulary, more ids than
  // RequestLimits::max_token_ids, or text longer than max_text_bytes.
  virtual absl::StatusOr<std::string> Detokenize(absl::Span<const int32_t> ids, bool render_special) const = 0;
  // Each id's share of Detokenize(ids, /*render_special=*/false): the text
  // that became complete with it (IncrementalDetokenizer: "" for a byte of a
  // UTF-8 sequence that a later id completes; what is still held back at
  // the end joins the last piece), so the pieces concatenate to that text.
  // Where each token's text starts (OpenAI's completions text_offset).
  // Same errors as Detokenize.
  virtual absl::StatusOr<std::vector<std::string>> DetokenizePieces(absl::Span<const int32_t> ids) const = 0;
  virtual const EngineModelInfo& ModelInfo() const = 0;
  virtual EngineStats Stats() const = 0;
};

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_ENGINE_H_
