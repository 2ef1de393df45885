// The hyper-parameters every decoder-only transformer family reads the same
// way (llama.cpp's LLM_KV_* keys under "<arch>."): layer count, widths, head
// counts and head size, each bounded and checked against the others before
// anything is sized by it. A family reads these first, then its own keys.
#ifndef DECODED_MODELS_TRANSFORMER_DIMS_H_
#define DECODED_MODELS_TRANSFORMER_DIMS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/decode_plans.h"
#include "engine/hparams.h"

namespace decoded {

// Fills d.n_layers (block_count), d.hidden (embedding_length), *ffn
// (feed_forward_length), d.n_heads (attention.head_count), d.n_kv_heads
// (attention.head_count_kv, default n_heads, a divisor of it: GQA groups),
// d.head_dim (attention.key_length, default hidden / n_heads, even: RoPE
// rotates pairs) and checks attention.value_length equals the head size (one
// head size per model). INVALID_ARGUMENT naming the key otherwise.
absl::Status ReadTransformerDims(const HParams& hp, DecodeDims& d, int32_t* ffn);

// The tensors around the layers.
struct EmbeddingAndOutput {
  const WeightTensor* tok_embd = nullptr;     // token_embd.weight [vocab, hidden]
  const WeightTensor* output = nullptr;       // output.weight [vocab, hidden], or tok_embd when tied
  const WeightTensor* output_norm = nullptr;  // output_norm.weight [1, hidden]
};

// Binds them after ReadTransformerDims and sets d.vocab from token_embd's
// rows (at most hparam_bounds::kMaxVocab, equal to <arch>.vocab_size when
// that key is present). INVALID_ARGUMENT naming the tensor or key otherwise.
absl::StatusOr<EmbeddingAndOutput> BindEmbeddingAndOutput(const HParams& hp, const Weights& weights,
                                                          DecodeDims& d);

}  // namespace decoded

#endif  // DECODED_MODELS_TRANSFORMER_DIMS_H_
