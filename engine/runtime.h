// The engine's model-level API: load a model once, open per-session decode
// contexts on it, and run prefill (D1) and decode (D2) steps on a worker's
// executor. This is what the serving layer (engine/serving) builds on; it knows
// nothing of gRPC.
//
// Ownership: a Model is immutable and shared (shared_ptr<const Model>) by every
// session; its weights are mapped once per process. A DecodeContext belongs to
// one session: its KV cache, its held decode plan and the per-token data
// buffers that plan is bound to. Destroying it releases all of them at once.
//
// Threading: Model is thread-safe. A DecodeContext must not be used by two
// threads at once (the scheduler runs one step of a session at a time). An
// Executor is a worker's compute resources (CPU threads); one step runs on
// one executor, and successive steps of a context may use different executors.
#ifndef DECODED_ENGINE_RUNTIME_H_
#define DECODED_ENGINE_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend.h"
#include "engine/engine_counters.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv_pool.h"
#include "engine/tokenizer/tokenizer.h"

namespace decoded {

class DecodeContext;
class BatchDecoder;

struct ModelInfo {
  std::string family;          // "gemma3"
  std::string name;            // general.name
  int32_t context_length = 0;  // trained context (tokens)
  int32_t vocab_size = 0;
  int32_t n_layers = 0;
  int32_t hidden_size = 0;
  int32_t sliding_window = 0;  // 0 if the family has no local layers
  std::string weight_dtype;    // dominant GGML type (most tensor bytes), e.g. "q4_K"
  std::string file_type;       // general.file_type, e.g. "Q4_K_M" ("" when absent)
  std::string backend;         // Backend::name(): "cpu", "vulkan"
  std::string device;          // Backend::device_name(): "cpu", or the GPU's name
  std::string kv_type;         // element type of its KV caches: "f32", "f16" or "q8_0"
};

struct ModelLoadOptions {
  // See Tokenizer::FromGguf: a chat template that replaces the file's ("" = the file's).
  std::string chat_template_override;
  // Whether the weights are a copy of the file in memory or a mapping of it
  // (engine/gguf/gguf_file.h says what each risks).
  GgufLoad load = GgufLoad::kCopy;
  // The backend that runs the model's plans (engine/device_spec.h opens one
  // by its --device name); null: the CPU. Kept alive by the model.
  std::shared_ptr<Backend> backend;
  // Element type of the KV caches of its contexts and pools (engine/kv_layout.h:
  // f32, f16 or q8_0; q8_0 needs K/V row widths that are multiples of 32).
  // Load answers INVALID_ARGUMENT for another type or a model q8_0 cannot hold.
  DType kv_type = DType::kF32;
};

class Model {
 public:
  // NOT_FOUND / INVALID_ARGUMENT / UNIMPLEMENTED from the GGUF reader and the
  // family's hyper-parameter and weight checks (message names the key/tensor).
  // The backend is checked at load with the model's one-token decode graph,
  // and receives its weights then: FAILED_PRECONDITION naming the op, weight
  // type and family when the backend has no kernel for one (no silent
  // fallback to another device); RESOURCE_EXHAUSTED when the weights do not
  // fit the device's memory.
  static absl::StatusOr<std::shared_ptr<const Model>> Load(const std::string& gguf_path,
                                                           const ModelLoadOptions& options = {});
  virtual ~Model() = default;

  virtual const ModelInfo& info() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  // The backend its plans run on: executors for its workers come from here
  // (Backend::CreateExecutor), and so do its memory use and health.
  virtual Backend& backend() const = 0;

  // A fresh context with a contiguous KV cache of `max_seq_len` positions,
  // reserved now. INVALID_ARGUMENT if max_seq_len < 1 or > info().context_length.
  absl::StatusOr<std::unique_ptr<DecodeContext>> NewContext(int32_t max_seq_len) const {
    return NewContext(max_seq_len, nullptr);
  }
  // A fresh context of up to `max_seq_len` positions whose KV cache takes
  // blocks from `pool` as it grows (a pool from NewKvPool of this model;
  // null: contiguous, as above). INVALID_ARGUMENT as above, or for a pool of
  // another geometry.
  virtual absl::StatusOr<std::unique_ptr<DecodeContext>> NewContext(int32_t max_seq_len,
                                                                    std::shared_ptr<KvPool> pool) const = 0;
  // A pool of `n_blocks` KV blocks of `block_tokens` positions each in this
  // model's KV geometry on its backend, for contexts to share
  // (engine/kv_pool.h); a block holds one layer group's KV, the layers
  // grouped by attention window (engine/kv_groups.h: KvPool::groups()). INVALID_ARGUMENT for non-positive sizes;
  // RESOURCE_EXHAUSTED when it does not fit.
  virtual absl::StatusOr<std::shared_ptr<KvPool>> NewKvPool(int32_t block_tokens, int32_t n_blocks) const = 0;

