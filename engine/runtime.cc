// Model loading and the per-session DecodeContext over the shared driver.
#include "engine/runtime.h"

#include "engine/gguf/file_type.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/decode_driver.h"
#include "engine/engine_counters.h"
#include "engine/gguf/gguf_file.h"
#include "engine/kv_cache.h"
#include "engine/model_registry.h"
#include "engine/weights.h"

namespace decoded {
namespace {

class ModelImpl;

class ContextImpl final : public DecodeContext {
 public:
  ContextImpl(std::shared_ptr<const ModelImpl> model, std::unique_ptr<KvCache> kv);
  ~ContextImpl() override { counters::AddLiveContexts(-1); }

  int32_t cached_len() const override { return kv_->cached_len(); }
  int32_t capacity() const override { return kv_->capacity(); }
  absl::StatusOr<absl::Span<const float>> Prefill(absl::Span<const int32_t> tokens, bool all_logits,
                                                  Executor& executor) override;
  absl::StatusOr<absl::Span<const float>> Decode(int32_t token, Executor& executor) override;
  absl::Status Rewind(int32_t len) override {
    if (len < 0 || len > kv_->cached_len()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot rewind to ", len, ": the context holds ", kv_->cached_len(), " tokens"));
    }
    if (kv_->TruncatableTo(len) != len) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot rewind to ", len, ": sliding-window layers gave back KV blocks that position reads"));
    }
    kv_->Truncate(len);
    return absl::OkStatus();
  }
  int32_t RewindableTo(int32_t len) const override { return kv_->TruncatableTo(len); }
  int64_t kv_bytes() const override { return kv_->bytes(); }
  absl::Status ReserveKv(int32_t n_tokens) override { return kv_->Reserve(n_tokens); }
  int32_t KvBlocksToReserve(int32_t n_tokens) const override { return kv_->BlocksToReserve(n_tokens); }
  int32_t kv_blocks() const override { return kv_->held_blocks(); }
  int32_t kv_mapped_len() const override { return kv_->mapped_len(); }
  int32_t kv_block(int32_t i) const override { return kv_->held_block(i); }
  int32_t kv_range_block(int32_t group, int32_t i) const override { return kv_->block(group, i); }
  absl::Status AdoptKvBlocks(absl::Span<const int32_t> blocks) override { return kv_->Adopt(blocks); }
  int64_t bound_nodes() const override { return session_.bound_nodes; }

  const ModelImpl* model() const { return model_.get(); }
  KvCache& kv() { return *kv_; }

 private:
  std::shared_ptr<const ModelImpl> model_;
  std::unique_ptr<KvCache> kv_;
  DecodeSession session_;
  std::vector<float> prefill_logits_;
};

class ModelImpl final : public Model, public std::enable_shared_from_this<ModelImpl> {
 public:
  ModelImpl(std::shared_ptr<Backend> backend, std::shared_ptr<const Weights> weights,
            std::unique_ptr<DecodeModel> family, std::unique_ptr<Tokenizer> tokenizer, ModelInfo info,
            DType kv_type)
      : backend_(std::move(backend)), weights_(std::move(weights)), family_(std::move(family)),
        tokenizer_(std::move(tokenizer)), info_(std::move(info)), kv_type_(kv_type), kv_groups_(GroupsOf(*family_)) {}

