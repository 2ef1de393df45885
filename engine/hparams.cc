#include "engine/hparams.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf_parser.h"

namespace decoded {
namespace {

absl::Status ModelFileError(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("model file: ", absl::string_view(what.data(), what.size())));
}

std::string RangeText(const IntRange& r) {
  std::string s = absl::StrCat("[", r.lo, ", ", r.hi, "]");
  if (!r.hi_source.empty()) absl::StrAppend(&s, " (the upper bound is ", r.hi_source, ")");
  return s;
}

std::string RangeText(const FloatRange& r) {
  return absl::StrCat("[", r.lo, ", ", r.hi, "]", r.zero_is_off ? " or 0 (off)" : "");
}

// The integer stored at `v`, widened so that every GGUF integer type fits:
// uint64 values above INT64_MAX come back as INT64_MAX, which no range admits.
absl::StatusOr<int64_t> IntegerValue(const GgufValue& v, const std::string& key) {
  if (const int64_t* i = std::get_if<int64_t>(&v.value)) return *i;
  if (const uint64_t* u = std::get_if<uint64_t>(&v.value)) {
    return static_cast<int64_t>(std::min<uint64_t>(*u, std::numeric_limits<int64_t>::max()));
  }
  return ModelFileError(absl::StrCat(key, " holds ", GgufTypeName(v.type), ", not an integer"));
}

// The stored integer as written in the file, for messages (IntegerValue
// clamps a uint64 beyond int64).
std::string IntegerText(const GgufValue& v) {
  if (const uint64_t* u = std::get_if<uint64_t>(&v.value)) return absl::StrCat(*u);
  return absl::StrCat(std::get<int64_t>(v.value));
}

absl::StatusOr<int32_t> CheckInt(int64_t value, const std::string& shown, const std::string& key,
                                 const IntRange& range) {
  if (value < range.lo || value > range.hi) {
    return ModelFileError(absl::StrCat(key, " = ", shown, " is out of range ", RangeText(range)));
  }
  if (range.multiple_of > 1 && value % range.multiple_of != 0) {
    return ModelFileError(absl::StrCat(key, " = ", shown, " is not a multiple of ", range.multiple_of));
  }
  // IntRange lies within int32 (its contract), so this clamp never bites.
  return static_cast<int32_t>(std::clamp<int64_t>(value, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

absl::StatusOr<double> CheckFloat(double value, const std::string& key, const char* suffix,
                                  const FloatRange& range) {
  const std::string shown = absl::StrCat(key, " = ", value, suffix);
  if (!std::isfinite(value)) return ModelFileError(absl::StrCat(shown, " is not finite"));
  if (range.zero_is_off && value == 0) return value;
  if (value < range.lo || value > range.hi) {
    return ModelFileError(absl::StrCat(shown, " is out of range ", RangeText(range)));
  }
  return value;
}

// The N of a tensor name "blk.N.<rest>", or -1. N has at most 9 digits, so it
// fits int32 and cannot overflow here.
int64_t LayerIndex(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  size_t i = kPrefix.size();
  int64_t n = 0;
  size_t digits = 0;
  while (i < name.size() && absl::ascii_isdigit(static_cast<unsigned char>(name[i]))) {
    if (++digits > 9) return -1;
    n = n * 10 + (name[i] - '0');
    ++i;
  }
  if (digits == 0 || i >= name.size() || name[i] != '.') return -1;
  return n;
}

}  // namespace

Dim operator*(const Dim& a, const Dim& b) {
  // Both extents are bounded far below 2^31 by the time they are multiplied.
  return Dim{a.value * b.value, absl::StrCat(a.source, " x ", b.source)};
}

absl::StatusOr<int32_t> HParams::Int(std::string_view k, const IntRange& range) const {
  const std::string full = key(k);
  const GgufValue* v = weights_.file().Find(full);
  if (v == nullptr) return ModelFileError(absl::StrCat(full, " is absent"));
  absl::StatusOr<int64_t> i = IntegerValue(*v, full);
  if (!i.ok()) return i.status();
  return CheckInt(*i, IntegerText(*v), full, range);
}

absl::StatusOr<int32_t> HParams::IntOr(std::string_view k, int64_t fallback, const IntRange& range) const {
  if (weights_.file().Find(key(k)) != nullptr) return Int(k, range);
  return CheckInt(fallback, absl::StrCat(fallback, " (default; the key is absent)"), key(k), range);
}

absl::StatusOr<double> HParams::Float(std::string_view k, const FloatRange& range) const {
  const std::string full = key(k);
  const GgufValue* v = weights_.file().Find(full);
  if (v == nullptr) return ModelFileError(absl::StrCat(full, " is absent"));
  const double* d = std::get_if<double>(&v->value);
  if (d == nullptr) return ModelFileError(absl::StrCat(full, " holds ", GgufTypeName(v->type), ", not a float"));
  return CheckFloat(*d, full, "", range);
}

absl::StatusOr<double> HParams::FloatOr(std::string_view k, double fallback, const FloatRange& range) const {
  if (weights_.file().Find(key(k)) != nullptr) return Float(k, range);
  return CheckFloat(fallback, key(k), " (default; the key is absent)", range);
}

absl::StatusOr<int32_t> HParams::LayerCount(std::string_view k) const {
  absl::StatusOr<int32_t> count = Int(k, IntRange{1, hparam_bounds::kMaxLayers});
  if (!count.ok()) return count.status();
  // Distinct layer indices; the tensor count bounds this list (the parser
  // bounds the tensor count by the file's size).
  std::vector<int64_t> layers;
  for (const GgufTensorInfo& t : weights_.file().tensors()) {
    const int64_t n = LayerIndex(t.name);
    if (n >= 0) layers.push_back(n);
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  const int64_t present = static_cast<int64_t>(layers.size());
  for (int64_t i = 0; i < present; ++i) {
    if (layers[static_cast<size_t>(i)] != i) {
      return ModelFileError(absl::StrCat("layer tensors skip blk.", i, ". (the next layer present is blk.",
                                         layers[static_cast<size_t>(i)], ".), so ", key(k),
                                         " cannot be checked against them"));
    }
  }
  if (present != *count) {
    return ModelFileError(absl::StrCat(key(k), " = ", *count, " does not match the ", present,
                                       " layers present",
                                       present > 0 ? absl::StrCat(" (tensors blk.0. .. blk.", present - 1, ".)")
                                                   : std::string(" (no blk.N. tensors)")));
  }
  return count;
}

Dim HParams::dim(std::string_view k, int64_t value) const {
  const bool absent = weights_.file().Find(key(k)) == nullptr;
  return Dim{value, absl::StrCat(key(k), absent ? " (default)" : "", " = ", value)};
}

absl::StatusOr<const WeightTensor*> HParams::Tensor(std::string_view name, const Dim& rows, const Dim& cols) const {
  return Tensor3(name, Dim{1, "a 2-D weight"}, rows, cols);
}

absl::StatusOr<const WeightTensor*> HParams::Tensor3(std::string_view name, const Dim& planes, const Dim& rows,
                                                     const Dim& cols) const {
  absl::StatusOr<const WeightTensor*> t = weights_.Get(name);
  if (!t.ok()) return t.status();
  const WeightTensor& w = **t;
  auto check = [&w](const Dim& want, int64_t have, std::string_view axis) -> absl::Status {
    if (want.value < 0 || want.value == have) return absl::OkStatus();
    const std::string shape = w.planes == 1 ? absl::StrCat("[", w.rows, ", ", w.cols, "]")
                                            : absl::StrCat("[", w.planes, ", ", w.rows, ", ", w.cols, "]");
    return ModelFileError(absl::StrCat("tensor ", w.name, " has shape ", shape, ", but ", want.source, " requires ",
                                       want.value, " ", absl::string_view(axis.data(), axis.size())));
  };
  if (absl::Status s = check(planes, w.planes, "planes"); !s.ok()) return s;
  if (absl::Status s = check(rows, w.rows, "rows"); !s.ok()) return s;
  if (absl::Status s = check(cols, w.cols, "columns"); !s.ok()) return s;
  return t;
}

}  // namespace decoded