  // A batched decoder over this model's contexts for decode steps of up to
  // `max_batch` contexts and mixed steps (BatchDecoder::Step) of up to
  // max(max_batch, max_step_tokens) tokens. INVALID_ARGUMENT unless
  // 1 <= max_batch <= kMaxBatch and 0 <= max_step_tokens <= kMaxStepTokens.
  virtual absl::StatusOr<std::unique_ptr<BatchDecoder>> NewBatchDecoder(int32_t max_batch,
                                                                        int32_t max_step_tokens = 0) const = 0;
};

// Largest number of tokens one Prefill call accepts; longer prompts are fed in
// chunks so cancellation is observed between chunks.
inline constexpr int32_t kMaxPrefillChunk = 128;

class DecodeContext {
 public:
  virtual ~DecodeContext() = default;

  virtual int32_t cached_len() const = 0;  // tokens in the KV cache
  virtual int32_t capacity() const = 0;    // max_seq_len

  // Appends 1..kMaxPrefillChunk tokens through D1 (graph built for this chunk
  // and discarded). Returns f32 logits: [vocab] for the last token, or
  // [tokens.size(), vocab] row-major when `all_logits`. The span is valid until
  // the next call on this context.
  // INVALID_ARGUMENT: empty chunk, chunk too long, token id outside the vocab;
  // RESOURCE_EXHAUSTED: cached_len() + tokens.size() > capacity().
  virtual absl::StatusOr<absl::Span<const float>> Prefill(absl::Span<const int32_t> tokens,
                                                          bool all_logits, Executor& executor) = 0;

  // Appends one token through the held decode plan (D2): the first call builds
  // and optimizes the plan, later calls only rebind per-token data. Returns
  // [vocab] f32 logits, valid until the next call. Errors as Prefill.
  virtual absl::StatusOr<absl::Span<const float>> Decode(int32_t token, Executor& executor) = 0;

  // Forgets the tokens from position `len` on, so the next Prefill/Decode
  // writes at `len`: a chat turn whose rendering differs from the context
  // after some position recomputes from there (prefix reuse). The held decode
  // plan stays valid (its KV-write offset and masks are rebound per token).
  // INVALID_ARGUMENT unless 0 <= len <= cached_len(); FAILED_PRECONDITION
  // unless RewindableTo(len) == len. A paged cache gives back the blocks
  // past `len`, among them any ReserveKv mapped and no step used
  // (Rewind(cached_len())).
  virtual absl::Status Rewind(int32_t len) = 0;
  // The longest length <= len this context can rewind to and go on from:
  // len, but 0 where a sliding-window layer gave back KV blocks that queries
  // from len on would read (KvCache::TruncatableTo).
  virtual int32_t RewindableTo(int32_t len) const { return len; }

  // Bytes of KV cache this context holds (K and V, all layers): its whole
  // capacity for a contiguous cache, the blocks it holds for a paged one.
  virtual int64_t kv_bytes() const = 0;
  // Maps the KV blocks `n_tokens` more tokens need (a no-op for a
  // contiguous cache), as every step does first: the scheduler calls it
  // before a step, so a pool that runs dry fails one session, not the step.
  // RESOURCE_EXHAUSTED past capacity() or when the pool has too few free
  // blocks (the blocks it did take stay with the context).
  virtual absl::Status ReserveKv(int32_t n_tokens) = 0;
  // The KV blocks ReserveKv(n_tokens) would take from the pool, less the
  // sliding-window blocks it gives back first (KvCache::BlocksToReserve).
  virtual int32_t KvBlocksToReserve(int32_t n_tokens) const { return 0; }
  // KV blocks this context holds, all layer groups (1 for a contiguous cache).
  virtual int32_t kv_blocks() const = 0;
  // Paged KV: positions [0, kv_mapped_len()) have blocks in every layer
  // group's table (but for sliding-window blocks already given back), so
  // writing there takes none from the pool. A contiguous cache: capacity().
  virtual int32_t kv_mapped_len() const { return capacity(); }
  // Paged KV: the i-th block it holds (i < kv_blocks(), group by group; -1
  // otherwise or for a contiguous cache); the block of layer group `group`
  // holding positions [i * block_tokens, ...) (-1 if none); and
  // KvCache::Adopt (cached prefix blocks mapped into an empty context:
  // FAILED_PRECONDITION otherwise).
  virtual int32_t kv_block(int32_t i) const { return -1; }
  virtual int32_t kv_range_block(int32_t group, int32_t i) const { return -1; }
  virtual absl::Status AdoptKvBlocks(absl::Span<const int32_t> blocks) {
    return absl::FailedPreconditionError("this context has no paged KV cache");
  }
  // Data-node bindings the held plan keeps (0 before the first Decode).
  virtual int64_t bound_nodes() const = 0;
};

// Which logits a span of a step returns.
enum class SpanLogits {
  kNone,  // none: a prefill chunk that does not end its prompt
  kLast,  // its last token's row: a decode row, the chunk that ends a prompt
  kAll,   // every token's row: a prompt whose logprobs are asked for
};

// One sequence's part of a step: `tokens` appended to `context` at
// context->cached_len(), cached_len() + 1, ...
struct StepSpan {
  DecodeContext* context = nullptr;
  absl::Span<const int32_t> tokens;
  SpanLogits logits = SpanLogits::kLast;
};

// Steps many decode contexts of one model in one plan run (batched decode):
// one token row per context, every matmul reading each weight block once for
// all rows, each row attending over its own context's KV cache. Holds one
// plan per (rows, output rows) bucket pair (BatchBuckets), built on first use
// and reused by whichever contexts fill it, at most 24 (least recently used
// dropped); a step of n rows runs the smallest bucket >= n, padding the rest. A context's logits in a batch are
// byte-identical to the same context decoded alone (DecodeContext::Decode).
//
// Not thread-safe: one per worker. Contexts stay owned by their sessions.
class BatchDecoder {
 public:
  virtual ~BatchDecoder() = default;

