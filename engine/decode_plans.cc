#include "engine/decode_plans.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace decoded {
namespace {

// YaRN's own parameters, and YaRN as the only scaling of its layer.
absl::Status ValidateYarn(const YarnScaling& y, const RopeLayer& r, size_t il) {
  auto positive = [](double x) { return x > 0.0 && std::isfinite(x); };
  if (!positive(y.factor) || y.original_context <= 0 || !positive(y.beta_fast) || !positive(y.beta_slow)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RopePlan: layer ", il, " has YaRN factor ", y.factor, ", original context ", y.original_context,
        ", beta_fast ", y.beta_fast, ", beta_slow ", y.beta_slow, "; all must be finite and positive"));
  }
  if (!r.freq_factors.empty() || r.freq_scale != 1.0) {
    return absl::InvalidArgumentError(absl::StrCat("RopePlan: layer ", il,
                                                   " has YaRN beside frequency factors or freq_scale ", r.freq_scale,
                                                   "; YaRN is the layer's only scaling"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MaskPlan> MaskPlan::Create(absl::Span<const int32_t> window_per_layer) {
  if (window_per_layer.empty()) return absl::InvalidArgumentError("MaskPlan: no layers");
  MaskPlan plan;
  for (size_t il = 0; il < window_per_layer.size(); ++il) {
    const int32_t w = window_per_layer[il];
    if (w < 0) {
      return absl::InvalidArgumentError(absl::StrCat("MaskPlan: layer ", il, " has a negative window ", w));
    }
    int32_t v = -1;
    for (size_t k = 0; k < plan.windows_.size(); ++k) {
      if (plan.windows_[k] == w) v = static_cast<int32_t>(k);
    }
    if (v < 0) {
      v = static_cast<int32_t>(plan.windows_.size());
      plan.windows_.push_back(w);
    }
    plan.layer_variant_.push_back(v);
  }
  return plan;
}

absl::StatusOr<RopePlan> RopePlan::Create(absl::Span<const RopeLayer> per_layer, int32_t head_dim,
                                          RopePairing pairing, int32_t rot_dims) {
  if (per_layer.empty()) return absl::InvalidArgumentError("RopePlan: no layers");
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RopePlan: head_dim ", head_dim, " must be positive and even"));
  }
  if (rot_dims == 0) rot_dims = head_dim;
  if (rot_dims < 2 || rot_dims > head_dim || rot_dims % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RopePlan: rot_dims ", rot_dims,
                                                   " must be even and in [2, head_dim = ", head_dim, "]"));
  }
  RopePlan plan;
  plan.head_dim_ = head_dim;
  plan.rot_dims_ = rot_dims;
  plan.pairing_ = pairing;
  for (size_t il = 0; il < per_layer.size(); ++il) {
    const RopeLayer& r = per_layer[il];
    if (!r.enabled) {
      plan.layer_variant_.push_back(-1);
      continue;
    }
    if (!(r.base > 0.0) || !(r.freq_scale > 0.0) || !std::isfinite(r.base) || !std::isfinite(r.freq_scale)) {
      return absl::InvalidArgumentError(absl::StrCat("RopePlan: layer ", il, " has base ", r.base,
                                                     " and freq_scale ", r.freq_scale, "; both must be positive"));
    }
    if (!r.freq_factors.empty()) {
      if (r.freq_factors.size() != static_cast<size_t>(rot_dims / 2)) {
        return absl::InvalidArgumentError(absl::StrCat("RopePlan: layer ", il, " has ", r.freq_factors.size(),
                                                       " frequency factors; rot_dims ", rot_dims, " needs ",
                                                       rot_dims / 2));
      }
      for (size_t i = 0; i < r.freq_factors.size(); ++i) {
        const float f = r.freq_factors[i];
        if (!(f > 0.0f) || !std::isfinite(f)) {
          return absl::InvalidArgumentError(absl::StrCat("RopePlan: layer ", il, " has frequency factor ", i, " = ",
                                                         f, "; factors must be finite and positive"));
        }
      }
    }
    if (!(r.attention_factor > 0.0) || !std::isfinite(r.attention_factor)) {
      return absl::InvalidArgumentError(absl::StrCat("RopePlan: layer ", il, " has attention_factor ",
                                                     r.attention_factor, "; it must be finite and positive"));
    }
    if (r.yarn.has_value()) {
      if (auto s = ValidateYarn(*r.yarn, r, il); !s.ok()) return s;
    }
    int32_t v = -1;
    for (size_t k = 0; k < plan.variants_.size(); ++k) {
      const RopeLayer& o = plan.variants_[k];
      if (o.base == r.base && o.freq_scale == r.freq_scale && o.freq_factors == r.freq_factors && o.yarn == r.yarn &&
          o.attention_factor == r.attention_factor) {
        v = static_cast<int32_t>(k);
      }
    }
    if (v < 0) {
      v = static_cast<int32_t>(plan.variants_.size());
      plan.variants_.push_back(r);
      if (r.yarn.has_value()) {
        plan.inv_freq_.push_back(YarnInvFreq(r.base, rot_dims, *r.yarn));
      } else {
        // float32 as in HF's default RoPE init: 1 / base^(arange(0, d, 2) / d),
        // d the rotated dimensions, then divided by the factor as HF's llama3
        // init divides (inv / factor).
        std::vector<float> inv(static_cast<size_t>(rot_dims / 2));
        for (int32_t i = 0; i < rot_dims / 2; ++i) {
          const float expo = static_cast<float>(2 * i) / static_cast<float>(rot_dims);
          float f = 1.0f / std::pow(static_cast<float>(r.base), expo);
          if (!r.freq_factors.empty()) f /= r.freq_factors[static_cast<size_t>(i)];
          inv[static_cast<size_t>(i)] = f;
        }
        plan.inv_freq_.push_back(std::move(inv));
      }
    }
    plan.layer_variant_.push_back(v);
  }
  return plan;
}

}  // namespace decoded
