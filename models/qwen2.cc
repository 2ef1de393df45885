// Qwen2 / Qwen2.5 (HF models/qwen2/modeling_qwen2.py): the Llama layer with
// q/k/v biases and rotate-half (NEOX) RoPE. Qwen2's sliding window is off in
// every released model (use_sliding_window = false) and not in its GGUF.
#include "models/llama_style.h"

namespace decoded {
namespace {

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateQwen2(std::shared_ptr<const Weights> weights,
                                                         const FamilyOptions& options) {
  static const LlamaStyleSpec* spec = new LlamaStyleSpec{"qwen2", RopePairing::kNeox, true};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("qwen2", CreateQwen2);

}  // namespace decoded
