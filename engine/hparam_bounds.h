// Sanity bounds on the hyper-parameters a model file states.
//
// A model file is untrusted input: a count such as block_count = 2^31 - 1
// would otherwise size per-layer vectors before any tensor is looked at. Each
// bound sits well above every published model (the largest value known to us
// is given beside it), so a real model never meets one, while their product
// stays far from int64 overflow: 2 (K, V) * kMaxLayers * kMaxHeads *
// kMaxHeadDim * kMaxContextLength * 4 bytes = 2^59 < 2^63. Counts and widths
// are further cross-checked against the tensors present (engine/hparams.h);
// these bounds only have to be sane, not tight.
#ifndef DECODED_ENGINE_HPARAM_BOUNDS_H_
#define DECODED_ENGINE_HPARAM_BOUNDS_H_

#include <cstdint>
#include <limits>

namespace decoded::hparam_bounds {

// Transformer blocks. Largest published: 126 (Llama 3.1 405B).
inline constexpr int64_t kMaxLayers = 1024;
// Residual-stream and feed-forward widths. Largest published: hidden 16384,
// FFN 53248 (Llama 3.1 405B).
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;
// Attention heads (query or key/value). Largest published: 128.
inline constexpr int64_t kMaxHeads = 1024;
// Size of one attention head. Largest published: 256 (Gemma).
inline constexpr int64_t kMaxHeadDim = 4096;
// Trained context in tokens. Largest published: 10M (Llama 4 Scout).
inline constexpr int64_t kMaxContextLength = int64_t{1} << 24;
// Vocabulary entries. Largest published: 262144 (Gemma 3).
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;

// Floats are applied in float32 (norm epsilons, RoPE tables, softcaps,
// attention scales), so a finite double beyond this would become inf there.
inline constexpr double kMaxFloat32 = std::numeric_limits<float>::max();
// Smallest positive normal float32: a smaller norm epsilon rounds to a
// denormal or 0 in float32 and no longer keeps 1 / sqrt(mean + eps) finite.
inline constexpr double kMinNormalFloat32 = std::numeric_limits<float>::min();

}  // namespace decoded::hparam_bounds

#endif  // DECODED_ENGINE_HPARAM_BOUNDS_H_
