// The RoPE scaling a GGUF states in its <arch>.rope.scaling.* keys, as
// llama.cpp's convert_hf_to_gguf.py writes them from HF's rope_scaling /
// rope_parameters (conversion/base.py TextModel.set_gguf_parameters) and its
// loader reads them (src/llama-model.cpp, llama-context.cpp):
//   rope.scaling.type                     "none", "linear" or "yarn"; absent:
//                                         linear (llama.cpp's default), which
//                                         without a factor scales nothing;
//   rope.scaling.factor                   HF factor (0 or absent: 1);
//   rope.scaling.original_context_length  HF original_max_position_embeddings
//                                         (absent: <arch>.context_length, as
//                                         llama.cpp falls back);
//   rope.scaling.yarn_beta_fast / _slow   HF beta_fast / beta_slow (absent or
//                                         0: 32 / 1, as HF's `or` defaults);
//   rope.scaling.yarn_attn_factor         HF attention_factor, stated;
//   rope.scaling.yarn_ext_factor          HF extrapolation_factor; only 1 (the
//                                         paper's and HF's blend) is modelled;
//   rope.scaling.yarn_log_multiplier      family-specific (deepseek2: 0.1 x
//                                         HF mscale_all_dim); returned as read;
//   rope.scaling.attn_factor              llama.cpp's extra cos/sin multiplier
//                                         (Phi-3 LongRoPE); only 1 is modelled.
// Llama 3.1's frequency scaling is not a type here: the converter writes it as
// the tensor rope_freqs.weight (models/llama_style.h).
#ifndef DECODED_MODELS_ROPE_SCALING_H_
#define DECODED_MODELS_ROPE_SCALING_H_

#include <optional>

#include "absl/status/statusor.h"
#include "engine/hparams.h"
#include "engine/rope_yarn.h"

namespace decoded {

struct RopeScaling {
  enum class Type : uint8_t { kNone, kLinear, kYarn };
  Type type = Type::kNone;
  double factor = 1.0;  // kLinear: positions are multiplied by 1 / factor
  YarnScaling yarn;     // kYarn
  // kYarn: rope.scaling.yarn_attn_factor, when the file states it.
  std::optional<double> yarn_attn_factor;
  // kYarn: rope.scaling.yarn_log_multiplier, when the file states it.
  std::optional<double> yarn_log_multiplier;
};

// Reads the keys above for `hp`'s architecture; `context_length` is the
// already-read <arch>.context_length (the original context's fallback).
// UNIMPLEMENTED naming the key for another type (e.g. "longrope"), an
// extrapolation factor other than 1 or an attn_factor other than 1;
// INVALID_ARGUMENT naming the key for a value out of range (factor outside
// [1/1024, 1024], a YaRN file without a factor, a non-positive beta or
// attention factor, an original context outside [1, context bound]).
absl::StatusOr<RopeScaling> ReadRopeScaling(const HParams& hp, int32_t context_length);

}  // namespace decoded

#endif  // DECODED_MODELS_ROPE_SCALING_H_
