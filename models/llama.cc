// Llama 1/2/3 (3.1+ with its frequency scaling, rope_freqs.weight), SmolLM2:
// GGUF arch "llama". Q/K rows come permuted by llama.cpp's converter, so RoPE
// rotates adjacent pairs; q/k/v biases are bound when the file has them.
#include "models/llama_style.h"

namespace decoded {
namespace {

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateLlama(std::shared_ptr<const Weights> weights,
                                                         const FamilyOptions& options) {
  static const LlamaStyleSpec* spec = new LlamaStyleSpec{"llama", RopePairing::kAdjacent, false};
  return CreateLlamaStyle(*spec, std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("llama", CreateLlama);

}  // namespace decoded
