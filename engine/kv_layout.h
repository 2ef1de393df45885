// What one token occupies in one layer's KV cache: the row geometry of the
// K and V slots, stated by the family (DecodeDims::kv_layout()) and sized by
// KvCache.
//
// Two shapes cover the families here:
//   Separate(n_kv_heads, head_dim)  K and V slots of n_kv_heads rows of
//       head_dim each (MHA, GQA, MQA);
//   SharedLatent(k_dim, v_dim)      one row of k_dim in the K slot and no V
//       slot: attention reads its value as the first v_dim columns of the K
//       row. Multi-head latent attention (DeepSeek-V2) caches exactly this:
//       the normed kv latent [kv_lora_rank] followed by the rotated shared
//       k_rope [qk_rope_head_dim], and up-projects per head at attention time.
//
// and one element type for both slots (`--kv_type`; the family states f32,
// the model's load options choose):
//   f32   4 bytes per element;
//   f16   IEEE binary16, rounded to nearest even (2 bytes);
//   q8_0  GGML's Q8_0 blocks (GGUF spec; ggml-common.h block_q8_0): per 32
//         elements an fp16 scale d = amax / 127 and 32 int8 codes, x = d * q
//         (34 bytes per 32 elements, 1.0625 per element). Needs k_dim and
//         v_dim to be multiples of 32, so that a row and, for SharedLatent,
//         its value part are whole blocks.
// A slot row of `dim` elements takes KvRowBytes(type, dim) bytes; llama.cpp
// offers the same three types for its cache (`--cache-type-k/-v`).
#ifndef DECODED_ENGINE_KV_LAYOUT_H_
#define DECODED_ENGINE_KV_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/dtype.h"

namespace decoded {

// True for the element types a KV cache can hold (f32, f16, q8_0).
inline bool IsKvType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kQ8_0; }

// The KV type a flag names (`--kv_type` of the daemon and the benches):
// "f32", "f16" or "q8_0". INVALID_ARGUMENT "<name>: must be f32, f16 or q8_0"
// for anything else.
inline absl::StatusOr<DType> KvTypeFromName(std::string_view name) {
  if (name == "f32") return DType::kF32;
  if (name == "f16") return DType::kF16;
  if (name == "q8_0") return DType::kQ8_0;
  return absl::InvalidArgumentError(std::string(name) + ": must be f32, f16 or q8_0");
}

// Bytes of one slot row of `dim` elements of KV type `t` (dim a multiple of
// 32 for q8_0).
inline int64_t KvRowBytes(DType t, int64_t dim) {
  switch (t) {
    case DType::kF16: return 2 * dim;
    case DType::kQ8_0: return dim / 32 * 34;
    default: return 4 * dim;
  }
}

struct KvLayout {
  int32_t n_kv_heads = 0;
  int32_t k_dim = 0;     // K row per kv head (floats)
  int32_t v_dim = 0;     // value width attention reads per kv head (floats)
  bool v_in_k = false;   // no V slot: the value is the first v_dim columns of the K row (v_dim <= k_dim)
  DType type = DType::kF32;  // element type of both slots (IsKvType)

  static KvLayout Separate(int32_t n_kv_heads, int32_t head_dim) { return {n_kv_heads, head_dim, head_dim, false}; }
  static KvLayout SharedLatent(int32_t k_dim, int32_t v_dim) { return {1, k_dim, v_dim, true}; }

  // Elements one token occupies in one layer (K slot plus V slot, if any).
  int64_t elements_per_token() const {
    return static_cast<int64_t>(n_kv_heads) * (static_cast<int64_t>(k_dim) + (v_in_k ? 0 : v_dim));
  }
  // Bytes of one K (V) slot row: one kv head of one token.
  int64_t k_row_bytes() const { return KvRowBytes(type, k_dim); }
  int64_t v_row_bytes() const { return v_in_k ? 0 : KvRowBytes(type, v_dim); }
  // Bytes one token occupies in one layer.
  int64_t bytes_per_token() const { return static_cast<int64_t>(n_kv_heads) * (k_row_bytes() + v_row_bytes()); }
  // The same layout holding elements of type `t`.
  KvLayout WithType(DType t) const {
    KvLayout l = *this;
    l.type = t;
    return l;
  }
  // OK to hold as type `t`: an empty string, or why not.
  const char* TypeProblem(DType t) const {
    if (!IsKvType(t)) return "the KV cache holds f32, f16 or q8_0";
    if (t == DType::kQ8_0 && (k_dim % 32 != 0 || v_dim % 32 != 0)) {
      return "a q8_0 KV cache needs the K and V row widths to be multiples of 32";
    }
    return "";
  }
  bool operator==(const KvLayout&) const = default;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_LAYOUT_H_
