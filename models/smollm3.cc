// SmolLM3 (HF transformers models/smollm3/modeling_smollm3.py): the Llama
// layer (GQA, SwiGLU, tied output) with no positional encoding on every 4th
// layer (NoPE; HF no_rope_layers from no_rope_layer_interval = 4). GGUF arch
// "smollm3": llama.cpp's converter writes it as a Llama (Q/K rows permuted,
// so RoPE rotates adjacent pairs) and states no NoPE key; llama.cpp's loader
// fixes the interval at 4 (n_no_rope_layer_step), and so does this file.
#include "models/llama_style.h"

namespace decoded {
namespace {

constexpr int32_t kNoRopeLayerInterval = 4;

// Layers 3, 7, 11, ... (1-based every 4th) attend without RoPE.
bool SmolLM3RopeOnLayer(int32_t layer) { return (layer + 1) % kNoRopeLayerInterval != 0; }

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateSmolLM3(std::shared_ptr<const Weights> weights,
                                                           const FamilyOptions& options) {
  static const LlamaStyleSpec* spec =
      new LlamaStyleSpec{"smollm3", RopePairing::kAdjacent, /*qkv_bias_required=*/false, &SmolLM3RopeOnLayer};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("smollm3", CreateSmolLM3);

}  // namespace decoded
