#include "engine/rope_yarn.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace decoded {

double YarnCorrectionDim(int32_t rot_dims, double base, int32_t original_context, double rotations) {
  return rot_dims * std::log(original_context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

std::vector<float> YarnInvFreq(double base, int32_t rot_dims, const YarnScaling& yarn) {
  // The ramp bounds in double (HF computes them in Python floats), truncated
  // to whole frequency indices as HF's default truncate=True and ggml do.
  const double low =
      std::max(std::floor(YarnCorrectionDim(rot_dims, base, yarn.original_context, yarn.beta_fast)), 0.0);
  double high =
      std::min(std::ceil(YarnCorrectionDim(rot_dims, base, yarn.original_context, yarn.beta_slow)), rot_dims - 1.0);
  if (low == high) high += 0.001;  // HF: prevent a zero-width ramp
  const float low_f = static_cast<float>(low);
  const float width_f = static_cast<float>(high - low);
  const float factor_f = static_cast<float>(yarn.factor);
  const float base_f = static_cast<float>(base);
  std::vector<float> inv(static_cast<size_t>(rot_dims / 2));
  for (int32_t i = 0; i < rot_dims / 2; ++i) {
    const float pos_freq = std::pow(base_f, static_cast<float>(2 * i) / static_cast<float>(rot_dims));
    const float extra = 1.0f / pos_freq;
    const float inter = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / width_f, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // HF's inv_freq_extrapolation_factor
    inv[static_cast<size_t>(i)] = inter * (1.0f - keep) + extra * keep;
  }
  return inv;
}

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace decoded
