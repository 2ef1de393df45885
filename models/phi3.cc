// Phi-3 / Phi-3.5 mini and medium (HF models/phi3/modeling_phi3.py): the Llama
// layer as stored fused: attn_qkv holds [q; k; v] rows and ffn_up holds
// [gate; up] (HF qkv_proj and gate_up_proj, which llama.cpp's converter keeps
// unsplit), rotate-half (NEOX) RoPE, and HF's sliding window over every layer
// when attention.sliding_window is non-zero (Phi-3-mini-4k: 2047).
// Refused: LongRoPE (rope_factors_long/short, the 128k models) and partial
// rotary (rope.dimension_count below the head size, Phi-4-mini).
#include "models/llama_style.h"

namespace decoded {
namespace {

absl::StatusOr<std::unique_ptr<DecodeModel>> CreatePhi3(std::shared_ptr<const Weights> weights,
                                                        const FamilyOptions& options) {
  static const LlamaStyleSpec* spec = new LlamaStyleSpec{
      .arch = "phi3", .rope_pairing = RopePairing::kNeox, .fused_gate_up = true, .sliding_window = true};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("phi3", CreatePhi3);

}  // namespace decoded