  using Model::NewContext;
  const ModelInfo& info() const override { return info_; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  Backend& backend() const override { return *backend_; }
  const DecodeModel& family() const { return *family_; }
  // The family's KV geometry in the KV type the model was loaded with.
  KvLayout kv_layout() const { return family_->dims().kv_layout().WithType(kv_type_); }

  absl::StatusOr<std::unique_ptr<BatchDecoder>> NewBatchDecoder(int32_t max_batch,
                                                                int32_t max_step_tokens) const override;

  absl::StatusOr<std::unique_ptr<DecodeContext>> NewContext(int32_t max_seq_len,
                                                            std::shared_ptr<KvPool> pool) const override {
    if (max_seq_len < 1 || max_seq_len > info_.context_length) {
      return absl::InvalidArgumentError(absl::StrCat("context length ", max_seq_len, " must be in [1, ",
                                                     info_.context_length, "]"));
    }
    const DecodeDims& d = family_->dims();
    if (pool != nullptr && (pool->n_layers() != d.n_layers || !(pool->layout() == kv_layout()) ||
                            !(pool->groups() == kv_groups_) || &pool->backend() != &family_->backend())) {
      return absl::InvalidArgumentError("the KV pool was made for another model geometry, KV type or backend");
    }
    auto kv = pool != nullptr ? KvCache::CreatePaged(std::move(pool), max_seq_len)
                              : KvCache::Create(family_->backend(), d.n_layers, kv_layout(), max_seq_len);
    if (!kv.ok()) return kv.status();
    return std::unique_ptr<DecodeContext>(new ContextImpl(shared_from_this(), *std::move(kv)));
  }

  absl::StatusOr<std::shared_ptr<KvPool>> NewKvPool(int32_t block_tokens, int32_t n_blocks) const override {
    return KvPool::Create(family_->backend(), kv_groups_, kv_layout(), block_tokens, n_blocks);
  }

 private:
  // First: the family, contexts and plans use it, so it goes last.
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Weights> weights_;
  std::unique_ptr<DecodeModel> family_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelInfo info_;
  DType kv_type_;
  // How its paged caches group layers by attention window (engine/kv_groups.h).
  KvGroups kv_groups_;

  static KvGroups GroupsOf(const DecodeModel& family) {
    const MaskPlan& mp = family.mask_plan();
    std::vector<int32_t> windows;
    for (int32_t l = 0; l < mp.n_layers(); ++l) windows.push_back(mp.window(mp.variant_of(l)));
    absl::StatusOr<KvGroups> g = KvGroups::ForWindows(windows);
    // A family's MaskPlan was checked when it was made (no negative window).
    return g.ok() && g->n_layers() == family.dims().n_layers ? *g : KvGroups::Single(family.dims().n_layers);
  }
};

ContextImpl::ContextImpl(std::shared_ptr<const ModelImpl> model, std::unique_ptr<KvCache> kv)
    : model_(std::move(model)), kv_(std::move(kv)) {
  counters::AddLiveContexts(1);
}

absl::StatusOr<absl::Span<const float>> ContextImpl::Prefill(absl::Span<const int32_t> tokens, bool all_logits,
                                                             Executor& executor) {
  if (tokens.empty() || static_cast<int32_t>(tokens.size()) > kMaxPrefillChunk) {
    return absl::InvalidArgumentError(absl::StrCat("a prefill chunk holds 1..", kMaxPrefillChunk, " tokens, got ",
                                                   tokens.size()));
  }
  auto logits = forward_with_kv_context(model_->family(), *kv_, tokens, all_logits, executor);
  if (!logits.ok()) return logits.status();
  prefill_logits_ = *std::move(logits);
  return absl::MakeConstSpan(prefill_logits_);
}

absl::StatusOr<absl::Span<const float>> ContextImpl::Decode(int32_t token, Executor& executor) {
  return forward_with_kv_context_persistent(model_->family(), *kv_, session_, token, executor);
}

// One held plan per (rows, outputs) pair of buckets it ran: a step of n rows
// of which m want logits runs the plan of plan_rows(n) rows and
// plan_rows(max(m, 1)) outputs (a decode step: the same bucket twice).
class BatchDecoderImpl final : public BatchDecoder {
 public:
  BatchDecoderImpl(std::shared_ptr<const ModelImpl> model, int32_t max_batch, int32_t max_step_tokens)
      : model_(std::move(model)), max_batch_(max_batch), buckets_(BatchBuckets(std::max(max_batch, max_step_tokens))) {
    rows_.reserve(static_cast<size_t>(buckets_.back()));
    spans_.reserve(static_cast<size_t>(max_batch));
  }

  absl::StatusOr<absl::Span<const float>> Decode(absl::Span<DecodeContext* const> contexts,
                                                 absl::Span<const int32_t> tokens, Executor& executor) override {
    if (contexts.empty() || contexts.size() != tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a batched step needs one token per context (", contexts.size(),
                                                     " contexts, ", tokens.size(), " tokens)"));
    }
    if (static_cast<int32_t>(contexts.size()) > max_batch()) {
      return absl::InvalidArgumentError(absl::StrCat(contexts.size(), " contexts exceed max_batch ", max_batch()));
    }
    spans_.clear();
    for (size_t i = 0; i < contexts.size(); ++i) {
      spans_.push_back(StepSpan{contexts[i], tokens.subspan(i, 1), SpanLogits::kLast});
    }
    return Step(spans_, executor);
  }

