#include "engine/weights.h"

#include <atomic>

#include "absl/strings/str_cat.h"

namespace decoded {
namespace {
std::atomic<uint64_t> g_next_weights_id{1};
}  // namespace

absl::StatusOr<std::shared_ptr<const Weights>> Weights::FromGguf(std::shared_ptr<const GgufFile> file) {
  std::shared_ptr<Weights> w(new Weights());
  w->instance_id_ = g_next_weights_id.fetch_add(1);
  for (const GgufTensorInfo& t : file->tensors()) {
    // A 3-D tensor is a stack of ne[2] matrices, viewed as their rows one
    // after another (deepseek2's per-head attn_k_b / attn_v_b); 4-D ones are
    // in no supported family.
    if (t.n_dims > 3 || t.ne[3] != 1) continue;
    WeightTensor wt;
    wt.name = t.name;
    wt.type = t.type;
    wt.cols = t.ne[0];
    wt.rows = (t.n_dims >= 2 ? t.ne[1] : 1) * (t.n_dims >= 3 ? t.ne[2] : 1);
    auto rb = RowBytes(t.type, wt.cols);
    if (!rb) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": row of ", wt.cols,
                                                            " elements is not whole blocks of ", DTypeName(t.type)));
    wt.row_bytes = *rb;
    wt.data = t.data;
    w->tensors_.emplace(t.name, std::move(wt));
  }
  w->file_ = std::move(file);
  return std::shared_ptr<const Weights>(std::move(w));
}

const WeightTensor* Weights::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<const WeightTensor*> Weights::Get(std::string_view name, int64_t rows, int64_t cols) const {
  const WeightTensor* t = Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("model file has no tensor ", std::string(name)));
  if ((rows >= 0 && t->rows != rows) || (cols >= 0 && t->cols != cols)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(name), " has shape [", t->rows, ", ", t->cols,
                                                   "], expected [", rows, ", ", cols, "]"));
  }
  return t;
}

}  // namespace decoded
