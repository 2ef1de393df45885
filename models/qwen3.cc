// Qwen3 dense (HF models/qwen3/modeling_qwen3.py): the Llama layer with an
// RMSNorm over every q and k head before RoPE (attn_q_norm / attn_k_norm,
// [head_dim]), rotate-half (NEOX) RoPE and no biases. The head size is its own
// key (attention.key_length; Qwen3-0.6B: 16 heads of 128 over a hidden 1024),
// so q is wider than the residual stream. Qwen3's sliding window is off in
// every released model (use_sliding_window = false) and not in its GGUF.
#include "models/llama_style.h"

namespace decoded {
namespace {

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateQwen3(std::shared_ptr<const Weights> weights,
                                                         const FamilyOptions& options) {
  static const LlamaStyleSpec* spec =
      new LlamaStyleSpec{.arch = "qwen3", .rope_pairing = RopePairing::kNeox, .qk_norm = true};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("qwen3", CreateQwen3);

}  // namespace decoded
