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
#ifndef DECODED_ENGINE_KV_LAYOUT_H_
#define DECODED_ENGINE_KV_LAYOUT_H_

#include <cstdint>

namespace decoded {

struct KvLayout {
  int32_t n_kv_heads = 0;
  int32_t k_dim = 0;     // K row per kv head (floats)
  int32_t v_dim = 0;     // value width attention reads per kv head (floats)
  bool v_in_k = false;   // no V slot: the value is the first v_dim columns of the K row (v_dim <= k_dim)

  static KvLayout Separate(int32_t n_kv_heads, int32_t head_dim) { return {n_kv_heads, head_dim, head_dim, false}; }
  static KvLayout SharedLatent(int32_t k_dim, int32_t v_dim) { return {1, k_dim, v_dim, true}; }

  // Floats one token occupies in one layer (K slot plus V slot, if any).
  int64_t floats_per_token() const {
    return static_cast<int64_t>(n_kv_heads) * (static_cast<int64_t>(k_dim) + (v_in_k ? 0 : v_dim));
  }
  bool operator==(const KvLayout&) const = default;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_KV_LAYOUT_H_