  // Appends tokens[i] to contexts[i] for every i and returns their logits
  // [n, vocab] f32 row-major, valid until the next call. INVALID_ARGUMENT: no
  // contexts, more than max_batch(), sizes that differ, a context twice or of
  // another model, a token outside the vocabulary; RESOURCE_EXHAUSTED: a full
  // context. Nothing is written to any context on error.
  virtual absl::StatusOr<absl::Span<const float>> Decode(absl::Span<DecodeContext* const> contexts,
                                                         absl::Span<const int32_t> tokens, Executor& executor) = 0;

  // A mixed step: every span's tokens in one plan run of as many rows (a
  // decode row is a span of one token, a prefill chunk a span of many), at
  // most max_step_tokens() in all. Returns the spans' logits rows in span
  // order, [rows, vocab] f32 row-major (SpanLogits says how many rows each
  // span has: 0, 1 or its length), valid until the next call. A span's rows
  // are byte-identical to its tokens decoded alone one at a time, whatever
  // the other spans: each row's arithmetic is independent of the others.
  // INVALID_ARGUMENT: no spans, an empty span, a context twice or of another
  // model, more tokens than max_step_tokens(), a token outside the
  // vocabulary; RESOURCE_EXHAUSTED: a span that does not fit its context.
  // Nothing is written to any context on error.
  virtual absl::StatusOr<absl::Span<const float>> Step(absl::Span<const StepSpan> spans, Executor& executor) = 0;

  virtual int32_t max_batch() const = 0;
  // Rows one Step may run: max(max_batch, the max_step_tokens it was made for).
  virtual int32_t max_step_tokens() const { return max_batch(); }
  // Rows of the plan a step of n rows runs (the smallest bucket >= n).
  virtual int32_t plan_rows(int32_t n) const = 0;
  // Drops every held plan and its bindings (rebuilt on the next Decode).
  virtual void Release() = 0;
  // Data-node bindings the held plans keep.
  virtual int64_t bound_nodes() const = 0;
};

// Largest --max_batch accepted.
inline constexpr int32_t kMaxBatch = 64;
// Largest --max_step_tokens accepted.
inline constexpr int32_t kMaxStepTokens = 2048;

// The plan sizes a BatchDecoder of `max_rows` rows keeps: 1, 2, 3, 4, 6, 8,
// 12, 16, then steps of 1.5x and 1.33x alternately (24, 32, 48, 64, 96, 128,
// ...) below max_rows, and max_rows itself. A step pads to the next bucket,
// so no step runs more than a third of its rows as padding beyond 4 rows,
// while a worker holds a plan per size it used (a few dozen at most).
std::vector<int32_t> BatchBuckets(int32_t max_rows);

// A CPU executor (CpuBackend().CreateExecutor) with `threads` compute threads (>= 1). With `lent_threads`,
// each parallel region runs on max(1, threads - *lent_threads) of them (read
// as the region starts): threads lent to host work beside the team (see
// EngineOptions::lend_threads_to_host_work). Outputs do not depend on how
// many run a region: every kernel gives each output row the same arithmetic
// whatever the split.
std::unique_ptr<Executor> CreateCpuExecutor(int threads, const std::atomic<int>* lent_threads = nullptr);

// Process-wide engine counters (EngineCounters, GetEngineCounters()) come
// from engine/engine_counters.h.


}  // namespace decoded

#endif  // DECODED_ENGINE_RUNTIME_H_
