// What the scheduler needs from a model: contexts to step, the vocabulary
// size, which ids end generation, a per-turn UTF-8-safe text decoder, and the
// chat template's tokenization of a whole conversation.
//
// The scheduler sees a model only through this interface, so its semantics
// (fairness, cancellation, closing) are testable with a scripted fake; the
// Engine adapts the real Model + Tokenizer to it (engine.cc).
#ifndef DECODED_ENGINE_SERVING_SERVING_MODEL_H_
#define DECODED_ENGINE_SERVING_SERVING_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/runtime.h"
#include "engine/chat/chat_message.h"

namespace decoded::serving {

// Token ids -> text pieces that never split a UTF-8 code point (see
// IncrementalDetokenizer). One per turn; not thread-safe.
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual std::string Push(int32_t id) = 0;  // text completed by `id` (may be "")
  virtual std::string Flush() = 0;           // held-back bytes, invalid ones as U+FFFD
};

// The KV block pool's size and use (engine/kv_pool.h).
struct KvBlockCounts {
  int32_t block_tokens = 0;  // positions per block; 0: no pool
  int32_t groups = 1;        // layer groups (engine/kv_groups.h): a position range takes one block of each
  int32_t total = 0;
  int32_t free = 0;
  int32_t cached_free = 0;  // of the free ones, those holding a cached prefix
};

// Prefix caching: the registered block ranges of a context's KV cache, in
// position order (KvPool::PrefixBlock); the next full range registers after
// the last.
using PrefixChain = std::vector<KvPool::PrefixBlock>;

// Thread-safe; shared by all workers.
class ServingModel {
 public:
  virtual ~ServingModel() = default;
  virtual int32_t vocab_size() const = 0;
  virtual bool IsEndOfGeneration(int32_t id) const = 0;
  virtual std::unique_ptr<TextDecoder> NewTextDecoder() const = 0;
  // As Model::NewContext.
  virtual absl::StatusOr<std::unique_ptr<DecodeContext>> NewContext(int32_t max_seq_len) const = 0;
  // The ids of a whole conversation rendered by the model's chat template and
  // followed by its generation prompt (the opening of the model's reply),
  // with a BOS exactly where the template writes one. FAILED_PRECONDITION
  // when the model has no usable template; INVALID_ARGUMENT when the template
  // rejects the conversation (e.g. roles that do not alternate).
  virtual absl::StatusOr<std::vector<int32_t>> EncodeConversation(absl::Span<const ChatMessage> messages) const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the vocabulary has none
  // A worker's batched decoder for decode steps of up to `max_batch`
  // contexts and mixed steps of up to max(max_batch, max_step_tokens) tokens
  // (Model::NewBatchDecoder for the real model). The default steps each span
  // alone, a one-token span through DecodeContext::Decode and a longer one
  // through DecodeContext::Prefill, and gathers the rows: what a scripted
  // fake's contexts support. INVALID_ARGUMENT unless
  // 1 <= max_batch <= kMaxBatch and 0 <= max_step_tokens <= kMaxStepTokens.
  virtual absl::StatusOr<std::unique_ptr<BatchDecoder>> NewBatchDecoder(int32_t max_batch,
                                                                        int32_t max_step_tokens = 0) const;
  // The health of the device the model runs on (Backend::health: UNAVAILABLE
  // once a GPU was lost, for good). OK for a model without a device.
  virtual absl::Status health() const { return absl::OkStatus(); }
  // Backend::prefill_depends_on_chunk_rows of the device the model runs on.
  virtual bool prefill_depends_on_chunk_rows() const { return false; }
  // Paged KV: the pool of blocks the contexts from NewContext share, now.
  // block_tokens == 0 when each context reserves a contiguous cache.
  virtual KvBlockCounts kv_blocks() const { return {}; }
  // Paged KV: the pool blocks that would be free once every context of
  // `contexts` gave its blocks back (KvPool::FreedByGiving): a block they
  // share counts once, a block another context also reads not at all. The
  // default (no sharing) sums their kv_blocks().
  virtual int32_t KvBlocksFreedByReleasing(absl::Span<const DecodeContext* const> contexts) const;
  // Gives the memory of KV blocks freed since the last call back
  // (KvPool::Trim); the scheduler's trimmer calls it after sessions go.
  virtual void TrimKv() const {}
  // Prefix caching (KvPool::LookupPrefix): maps the longest run of cached
  // blocks that `tokens` (a context's tokens from position 0) starts with
  // into `ctx`, which must hold nothing, and appends them to *chain.
  // Returns the tokens mapped (whole blocks); 0 without a pool.
  virtual int32_t AdoptCachedPrefix(DecodeContext& ctx, absl::Span<const int32_t> tokens, PrefixChain* chain) const {
    return 0;
  }
  // Registers `ctx`'s full block ranges from chain->size() on
  // (KvPool::RegisterPrefix): `tokens` are their tokens, block_tokens of them
  // per range, in order.
  virtual void CachePrefix(const DecodeContext& ctx, absl::Span<const int32_t> tokens, PrefixChain* chain) const {}
};

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_SERVING_MODEL_H_
