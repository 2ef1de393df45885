#include "models/qkv_weights.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/dtype.h"

namespace decoded {

const WeightTensor* WeightViews::Rows(const WeightTensor& t, int64_t row0, int64_t rows, std::string name) {
  WeightTensor v = t;
  v.name = std::move(name);
  v.rows = rows;
  v.data = t.data + static_cast<size_t>(row0) * t.row_bytes;
  views_.push_back(std::move(v));
  return &views_.back();
}

const WeightTensor* WeightViews::Columns(const WeightTensor& t, int64_t col0, int64_t cols, std::string name) {
  WeightTensor v = t;
  v.name = std::move(name);
  v.cols = cols;
  v.row_bytes = static_cast<size_t>(cols) * sizeof(float);
  v.data = t.data + static_cast<size_t>(col0) * sizeof(float);
  views_.push_back(std::move(v));
  return &views_.back();
}

namespace {

absl::Status RequireF32Bias(const WeightTensor& t) {
  if (t.type == DType::kF32) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("tensor ", t.name, ": bias weights must be f32, got ", DTypeName(t.type)));
}

}  // namespace

absl::StatusOr<QkvWeights> BindQkv(const HParams& hp, const Weights& weights, int32_t layer, const Dim& q_dim,
                                   const Dim& kv_dim, const Dim& hidden, QkvBias bias, WeightViews& views) {
  const std::string p = absl::StrCat("blk.", layer, ".");
  const std::string fused_w = p + "attn_qkv.weight", fused_b = p + "attn_qkv.bias";
  const std::string sep_w[3] = {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"};
  const std::string sep_b[3] = {p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"};
  const Dim one{1, "a bias"};
  const Dim fused_rows{q_dim.value + 2 * kv_dim.value,
                       absl::StrCat("(", q_dim.source, ") + 2 x (", kv_dim.source, ")")};
  const int64_t q = q_dim.value, kv = kv_dim.value;

  QkvWeights out;
  out.fused = weights.Find(fused_w) != nullptr;
  if (out.fused) {
    for (const std::string& s : sep_w) {
      if (weights.Find(s) != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("model file: layer ", layer, " holds both ", fused_w, " and ", s,
                                                       " (one Q/K/V layout per layer)"));
      }
    }
    auto t = hp.Tensor(fused_w, fused_rows, hidden);
    if (!t.ok()) return t.status();
    out.wq = views.Rows(**t, 0, q, fused_w + "[q]");
    out.wk = views.Rows(**t, q, kv, fused_w + "[k]");
    out.wv = views.Rows(**t, q + kv, kv, fused_w + "[v]");
  } else {
    const Dim* rows[3] = {&q_dim, &kv_dim, &kv_dim};
    const WeightTensor** dst[3] = {&out.wq, &out.wk, &out.wv};
    for (int i = 0; i < 3; ++i) {
      auto t = hp.Tensor(sep_w[i], *rows[i], hidden);
      if (!t.ok()) return t.status();
      *dst[i] = *t;
    }
  }

  const bool has_fused_bias = weights.Find(fused_b) != nullptr;
  const std::string* separate_bias = nullptr;  // the first one present
  for (const std::string& s : sep_b) {
    if (separate_bias == nullptr && weights.Find(s) != nullptr) separate_bias = &s;
  }
  const bool has_separate_bias = separate_bias != nullptr;
  if (has_fused_bias && (!out.fused || has_separate_bias)) {
    return absl::InvalidArgumentError(absl::StrCat("model file: ", fused_b, " needs ", fused_w,
                                                   " and no separate q/k/v biases beside it"));
  }
  if (bias == QkvBias::kNone) {
    if (!has_fused_bias && !has_separate_bias) return out;
    return absl::UnimplementedError(absl::StrCat("model file: tensor ", has_fused_bias ? fused_b : *separate_bias,
                                                 " (a q/k/v bias) is not supported by this family's layer"));
  }
  if (bias == QkvBias::kOptional && !has_fused_bias && !has_separate_bias) return out;
  if (has_fused_bias || (out.fused && !has_separate_bias)) {
    // Fused, or required and absent: NOT_FOUND names attn_qkv.bias.
    auto t = hp.Tensor(fused_b, one, fused_rows);
    if (!t.ok()) return t.status();
    if (auto s = RequireF32Bias(**t); !s.ok()) return s;
    out.bq = views.Columns(**t, 0, q, fused_b + "[q]");
    out.bk = views.Columns(**t, q, kv, fused_b + "[k]");
    out.bv = views.Columns(**t, q + kv, kv, fused_b + "[v]");
    return out;
  }
  const Dim* cols[3] = {&q_dim, &kv_dim, &kv_dim};
  const WeightTensor** dst[3] = {&out.bq, &out.bk, &out.bv};
  for (int i = 0; i < 3; ++i) {
    auto t = hp.Tensor(sep_b[i], one, *cols[i]);
    if (!t.ok()) return t.status();
    if (auto s = RequireF32Bias(**t); !s.ok()) return s;
    *dst[i] = *t;
  }
  return out;
}

}  // namespace decoded
