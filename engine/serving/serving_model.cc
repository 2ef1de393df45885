// ServingModel's default batched decoder: one context at a time.
#include "engine/serving/serving_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace decoded::serving {
namespace {

class SequentialBatchDecoder final : public BatchDecoder {
 public:
  explicit SequentialBatchDecoder(int32_t max_batch) : max_batch_(max_batch) {}

  absl::StatusOr<absl::Span<const float>> Decode(absl::Span<DecodeContext* const> contexts,
                                                 absl::Span<const int32_t> tokens, Executor& executor) override {
    if (contexts.empty() || contexts.size() != tokens.size() || static_cast<int32_t>(contexts.size()) > max_batch_) {
      return absl::InvalidArgumentError(absl::StrCat("a batched step of ", contexts.size(), " contexts and ",
                                                     tokens.size(), " tokens (max_batch ", max_batch_, ")"));
    }
    logits_.clear();
    for (size_t i = 0; i < contexts.size(); ++i) {
      absl::StatusOr<absl::Span<const float>> row = contexts[i]->Decode(tokens[i], executor);
      if (!row.ok()) return row.status();
      logits_.insert(logits_.end(), row->begin(), row->end());
    }
    return absl::MakeConstSpan(logits_);
  }
  int32_t max_batch() const override { return max_batch_; }
  int32_t plan_rows(int32_t n) const override { return n; }
  void Release() override {}
  int64_t bound_nodes() const override { return 0; }

 private:
  const int32_t max_batch_;
  std::vector<float> logits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchDecoder>> ServingModel::NewBatchDecoder(int32_t max_batch) const {
  if (max_batch < 1 || max_batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch ", max_batch, " must be in [1, ", kMaxBatch, "]"));
  }
  return std::unique_ptr<BatchDecoder>(new SequentialBatchDecoder(max_batch));
}

}  // namespace decoded::serving
