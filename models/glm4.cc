// GLM-4 (0414) dense models (HF transformers models/glm4/modeling_glm4.py,
// GGUF arch "glm4"): the Llama layer with
//   - partial rotary: rope.dimension_count = head_dim / 2 (HF
//     partial_rotary_factor 0.5), the rotated part paired 2i / 2i+1 (HF's
//     interleaved rotate_half; llama.cpp's converter leaves Q/K unpermuted and
//     runs LLAMA_ROPE_TYPE_NORM), the rest of each head passing through;
//   - sandwich norms: post_attention_norm on the attention output and
//     post_ffw_norm on the FFN output, each before its residual add;
//   - gate_up_proj kept fused in ffn_up ([gate; up]);
//   - q/k/v biases (attention_bias), bound when present as llama.cpp does.
// Refused: GLM-OCR's NextN layers (nextn_predict_layers) and M-RoPE
// (GLM-4V, rope.dimension_sections: its converter permutes Q/K for NEOX).
#include "models/llama_style.h"

namespace decoded {
namespace {

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateGlm4(std::shared_ptr<const Weights> weights,
                                                        const FamilyOptions& options) {
  static const LlamaStyleSpec* spec = new LlamaStyleSpec{.arch = "glm4",
                                                         .rope_pairing = RopePairing::kAdjacent,
                                                         .fused_gate_up = true,
                                                         .partial_rotary = true,
                                                         .post_norms = true};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("glm4", CreateGlm4);

}  // namespace decoded
