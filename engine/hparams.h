// Reads a family's hyper-parameters from GGUF metadata keys "<arch>.<key>"
// (GGUF spec, "LLM" key conventions). Errors name the full key.
#ifndef DECODED_ENGINE_HPARAMS_H_
#define DECODED_ENGINE_HPARAMS_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_file.h"

namespace decoded {

class HParams {
 public:
  HParams(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  std::string key(std::string_view k) const { return arch_ + "." + std::string(k); }

  // A required positive integer that fits int32: INVALID_ARGUMENT otherwise.
  absl::StatusOr<int32_t> Positive(std::string_view k) const {
    auto v = file_.GetUint(key(k));
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("model file: ", v.status().message()));
    if (*v == 0 || *v > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("model file: ", key(k), " = ", *v, " is out of range"));
    }
    return static_cast<int32_t>(*v);
  }
  // An optional positive integer: `fallback` when absent.
  absl::StatusOr<int32_t> PositiveOr(std::string_view k, int32_t fallback) const {
    if (file_.Find(key(k)) == nullptr) return fallback;
    return Positive(k);
  }
  // An optional finite float: `fallback` when absent.
  absl::StatusOr<double> FloatOr(std::string_view k, double fallback) const {
    if (file_.Find(key(k)) == nullptr) return fallback;
    auto v = file_.GetFloat(key(k));
    if (!v.ok()) return v.status();
    if (!std::isfinite(*v)) return absl::InvalidArgumentError(absl::StrCat("model file: ", key(k), " is not finite"));
    return *v;
  }

 private:
  const GgufFile& file_;
  std::string arch_;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_HPARAMS_H_