  absl::StatusOr<absl::Span<const float>> Step(absl::Span<const StepSpan> spans, Executor& executor) override {
    if (spans.empty()) return absl::InvalidArgumentError("a step needs at least one span");
    rows_.clear();
    int32_t wanted = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const StepSpan& span = spans[i];
      auto* ctx = dynamic_cast<ContextImpl*>(span.context);
      if (ctx == nullptr || ctx->model() != model_.get()) {
        return absl::InvalidArgumentError(absl::StrCat("span ", i, " belongs to another model's context"));
      }
      if (span.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("span ", i, " has no tokens"));
      for (size_t j = 0; j < i; ++j) {
        if (spans[j].context == span.context) {
          return absl::InvalidArgumentError(absl::StrCat("spans ", j, " and ", i, " are of one context"));
        }
      }
      if (rows_.size() + span.tokens.size() > static_cast<size_t>(max_step_tokens())) {
        return absl::InvalidArgumentError(
            absl::StrCat("the step's spans hold more than ", max_step_tokens(), " tokens"));
      }
      for (size_t k = 0; k < span.tokens.size(); ++k) {
        const bool logits = span.logits == SpanLogits::kAll ||
                            (span.logits == SpanLogits::kLast && k + 1 == span.tokens.size());
        rows_.push_back(DecodeRow{&ctx->kv(), span.tokens[k], logits});
        wanted += logits ? 1 : 0;
      }
    }
    const int32_t n = static_cast<int32_t>(rows_.size());
    const int32_t plan_rows = buckets_[Bucket(n)];
    const int32_t plan_outputs = buckets_[Bucket(std::max(wanted, 1))];
    DecodeSession& plan = PlanFor(plan_rows, plan_outputs);
    absl::StatusOr<absl::Span<const float>> logits =
        forward_batch_persistent(model_->family(), rows_, plan_rows, plan_outputs, plan, executor);
    if (!logits.ok() || plan_outputs < plan_rows || wanted == n) return logits;
    // A plan of as many outputs as rows returns every row's logits: keep the
    // wanted ones (a step of a few rows, one of them a short prefill span).
    const size_t vocab = static_cast<size_t>(model_->family().dims().vocab);
    selected_.resize(static_cast<size_t>(wanted) * vocab);
    size_t out = 0;
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (!rows_[r].logits) continue;
      std::copy_n(logits->data() + r * vocab, vocab, selected_.data() + out * vocab);
      ++out;
    }
    return absl::MakeConstSpan(selected_);
  }

  int32_t max_batch() const override { return max_batch_; }
  int32_t max_step_tokens() const override { return buckets_.back(); }
  int32_t plan_rows(int32_t n) const override { return buckets_[Bucket(n)]; }
  void Release() override {
    plans_.clear();
    selected_ = std::vector<float>();
  }
  int64_t bound_nodes() const override {
    int64_t n = 0;
    for (const auto& [key, p] : plans_) n += p.session.bound_nodes;
    return n;
  }

 private:
  size_t Bucket(int32_t n) const {
    size_t b = 0;
    while (b + 1 < buckets_.size() && buckets_[b] < n) ++b;
    return b;
  }

  // The held plan for (rows, outputs), made empty (built by its first step)
  // if absent; beyond kMaxHeldPlans, the least recently used other is dropped.
  DecodeSession& PlanFor(int32_t rows, int32_t outputs) {
    const std::pair<int32_t, int32_t> key{rows, outputs};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      if (plans_.size() >= kMaxHeldPlans) {
        auto oldest = std::min_element(plans_.begin(), plans_.end(),
                                       [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
        plans_.erase(oldest);
      }
      it = plans_.try_emplace(key).first;
    }
    it->second.last_used = ++uses_;
    return it->second.session;
  }

  // Mixed steps make plans of many (rows, outputs) pairs; a decode-only load
  // uses one per batch bucket. The cap bounds a worker's plan memory.
  static constexpr size_t kMaxHeldPlans = 24;
  struct HeldPlan {
    DecodeSession session;
    uint64_t last_used = 0;
  };

  std::shared_ptr<const ModelImpl> model_;
  const int32_t max_batch_;
  std::vector<int32_t> buckets_;
  // Keyed by (plan rows, plan outputs); std::map keeps each DecodeSession at
  // one address while others are added.
  std::map<std::pair<int32_t, int32_t>, HeldPlan> plans_;
  uint64_t uses_ = 0;
  std::vector<DecodeRow> rows_;
  std::vector<StepSpan> spans_;
  std::vector<float> selected_;
};

absl::StatusOr<std::unique_ptr<BatchDecoder>> ModelImpl::NewBatchDecoder(int32_t max_batch,
                                                                        int32_t max_step_tokens) const {
  if (max_batch < 1 || max_batch > kMaxBatch) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch ", max_batch, " must be in [1, ", kMaxBatch, "]"));
  }
  if (max_step_tokens < 0 || max_step_tokens > kMaxStepTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_step_tokens ", max_step_tokens, " must be in [0, ", kMaxStepTokens, "]"));
  }
  return std::unique_ptr<BatchDecoder>(new BatchDecoderImpl(shared_from_this(), max_batch, max_step_tokens));
}

