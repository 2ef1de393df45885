// Per-token host data of one step, computed in one place for the D1 build,
// the D2 build and every D2 rebind (seed: compute_decode_token_host).
#ifndef DECODED_ENGINE_DECODE_TOKEN_HOST_H_
#define DECODED_ENGINE_DECODE_TOKEN_HOST_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/decode_plans.h"

namespace decoded {

// Host-side data of one step (a prefill chunk of `seq` tokens or one decode
// token), before it becomes a baked constant (D1) or an upload (D2).
// Buffers keep their capacity across steps: refilling for the same seq does
// not allocate.
struct DecodeTokenHost {
  int32_t seq = 0;
  int32_t pos0 = 0;                 // absolute position of the first token
  std::vector<int32_t> token_ids;   // i32 [1, seq]
  std::vector<float> rope_cos;      // f32 [n_rope_variants * seq, rot_dims / 2]
  std::vector<float> rope_sin;      // f32 [n_rope_variants * seq, rot_dims / 2]
  std::vector<int32_t> mask;        // i32 [n_mask_variants * seq, 2]: visible keys [lo, hi)
  int32_t kv_offset = 0;            // first KV row written (== pos0)
};

// The mask of every MaskPlan variant for queries at positions pos0 .. pos0+seq-1,
// stored as key bounds over the live range rather than a dense
// [n_variants, 1, seq, max_seq_len] matrix: query at position p of a variant
// with window w sees keys j with p - w < j <= p (w == 0: 0 <= j <= p), so its
// row is [max(0, p - w + 1), p + 1). Nothing here scales with the capacity.
// `out` holds n_variants * seq * 2 entries.
void build_decode_mask_variants(const MaskPlan& mask_plan, int32_t seq, int32_t pos0, int32_t* out);

// Fills `host` for `tokens` at positions starting at `pos0`: ids, RoPE cos/sin
// per RopePlan variant (angle = (pos * freq_scale) * inv_freq in f32, as HF
// computes it; both tables times the variant's attention_factor), masks, KV
// offset. INVALID_ARGUMENT for an empty token list.
absl::Status compute_decode_token_host(const MaskPlan& mask_plan, const RopePlan& rope_plan,
                                       absl::Span<const int32_t> tokens, int32_t pos0,
                                       DecodeTokenHost* host);

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_TOKEN_HOST_H_
