// YaRN RoPE scaling (Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient
// Context Window Extension of Large Language Models", section 3.2
// "NTK-by-parts" interpolation and 3.4 the attention temperature), as Hugging
// Face transformers computes it (modeling_rope_utils._compute_yarn_parameters)
// and ggml applies it (rope_yarn, ggml_rope_yarn_corr_dims).
//
// A context extended by `factor` keeps the fast frequencies (wavelength much
// shorter than the original context: they already rotate many times within
// it, extrapolated as trained), divides the slow ones by the factor
// (interpolated, as linear position scaling does) and blends linearly in
// between; and cos/sin are multiplied by an attention factor,
// 0.1 ln(factor) + 1 unless the model states its own.
#ifndef DECODED_ENGINE_ROPE_YARN_H_
#define DECODED_ENGINE_ROPE_YARN_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace decoded {

struct YarnScaling {
  double factor = 1.0;           // s: extended context / original context (HF "factor")
  int32_t original_context = 0;  // L: the context the model was pre-trained for (tokens)
  // Rotations within L that bound the blend (HF's defaults): frequencies
  // turning more than beta_fast times are kept, fewer than beta_slow times
  // divided by the factor.
  double beta_fast = 32.0;
  double beta_slow = 1.0;

  bool operator==(const YarnScaling&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const YarnScaling& y) {
    return H::combine(std::move(h), y.factor, y.original_context, y.beta_fast, y.beta_slow);
  }
};

// The frequency index (0 .. rot_dims/2, fractional) at which a frequency of
// `base`^(-2i / rot_dims) turns `rotations` times within `original_context`
// positions (the paper's eq. for r(d); HF find_correction_dim):
//   rot_dims * ln(L / (2 pi rotations)) / (2 ln base).
double YarnCorrectionDim(int32_t rot_dims, double base, int32_t original_context, double rotations);

// inv_freq[i], i < rot_dims / 2, float32 in HF's operation order:
//   extra = 1 / base^(2i / rot_dims), inter = 1 / (factor * base^(2i / rot_dims)),
//   low = max(floor(YarnCorrectionDim(beta_fast)), 0),
//   high = min(ceil(YarnCorrectionDim(beta_slow)), rot_dims - 1) (0.001 more if equal),
//   ramp = clamp((i - low) / (high - low), 0, 1),
//   inv_freq = inter * ramp + extra * (1 - ramp).
// Preconditions (checked by RopePlan::Create): base, factor, original_context
// and both betas positive and finite, rot_dims positive and even.
std::vector<float> YarnInvFreq(double base, int32_t rot_dims, const YarnScaling& yarn);

// HF's yarn_get_mscale / get_mscale: 0.1 * mscale * ln(scale) + 1 for
// scale > 1, else 1. With mscale 1 it is the paper's attention factor
// sqrt(1/t) = 0.1 ln(s) + 1 (section 3.4, eq. 22).
double YarnMscale(double scale, double mscale = 1.0);

}  // namespace decoded

#endif  // DECODED_ENGINE_ROPE_YARN_H_