std::string DominantWeightType(const GgufFile& file) {
  std::map<std::string, uint64_t> bytes;
  for (const GgufTensorInfo& t : file.tensors()) bytes[std::string(DTypeName(t.type))] += t.nbytes;
  std::string best;
  uint64_t most = 0;
  for (const auto& [name, n] : bytes) {
    if (n > most) {
      most = n;
      best = name;
    }
  }
  return best;
}

// Refuses a model its backend cannot run, at load: the one-token decode
// graph has every op and weight type a step uses (a prefill chunk differs
// only in its row count), and the backend copies the weights it reads.
absl::Status PrepareBackend(const DecodeModel& family, Backend& backend) {
  const Graph graph = build_one_token_decode_graph(family);
  if (absl::Status s = backend.CheckSupported(graph); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("model family ", family.family(), " cannot run on ",
                                                      std::string(backend.name()), " (", backend.device_name(), "): ",
                                                      s.message()));
  }
  if (absl::Status s = backend.PrepareWeights(graph); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the weights do not fit ", std::string(backend.name()), " (",
                                               backend.device_name(), "): ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int32_t> BatchBuckets(int32_t max_rows) {
  std::vector<int32_t> out;
  // 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, ...: each a power of two or
  // 1.5 times one.
  for (int32_t p = 1; p < max_rows; p *= 2) {
    out.push_back(p);
    if (p >= 2 && p + p / 2 < max_rows) out.push_back(p + p / 2);
  }
  out.push_back(std::max(max_rows, 1));
  return out;
}

absl::StatusOr<std::shared_ptr<const Model>> Model::Load(const std::string& gguf_path,
                                                         const ModelLoadOptions& options) {
  std::shared_ptr<Backend> backend = options.backend ? options.backend : SharedCpuBackend();
  auto file = GgufFile::Open(gguf_path, options.load);
  if (!file.ok()) return file.status();
  // Held mutable here only to drop its metadata once read (below).
  std::shared_ptr<GgufFile> shared_file(std::move(*file));
  auto weights = Weights::FromGguf(shared_file);
  if (!weights.ok()) return weights.status();
  FamilyOptions family_options;
  family_options.backend = backend.get();
  auto family = CreateFamily(*weights, family_options);
  if (!family.ok()) return family.status();
  auto tokenizer = Tokenizer::FromGguf(*shared_file, options.chat_template_override);
  if (!tokenizer.ok()) return tokenizer.status();
  if ((*tokenizer)->vocab_size() != (*family)->dims().vocab) {
    return absl::InvalidArgumentError(absl::StrCat("model file: tokenizer has ", (*tokenizer)->vocab_size(),
                                                   " tokens but the embedding has ", (*family)->dims().vocab, " rows"));
  }
  if (const char* why = (*family)->dims().kv_layout().TypeProblem(options.kv_type); *why != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV type ", IsKvType(options.kv_type) ? DTypeName(options.kv_type) : "(unknown)", " for ",
        (*family)->family(), " (k_dim=", (*family)->dims().kv_layout().k_dim, ", v_dim=",
        (*family)->dims().kv_layout().v_dim, "): ", why));
  }
  if (absl::Status s = PrepareBackend(**family, *backend); !s.ok()) return s;
  ModelInfo info;
  info.family = (*family)->family();
  info.name = shared_file->GetString("general.name").value_or("");
  info.context_length = (*family)->trained_context_length();
  info.vocab_size = (*family)->dims().vocab;
  info.n_layers = (*family)->dims().n_layers;
  info.hidden_size = (*family)->dims().hidden;
  const MaskPlan& mp = (*family)->mask_plan();
  for (int32_t v = 0; v < mp.n_variants(); ++v) info.sliding_window = std::max(info.sliding_window, mp.window(v));
  info.weight_dtype = DominantWeightType(*shared_file);
  info.file_type = GgufFileTypeName(*shared_file);
  info.backend = std::string(backend->name());
  info.device = backend->device_name();
  info.kv_type = DTypeName(options.kv_type);
  // Everything that reads metadata has: the family, the tokenizer (own copy of
  // the vocabulary) and `info`. The weights keep only the tensors.
  shared_file->DropMetadata();
  return std::shared_ptr<const Model>(std::make_shared<ModelImpl>(std::move(backend), *std::move(weights),
                                                                  *std::move(family), *std::move(tokenizer),
                                                                  std::move(info), options.kv_type));
}

}  // namespace decoded
