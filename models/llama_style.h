// The Llama-style decoder layer shared by families that differ from Llama
// only in data a GGUF states: pre-norm attention (GQA, RoPE) and a SwiGLU FFN,
// each with RMSNorm, residual adds, final RMSNorm and a (possibly tied) output
// projection (HF transformers models/llama/modeling_llama.py).
//
// A family file (models/llama.cc, models/qwen2.cc, models/smollm3.cc) states
// what differs as a LlamaStyleSpec and registers a factory that calls
// CreateLlamaStyle.
#ifndef DECODED_MODELS_LLAMA_STYLE_H_
#define DECODED_MODELS_LLAMA_STYLE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/decode_model.h"
#include "engine/model_registry.h"

namespace decoded {

struct LlamaStyleSpec {
  // GGUF general.architecture; also the prefix of its hyper-parameter keys.
  std::string arch;
  // llama.cpp's converter permutes Q/K rows for arch "llama" (adjacent
  // pairing, LLAMA_ROPE_TYPE_NORM); qwen2 keeps HF's rotate-half (NEOX).
  RopePairing rope_pairing = RopePairing::kAdjacent;
  // blk.N.attn_{q,k,v}.bias: required (Qwen2) or bound when present (Llama
  // with attention_bias).
  bool qkv_bias_required = false;
  // Which layers rotate q and k: null means every layer; otherwise a layer
  // for which it returns false is a NoPE layer (its RopePlan entry does no
  // rotation). SmolLM3: every 4th layer.
  bool (*rope_on_layer)(int32_t layer) = nullptr;
};

// Reads the hyper-parameters of `spec.arch`, binds and shape-checks every
// tensor. INVALID_ARGUMENT naming the key or tensor for a malformed file;
// UNIMPLEMENTED for features the layer does not model (Llama 3 frequency
// scaling, partial rotary, an attention output bias).
absl::StatusOr<std::unique_ptr<DecodeModel>> CreateLlamaStyle(const LlamaStyleSpec& spec,
                                                              std::shared_ptr<const Weights> weights,
                                                              const FamilyOptions& options);

}  // namespace decoded

#endif  // DECODED_MODELS_LLAMA_STYLE_H_
