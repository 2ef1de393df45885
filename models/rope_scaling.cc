#include "models/rope_scaling.h"

#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/hparam_bounds.h"

namespace decoded {

absl::StatusOr<RopeScaling> ReadRopeScaling(const HParams& hp, int32_t context_length) {
  namespace hb = hparam_bounds;
  const GgufFile& file = hp.weights().file();
  auto present = [&](const char* k) { return file.Find(hp.key(k)) != nullptr; };
  RopeScaling out;

  std::string type = "linear";  // llama.cpp's default when the key is absent
  if (present("rope.scaling.type")) {
    auto t = file.GetString(hp.key("rope.scaling.type"));
    if (!t.ok()) return t.status();
    type = *t;
  }
  auto factor = hp.FloatOr("rope.scaling.factor", 0, {1.0 / 1024, 1024, true});
  if (!factor.ok()) return factor.status();
  // llama.cpp's extra cos/sin multiplier (written for Phi-3 LongRoPE).
  auto attn = hp.FloatOr("rope.scaling.attn_factor", 1.0, {0, hb::kMaxFloat32});
  if (!attn.ok()) return attn.status();
  if (*attn != 1.0) {
    return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.scaling.attn_factor"), " = ", *attn,
                                                 " (a cos/sin multiplier outside YaRN) is not supported"));
  }

  if (type == "none") return out;
  if (type == "linear") {
    if (*factor != 0 && *factor != 1.0) {
      out.type = RopeScaling::Type::kLinear;
      out.factor = *factor;
    }
    return out;
  }
  if (type != "yarn") {
    return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.scaling.type"), " = \"", type,
                                                 "\" is not supported (only none, linear and yarn)"));
  }

  out.type = RopeScaling::Type::kYarn;
  if (*factor == 0) {
    return absl::InvalidArgumentError(absl::StrCat("model file: ", hp.key("rope.scaling.type"),
                                                   " = \"yarn\" needs ", hp.key("rope.scaling.factor")));
  }
  out.factor = *factor;
  out.yarn.factor = *factor;
  auto orig = hp.IntOr("rope.scaling.original_context_length", context_length, {1, hb::kMaxContextLength});
  if (!orig.ok()) return orig.status();
  out.yarn.original_context = *orig;
  // HF reads `beta_fast or 32`: 0 is the default too.
  for (auto [key, dst, fallback] : {std::tuple{"rope.scaling.yarn_beta_fast", &out.yarn.beta_fast, 32.0},
                                    std::tuple{"rope.scaling.yarn_beta_slow", &out.yarn.beta_slow, 1.0}}) {
    auto beta = hp.FloatOr(key, fallback, {hb::kMinNormalFloat32, hb::kMaxFloat32, true});
    if (!beta.ok()) return beta.status();
    *dst = *beta == 0 ? fallback : *beta;
  }
  auto ext = hp.FloatOr("rope.scaling.yarn_ext_factor", 1.0, {0, hb::kMaxFloat32});
  if (!ext.ok()) return ext.status();
  if (*ext != 1.0) {
    return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.scaling.yarn_ext_factor"), " = ",
                                                 *ext, " is not supported (only 1: HF's YaRN blend)"));
  }
  if (present("rope.scaling.yarn_attn_factor")) {
    auto a = hp.Float("rope.scaling.yarn_attn_factor", {hb::kMinNormalFloat32, hb::kMaxFloat32});
    if (!a.ok()) return a.status();
    out.yarn_attn_factor = *a;
  }
  if (present("rope.scaling.yarn_log_multiplier")) {
    auto m = hp.Float("rope.scaling.yarn_log_multiplier", {0, 1024});
    if (!m.ok()) return m.status();
    out.yarn_log_multiplier = *m;
  }
  return out;
}

}  // namespace decoded
