// The Llama-style decoder layer shared by families that differ from Llama
// only in data a GGUF states: pre-norm attention (GQA, RoPE) and a SwiGLU FFN,
// each with RMSNorm, residual adds, final RMSNorm and a (possibly tied) output
// projection (HF transformers models/llama/modeling_llama.py).
//
// A family file (models/llama.cc, qwen2.cc, qwen3.cc, qwen3moe.cc, phi3.cc, smollm3.cc,
// glm4.cc)
// states what differs as a LlamaStyleSpec and registers a factory that calls
// CreateLlamaStyle. What every family accepts from its file:
//   - q/k/v as separate attn_{q,k,v}.weight or fused as attn_qkv.weight
//     ([q; k; v] rows, as llama.cpp's converter writes Phi-3 and fused-QKV
//     conversions; split in place), their biases in either layout too
//     (models/qkv_weights.h);
//   - Llama 3.1 RoPE frequency scaling as rope_freqs.weight [rot_dims / 2]
//     (the per-frequency divisors llama.cpp's converter derives from HF's
//     rope_type "llama3"), applied through RopeLayer::freq_factors;
//   - linear RoPE scaling (rope.scaling.type = "linear");
//   - YaRN (rope.scaling.type = "yarn", factor, original_context_length,
//     yarn_beta_fast / yarn_beta_slow, yarn_attn_factor; models/rope_scaling.h)
//     as HF's _compute_yarn_parameters: blended frequencies and cos/sin times
//     the attention factor (RopeLayer::yarn, RopeLayer::attention_factor).
//     llama.cpp's loaders for these architectures ignore the beta and
//     attention-factor keys (they use 32 / 1 and 0.1 ln(factor) + 1); HF and
//     this layer honour them.
#ifndef DECODED_MODELS_LLAMA_STYLE_H_
#define DECODED_MODELS_LLAMA_STYLE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/decode_model.h"
#include "engine/model_registry.h"

namespace decoded {

// The FFN after the attention block.
enum class LlamaFfn : uint8_t {
  kSwiGlu,     // one SwiGLU MLP: ffn_gate / ffn_up / ffn_down
  kMoeSwiGlu,  // routed SwiGLU experts (models/moe_ffn.h): ffn_gate_inp and ffn_{gate,up,down}_exps
};

struct LlamaStyleSpec {
  // GGUF general.architecture; also the prefix of its hyper-parameter keys.
  std::string arch;
  // llama.cpp's converter permutes Q/K rows for arch "llama" (adjacent
  // pairing, LLAMA_ROPE_TYPE_NORM); qwen2 keeps HF's rotate-half (NEOX).
  RopePairing rope_pairing = RopePairing::kAdjacent;
  // q/k/v biases (blk.N.attn_{q,k,v}.bias, or attn_qkv.bias beside a fused
  // attn_qkv.weight): required (Qwen2) or bound when present (Llama with
  // attention_bias).
  bool qkv_bias_required = false;
  // Which layers rotate q and k: null means every layer; otherwise a layer
  // for which it returns false is a NoPE layer (its RopePlan entry does no
  // rotation). SmolLM3: every 4th layer.
  bool (*rope_on_layer)(int32_t layer) = nullptr;
  // blk.N.attn_{q,k}_norm.weight [head_dim]: RMSNorm of every q and k head
  // between projection and RoPE (Qwen3). Required when set; a family without
  // it refuses the tensors (UNIMPLEMENTED).
  bool qk_norm = false;
  // blk.N.ffn_up.weight holds [gate; up] (2 x feed_forward_length rows) and
  // there is no ffn_gate: HF's gate_up_proj as llama.cpp's converter keeps it
  // (Phi-3).
  bool fused_gate_up = false;
  // <arch>.attention.sliding_window (absent or 0: none) windows every layer:
  // a query at position p sees keys p - w < j <= p, as HF's Phi-3 applies
  // config.sliding_window (llama.cpp's phi3 loader ignores it).
  bool sliding_window = false;
  // <arch>.rope.dimension_count may be below the head size: only its leading
  // dimensions rotate (RopePlan::rot_dims), paired by rope_pairing within
  // them, with frequencies spread over the rotated dimensions as HF's
  // partial_rotary_factor does (GLM-4: half of each head). A family without
  // it refuses such a file (UNIMPLEMENTED).
  bool partial_rotary = false;
  // blk.N.post_attention_norm.weight and blk.N.post_ffw_norm.weight [hidden]:
  // RMSNorm of the attention output (after attn_output) and of the FFN output
  // (after ffn_down), each before its residual add ("sandwich" norms, GLM-4's
  // post_self_attn_layernorm / post_mlp_layernorm). Required when set; a
  // family without them refuses the tensors (UNIMPLEMENTED).
  bool post_norms = false;
  LlamaFfn ffn = LlamaFfn::kSwiGlu;
  // kMoeSwiGlu: whether the k routing weights are renormalized when the file
  // has no <arch>.expert_weights_norm (llama.cpp fixes it per architecture).
  bool moe_norm_topk_prob = true;
};

// Reads the hyper-parameters of `spec.arch`, binds and shape-checks every
// tensor. INVALID_ARGUMENT naming the key or tensor for a malformed file
// (including rope_freqs.weight values outside [1/1024, FLT_MAX]); NOT_FOUND
// naming a missing tensor; UNIMPLEMENTED naming the key or tensor for features
// the layer does not model (scaling types other than none, linear and yarn,
// ReadRopeScaling's refusals, YaRN's yarn_log_multiplier (DeepSeek's mscale)
// or YaRN beside rope_freqs.weight, Phi-3 LongRoPE
// rope_factors_{long,short}, attention-output / FFN biases, and partial
// rotary, q/k norms or post norms in a family without them); for an MoE FFN,
// what ReadMoeFfnConfig and BindMoeFfn refuse (models/moe_ffn.h).
absl::StatusOr<std::unique_ptr<DecodeModel>> CreateLlamaStyle(const LlamaStyleSpec& spec,
                                                              std::shared_ptr<const Weights> weights,
                                                              const FamilyOptions& options);

}  // namespace decoded

#endif  // DECODED_MODELS_LLAMA_STYLE_H_
