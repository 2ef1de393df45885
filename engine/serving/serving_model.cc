// ServingModel's default batched decoder: one context at a time.
#include "engine/serving/serving_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace decoded::serving {
namespace {

class SequentialBatchDecoder final : public BatchDecoder {
 public:
  SequentialBatchDecoder(int32_t max_batch, int32_t max_step_tokens)
      : max_batch_(max_batch), max_step_tokens_(std::max(max_batch, max_step_tokens)) {}

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
  // A span of one token decodes, a longer one prefills in chunks of at most
  // kMaxPrefillChunk tokens. Capacity is checked for every span first; any
  // other failure part-way (a scripted fake's) leaves the earlier spans
  // written (the real decoder validates everything first).
  absl::StatusOr<absl::Span<const float>> Step(absl::Span<const StepSpan> spans, Executor& executor) override {
    if (spans.empty()) return absl::InvalidArgumentError("a step needs at least one span");
    size_t total = 0;
    for (const StepSpan& span : spans) {
      if (span.context == nullptr || span.tokens.empty()) {
        return absl::InvalidArgumentError("a span needs a context and at least one token");
      }
      total += span.tokens.size();
    }
    if (total > static_cast<size_t>(max_step_tokens_)) {
      return absl::InvalidArgumentError(absl::StrCat("the step's spans hold more than ", max_step_tokens_, " tokens"));
    }
    // What the contexts would refuse part-way is refused before any span
    // runs, so a refused step wrote nothing (the scheduler then re-runs each
    // span alone).
    for (const StepSpan& span : spans) {
      if (static_cast<int64_t>(span.context->cached_len()) + static_cast<int64_t>(span.tokens.size()) >
          span.context->capacity()) {
        return absl::ResourceExhaustedError(absl::StrCat("a span of ", span.tokens.size(), " tokens does not fit after ",
                                                         span.context->cached_len(), " of ",
                                                         span.context->capacity(), " positions"));
      }
    }
    logits_.clear();
    for (const StepSpan& span : spans) {
      if (span.tokens.size() == 1 && span.logits != SpanLogits::kNone) {
        absl::StatusOr<absl::Span<const float>> row = span.context->Decode(span.tokens[0], executor);
        if (!row.ok()) return row.status();
        logits_.insert(logits_.end(), row->begin(), row->end());
        continue;
      }
      for (size_t at = 0; at < span.tokens.size(); at += kMaxPrefillChunk) {
        const absl::Span<const int32_t> chunk = span.tokens.subspan(at, kMaxPrefillChunk);
        const bool last_chunk = at + chunk.size() == span.tokens.size();
        const bool all = span.logits == SpanLogits::kAll;
        absl::StatusOr<absl::Span<const float>> rows = span.context->Prefill(chunk, all, executor);
        if (!rows.ok()) return rows.status();
        if (all || (last_chunk && span.logits == SpanLogits::kLast)) {
          logits_.insert(logits_.end(), rows->begin(), rows->end());
        }
      }
    }
    return absl::MakeConstSpan(logits_);
  }
  int32_t max_batch() const override { return max_batch_; }
  int32_t max_step_tokens() const override { return max_step_tokens_; }
  int32_t plan_rows(int32_t n) const override { return n; }
  void Release() override {}
  int64_t bound_nodes() const override { return 0; }

 private:
  const int32_t max_batch_;
  const int32_t max_step_tokens_;
  std::vector<float> logits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchDecoder>> ServingModel::NewBatchDecoder(int32_t max_batch,
                                                                           int32_t max_step_tokens) const {
  if (max_batch < 1 || max_batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch ", max_batch, " must be in [1, ", kMaxBatch, "]"));
  }
  if (max_step_tokens < 0 || max_step_tokens > kMaxStepTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_step_tokens ", max_step_tokens, " must be in [0, ", kMaxStepTokens, "]"));
  }
  return std::unique_ptr<BatchDecoder>(new SequentialBatchDecoder(max_batch, max_step_tokens));
}

int32_t ServingModel::KvBlocksFreedByReleasing(absl::Span<const DecodeContext* const> contexts) const {
  int32_t n = 0;
  for (const DecodeContext* c : contexts) n += c->kv_blocks();
  return n;
}

}  // namespace decoded::serving
