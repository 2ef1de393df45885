// Qwen3-MoE (HF models/qwen3_moe/modeling_qwen3_moe.py): Qwen3's attention
// (per-head q/k RMSNorm before NEOX RoPE, no biases, head size its own key)
// with every layer's MLP replaced by routed SwiGLU experts
// (models/moe_ffn.h): softmax router, top expert_used_count experts,
// weights renormalized (HF norm_topk_prob; llama.cpp's qwen3moe graph fixes
// it on and its converter writes no key, so true unless the file says
// <arch>.expert_weights_norm). Layers that keep a dense MLP (HF
// mlp_only_layers, decoder_sparse_step > 1) are not in llama.cpp's format and
// are refused by the missing expert tensors.
#include "models/llama_style.h"

namespace decoded {
namespace {

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateQwen3Moe(std::shared_ptr<const Weights> weights,
                                                            const FamilyOptions& options) {
  static const LlamaStyleSpec* spec = new LlamaStyleSpec{.arch = "qwen3moe",
                                                         .rope_pairing = RopePairing::kNeox,
                                                         .qk_norm = true,
                                                         .ffn = LlamaFfn::kMoeSwiGlu,
                                                         .moe_norm_topk_prob = true};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("qwen3moe", CreateQwen3Moe);

}  // namespace decoded
