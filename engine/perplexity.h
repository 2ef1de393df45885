// Perplexity of a model on a token sequence, as llama.cpp's llama-perplexity
// computes it (tools/perplexity/perplexity.cpp, "kl-divergence off" path):
// the tokens are cut into windows of n_ctx, each window starts a fresh
// context with its first token replaced by BOS where the model adds one
// (Tokenizer::prompt_bos_id), and the second half of each
// window is scored: for i in [n_ctx / 2, n_ctx - 1), -log p(token[i + 1] |
// token[..i]). PPL = exp(mean of those). Each window is prefilled in chunks
// of kMaxPrefillChunk tokens (all logits), so later chunks attend over the
// KV the earlier ones wrote, in the cache's element type: the measure of
// what --kv_type costs in quality.
#ifndef DECODED_ENGINE_PERPLEXITY_H_
#define DECODED_ENGINE_PERPLEXITY_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/runtime.h"

namespace decoded {

struct PerplexityResult {
  double ppl = 0;               // exp(nll / scored)
  double nll = 0;               // sum of -log p over the scored tokens (nats)
  int64_t scored = 0;           // tokens scored
  int32_t windows = 0;          // windows of n_ctx evaluated
  std::vector<double> window_ppl;  // per window, exp of its mean -log p
};

// INVALID_ARGUMENT unless 4 <= n_ctx <= model.info().context_length and
// tokens holds at least one window (n_ctx tokens); tokens past the last whole
// window are ignored. Errors from the model's Prefill pass through.
absl::StatusOr<PerplexityResult> Perplexity(const Model& model, absl::Span<const int32_t> tokens, int32_t n_ctx,
                                            Executor& executor);

}  // namespace decoded

#endif  // DECODED_ENGINE_PERPLEXITY_H_
