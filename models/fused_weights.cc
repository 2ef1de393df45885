#include "models/fused_weights.h"

#include "absl/strings/str_cat.h"

namespace decoded {

absl::StatusOr<std::vector<const WeightTensor*>> BindFusedRows(const HParams& hp, std::string_view name,
                                                               absl::Span<const FusedPart> parts, const Dim& cols,
                                                               std::deque<WeightTensor>& views) {
  Dim rows{0, ""};
  for (const FusedPart& part : parts) {
    rows.value += part.rows.value;
    absl::StrAppend(&rows.source, rows.source.empty() ? "" : " + ", part.name, " rows (", part.rows.source, ")");
  }
  auto fused = hp.Tensor(name, rows, cols);
  if (!fused.ok()) return fused.status();
  const WeightTensor& w = **fused;
  std::vector<const WeightTensor*> out;
  int64_t row0 = 0;
  for (const FusedPart& part : parts) {
    WeightTensor& view = views.emplace_back(w);
    view.name = absl::StrCat(w.name, "[", part.name, "]");
    view.rows = part.rows.value;
    view.data = w.data + static_cast<size_t>(row0) * w.row_bytes;
    row0 += part.rows.value;
    out.push_back(&view);
  }
  return out;
}

}  // namespace decoded
