#include "models/qkv_weights.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/dtype.h"

namespace decoded {
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
  const FusedPart parts[] = {{"q", q_dim}, {"k", kv_dim}, {"v", kv_dim}};

  QkvWeights out;
  out.fused = weights.Find(fused_w) != nullptr;
  if (out.fused) {
    for (const std::string& s : sep_w) {
      if (weights.Find(s) != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("model file: tensor ", s, " is unexpected beside the fused ",
                                                       fused_w, " (one Q/K/V layout per layer)"));
      }
    }
    auto v = BindFusedRows(hp, fused_w, parts, hidden, views);
    if (!v.ok()) return v.status();
    out.wq = (*v)[0];
    out.wk = (*v)[1];
    out.wv = (*v)[2];
  } else {
    const WeightTensor** dst[3] = {&out.wq, &out.wk, &out.wv};
    for (int i = 0; i < 3; ++i) {
      auto t = hp.Tensor(sep_w[i], parts[i].extent, hidden);
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
    auto v = BindFusedColumns(hp, fused_b, parts, views);
    if (!v.ok()) return v.status();
    out.bq = (*v)[0];
    out.bk = (*v)[1];
    out.bv = (*v)[2];
    return out;
  }
  const Dim one{1, "a bias"};
  const WeightTensor** dst[3] = {&out.bq, &out.bk, &out.bv};
  for (int i = 0; i < 3; ++i) {
    auto t = hp.Tensor(sep_b[i], one, parts[i].extent);
    if (!t.ok()) return t.status();
    if (auto s = RequireF32Bias(**t); !s.ok()) return s;
    *dst[i] = *t;
  }
  return out;
}

}  // namespace decoded
