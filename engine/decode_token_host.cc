#include "engine/decode_token_host.h"

#include <algorithm>
#include <cmath>

namespace decoded {

void build_decode_mask_variants(const MaskPlan& mask_plan, absl::Span<const int32_t> positions, int32_t* out) {
  const int64_t seq = static_cast<int64_t>(positions.size());
  for (int32_t v = 0; v < mask_plan.n_variants(); ++v) {
    const int32_t w = mask_plan.window(v);
    for (int64_t i = 0; i < seq; ++i) {
      const int32_t p = positions[static_cast<size_t>(i)];
      int32_t* row = out + (v * seq + i) * 2;
      row[0] = w > 0 ? std::max(0, p - w + 1) : 0;
      row[1] = p + 1;
    }
  }
}

absl::Status compute_decode_token_host(const MaskPlan& mask_plan, const RopePlan& rope_plan,
                                       absl::Span<const int32_t> tokens, absl::Span<const int32_t> positions,
                                       DecodeTokenHost* host) {
  if (tokens.empty()) return absl::InvalidArgumentError("a step needs at least one token");
  if (positions.size() != tokens.size()) {
    return absl::InvalidArgumentError("a step needs one position per token");
  }
  const int32_t seq = static_cast<int32_t>(tokens.size());
  const int32_t half = rope_plan.rot_dims() / 2;
  host->seq = seq;
  // `tokens` and `positions` may be host's own vectors (the driver fills
  // them in place); assigning a vector from itself is undefined.
  if (tokens.data() != host->token_ids.data()) host->token_ids.assign(tokens.begin(), tokens.end());
  if (positions.data() != host->positions.data()) host->positions.assign(positions.begin(), positions.end());

  const size_t rope_n = static_cast<size_t>(std::max(rope_plan.n_variants(), 1)) * seq * half;
  host->rope_cos.resize(rope_n);
  host->rope_sin.resize(rope_n);
  for (int32_t v = 0; v < rope_plan.n_variants(); ++v) {
    const std::vector<float>& inv = rope_plan.inv_freq(v);
    const float scale = static_cast<float>(rope_plan.variant(v).freq_scale);
    const float attention_factor = static_cast<float>(rope_plan.variant(v).attention_factor);
    for (int32_t i = 0; i < seq; ++i) {
      const float pos = static_cast<float>(host->positions[static_cast<size_t>(i)]) * scale;
      float* c = host->rope_cos.data() + (static_cast<size_t>(v) * seq + i) * half;
      float* s = host->rope_sin.data() + (static_cast<size_t>(v) * seq + i) * half;
      for (int32_t d = 0; d < half; ++d) {
        const float angle = pos * inv[static_cast<size_t>(d)];
        // HF: emb.cos() * attention_scaling, each rounded to float32.
        c[d] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
        s[d] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
      }
    }
  }
  host->mask.resize(static_cast<size_t>(mask_plan.n_variants()) * seq * 2);
  build_decode_mask_variants(mask_plan, host->positions, host->mask.data());
  return absl::OkStatus();
}

absl::Status compute_decode_token_host(const MaskPlan& mask_plan, const RopePlan& rope_plan,
                                       absl::Span<const int32_t> tokens, int32_t pos0, DecodeTokenHost* host) {
  host->positions.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) host->positions[i] = pos0 + static_cast<int32_t>(i);
  return compute_decode_token_host(mask_plan, rope_plan, tokens, host->positions, host);
}

}  // namespace decoded
