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

// Host-side data of one step, before it becomes a baked constant (D1) or an
// upload (D2). A step is `seq` token rows; each row carries its token, its
// absolute position (which is also the KV row it writes), and the KV cache it
// reads and writes: one session's cache for every row of a prefill chunk,
// one cache per row in a batched decode step. Buffers keep their capacity
// across steps: refilling for the same seq does not allocate.
struct DecodeTokenHost {
  int32_t seq = 0;
  std::vector<int32_t> token_ids;   // i32 [1, seq]
  std::vector<int32_t> positions;   // i32 [1, seq]: absolute position of each row == the KV row it writes
  std::vector<float> rope_cos;      // f32 [n_rope_variants * seq, rot_dims / 2]
  std::vector<float> rope_sin;      // f32 [n_rope_variants * seq, rot_dims / 2]
  std::vector<int32_t> mask;        // i32 [n_mask_variants * seq, 2]: visible keys [lo, hi)
  std::vector<int64_t> kv_rows;     // i64 [seq, KvRowStride(n_layers)]: each row's cache (engine/kv_rows.h)
  // i32 [1, n_outputs]: the rows whose logits the step computes, in output
  // order; empty: every row (D1 without all_logits: the last). Set by the
  // driver for a held plan of fewer outputs than rows.
  std::vector<int32_t> output_rows;
};

// The mask of every MaskPlan variant for query rows at `positions`, stored as
// key bounds over the live range rather than a dense
// [n_variants, 1, seq, max_seq_len] matrix: query at position p of a variant
// with window w sees keys j with p - w < j <= p (w == 0: 0 <= j <= p), so its
// row is [max(0, p - w + 1), p + 1). Nothing here scales with the capacity.
// `out` holds n_variants * positions.size() * 2 entries, variant-major.
void build_decode_mask_variants(const MaskPlan& mask_plan, absl::Span<const int32_t> positions, int32_t* out);

// Fills the position-derived data of `host` for `tokens`, row i at
// positions[i]: ids, RoPE cos/sin per RopePlan variant (angle = (pos *
// freq_scale) * inv_freq in f32, as HF computes it; both tables times the
// variant's attention_factor), masks. Leaves kv_rows to the caller (it comes
// from the KV caches, not from math). INVALID_ARGUMENT for an empty token
// list or a positions list of another length.
absl::Status compute_decode_token_host(const MaskPlan& mask_plan, const RopePlan& rope_plan,
                                       absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions,
                                       DecodeTokenHost* host);

// The contiguous case (a prefill chunk): row i at position pos0 + i.
absl::Status compute_decode_token_host(const MaskPlan& mask_plan, const RopePlan& rope_plan,
                                       absl::Span<const int32_t> tokens, int32_t pos0, DecodeTokenHost* host);

}  // namespace decoded

#endif  // DECODED_ENGINE_DECODE_TOKEN_HOST_H_
