#include "models/fused_weights.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/dtype.h"

namespace decoded {

const WeightTensor* WeightViews::Add(WeightTensor view) {
  views_.push_back(std::move(view));
  return &views_.back();
}

namespace {

// The parts' extents summed, the source naming each part's keys:
// "q rows (...) + k rows (...) + v rows (...)".
Dim SumOfParts(absl::Span<const FusedPart> parts, const char* unit) {
  Dim sum{0, ""};
  for (const FusedPart& part : parts) {
    sum.value += part.extent.value;
    absl::StrAppend(&sum.source, sum.source.empty() ? "" : " + ", part.name, " ", unit, " (", part.extent.source, ")");
  }
  return sum;
}

}  // namespace

absl::StatusOr<std::vector<const WeightTensor*>> BindFusedRows(const HParams& hp, std::string_view name,
                                                               absl::Span<const FusedPart> parts, const Dim& cols,
                                                               WeightViews& views) {
  auto fused = hp.Tensor(name, SumOfParts(parts, "rows"), cols);
  if (!fused.ok()) return fused.status();
  const WeightTensor& w = **fused;
  std::vector<const WeightTensor*> out;
  int64_t row0 = 0;
  for (const FusedPart& part : parts) {
    WeightTensor view = w;
    view.name = absl::StrCat(w.name, "[", part.name, "]");
    view.rows = part.extent.value;
    view.data = w.data + static_cast<size_t>(row0) * w.row_bytes;
    row0 += part.extent.value;
    out.push_back(views.Add(std::move(view)));
  }
  return out;
}

absl::StatusOr<std::vector<const WeightTensor*>> BindFusedColumns(const HParams& hp, std::string_view name,
                                                                  absl::Span<const FusedPart> parts,
                                                                  WeightViews& views) {
  auto fused = hp.Tensor(name, Dim{1, "a bias"}, SumOfParts(parts, "columns"));
  if (!fused.ok()) return fused.status();
  const WeightTensor& w = **fused;
  if (w.type != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat("tensor ", w.name, ": bias weights must be f32, got ", DTypeName(w.type)));
  }
  std::vector<const WeightTensor*> out;
  int64_t col0 = 0;
  for (const FusedPart& part : parts) {
    WeightTensor view = w;
    view.name = absl::StrCat(w.name, "[", part.name, "]");
    view.cols = part.extent.value;
    view.row_bytes = static_cast<size_t>(part.extent.value) * sizeof(float);
    view.data = w.data + static_cast<size_t>(col0) * sizeof(float);
    col0 += part.extent.value;
    out.push_back(views.Add(std::move(view)));
  }
  return out;
}

}  // namespace decoded
