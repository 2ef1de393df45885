#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/exp_poly.h"
#include "engine/sampling/row_kernels.h"

namespace decoded {
namespace {

namespace row = sampling_internal;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

absl::Status Invalid(const char* field, double value, const char* range) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, " is outside ", range));
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return Invalid("temperature", p.temperature, "[0, inf)");
  }
  if (p.top_k < 0) return Invalid("top_k", p.top_k, "[0, inf) (0 = off)");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return Invalid("top_p", p.top_p, "(0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) return Invalid("min_p", p.min_p, "[0, 1)");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) {
    return Invalid("repetition_penalty", p.repetition_penalty, "(0, inf) (1 = off)");
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return Invalid("presence_penalty", p.presence_penalty, "[-2, 2]");
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return Invalid("frequency_penalty", p.frequency_penalty, "[-2, 2]");
  }
  if (p.top_logprobs < 0 || p.top_logprobs > 20) return Invalid("top_logprobs", p.top_logprobs, "[0, 20]");
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias has ", p.logit_bias.size(), " entries, over the limit of ", kMaxLogitBias));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias of token ", id, " = ", bias, " is outside [-100, 100]"));
    }
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size)
    : params_(params), vocab_size_(std::max(vocab_size, 0)), rng_(params.seed) {
  SamplingParams& p = params_;
  if (!std::isfinite(p.temperature) || p.temperature < kGreedyTemperature) p.temperature = 0.0f;
  if (p.top_k < 0) p.top_k = 0;
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) p.top_p = 1.0f;
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f)) p.min_p = 0.0f;
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0.0f) p.repetition_penalty = 1.0f;
  p.presence_penalty = std::isfinite(p.presence_penalty) ? std::clamp(p.presence_penalty, -2.0f, 2.0f) : 0.0f;
  p.frequency_penalty =
      std::isfinite(p.frequency_penalty) ? std::clamp(p.frequency_penalty, -2.0f, 2.0f) : 0.0f;
  p.top_logprobs = std::clamp(p.top_logprobs, 0, 20);
  std::erase_if(p.logit_bias, [](const std::pair<int32_t, float>& b) { return !std::isfinite(b.second); });
  for (auto& b : p.logit_bias) b.second = std::clamp(b.second, -100.0f, 100.0f);
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) p.logit_bias.resize(kMaxLogitBias);
}

void Sampler::AcceptPrompt(int32_t id) {
  if (id < 0 || id >= vocab_size_) return;
  counts_.try_emplace(id, 0);
}

void Sampler::Accept(int32_t id) {
  if (id < 0 || id >= vocab_size_) return;
  ++counts_[id];
  ++generated_;
}

void Sampler::ApplyLogitBias(absl::Span<float> logits) const {
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] += bias;
  }
}

void Sampler::ApplyPenalties(absl::Span<float> logits) const {
  const SamplingParams& p = params_;
  if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  for (const auto& [id, count] : counts_) {
    if (static_cast<size_t>(id) >= logits.size()) continue;
    float& l = logits[id];
    if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    if (count > 0) l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  }
}

size_t Sampler::SelectCandidates(const float* x, size_t n, float m) {
  const SamplingParams& p = params_;
  float* w = scratch_weights_.data();
  int32_t* ids = scratch_ids_.data();
  // Best first; lower id first among equal logits so results are reproducible.
  auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };

  size_t count = n;
  bool all = true;  // ids[] not yet filled: the candidates are every id
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    count = SelectTopK(x, n, static_cast<size_t>(p.top_k));
    all = false;
  }
  if (p.top_p < 1.0f) {
    // Probabilities at temperature 1, renormalised over the top-k survivors.
    double z = 0.0;
    if (all) {
      z = row::ExpShifted(x, n, m, 1.0f, w);
      // The nucleus is a highest-first prefix, so it lies inside
      // {x >= m - d} as soon as that set's mass reaches the target; widen d
      // until it does, sorting only that set instead of the vocabulary.
      const double target = static_cast<double>(p.top_p) * z;
      for (float d : {8.0f, 16.0f, 32.0f, std::numeric_limits<float>::infinity()}) {
        const float threshold = m - d;
        double mass = 0.0;
        count = 0;
        for (size_t i = 0; i < n; ++i) {
          if (x[i] >= threshold) {
            ids[count++] = static_cast<int32_t>(i);
            mass += w[i];
          }
        }
        if (mass >= target) break;
      }
      all = false;
    } else {
      for (size_t i = 0; i < count; ++i) z += ExpNonPositive(x[ids[i]] - m);
    }
    // Sort a growing prefix until it holds the nucleus (flat distributions
    // can leave many ids within d of the maximum).
    const double target = static_cast<double>(p.top_p) * z;
    size_t prefix = std::min<size_t>(count, 64);
    while (true) {
      if (prefix < count) std::nth_element(ids, ids + prefix, ids + count, better);
      std::sort(ids, ids + prefix, better);
      double cumulative = 0.0;
      size_t keep = 0;
      for (size_t i = 0; i < prefix; ++i) {
        cumulative += ExpNonPositive(x[ids[i]] - m);
        if (cumulative >= target) {
          keep = i + 1;
          break;
        }
      }
      if (keep > 0) {
        count = keep;
        break;
      }
      if (prefix == count) break;  // rounding: the whole set is the nucleus
      prefix = std::min(count, prefix * 8);
    }
    // min-p on a sorted set is a prefix cut.
    if (p.min_p > 0.0f) {
      const float threshold = m + std::log(p.min_p);
      size_t keep = 1;
      while (keep < count && x[ids[keep]] >= threshold) ++keep;
      count = keep;
    }
    return count;
  }
  if (p.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p) (temperature 1).
    const float threshold = m + std::log(p.min_p);
    size_t kept = 0;
    if (all) {
      for (size_t i = 0; i < n; ++i) {
        if (x[i] >= threshold) ids[kept++] = static_cast<int32_t>(i);
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        if (x[ids[i]] >= threshold) ids[kept++] = ids[i];
      }
    }
    return kept;
  }
  if (all) {
    // top_k >= vocabulary size: no filter applied, every id is a candidate.
    for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
  }
  return count;  // top-k only (the other branches return above)
}

size_t Sampler::SelectTopK(const float* x, size_t n, size_t k) {
  int32_t* ids = scratch_ids_.data();
  // k-th largest value with a size-k min-heap: one pass, and after the first
  // few hundred elements almost every comparison rejects.
  float* heap = scratch_weights_.data();
  std::copy(x, x + k, heap);
  std::make_heap(heap, heap + k, std::greater<float>());
  for (size_t i = k; i < n; ++i) {
    i += row::FindFirstAbove(x + i, n - i, heap[0]);
    if (i == n) break;
    std::pop_heap(heap, heap + k, std::greater<float>());
    heap[k - 1] = x[i];
    std::push_heap(heap, heap + k, std::greater<float>());
  }
  const float kth = heap[0];
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    i += row::FindFirstAbove(x + i, n - i, kth);
    if (i == n) break;
    ids[count++] = static_cast<int32_t>(i);
  }
  // Ties at the k-th value: lowest ids first.
  for (size_t i = 0; i < n && count < k; ++i) {
    i += row::FindFirstEqual(x + i, n - i, kth);
    if (i == n) break;
    ids[count++] = static_cast<int32_t>(i);
  }
  return count;
}

int32_t Sampler::DrawAll(const float* x, size_t n, float max_logit) {
  float* w = scratch_weights_.data();
  const double total = row::ExpShifted(x, n, max_logit, 1.0f / params_.temperature, w);
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  // Inverse CDF: the first id whose cumulative weight exceeds u. Whole
  // blocks whose mass ends at or below u are stepped over by their sum (a
  // vectorized row kernel) instead of one dependent add per id.
  constexpr size_t kBlock = 256;
  double cumulative = 0.0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const double block = row::Sum(w + i, kBlock);
    if (u < cumulative + block) break;
    cumulative += block;
  }
  for (; i < n; ++i) {
    if (w[i] <= 0.0f) continue;
    cumulative += w[i];
    if (u < cumulative) return static_cast<int32_t>(i);
  }
  // Rounding left u at the very top: the last id with a positive weight.
  for (size_t j = n; j-- > 0;) {
    if (w[j] > 0.0f) return static_cast<int32_t>(j);
  }
  return 0;
}

int32_t Sampler::Draw(const float* x, absl::Span<const int32_t> ids, float max_logit) {
  float* w = scratch_weights_.data();
  const float inv_t = 1.0f / params_.temperature;
  for (size_t i = 0; i < ids.size(); ++i) w[i] = ExpNonPositive((x[ids[i]] - max_logit) * inv_t);
  const double total = row::Sum(w, ids.size());
  // 53 random bits -> uniform double in [0, 1): identical on every platform,
  // unlike std::uniform_real_distribution.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0.0;
  int32_t last_positive = ids.empty() ? 0 : ids[0];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (w[i] <= 0.0f) continue;
    cumulative += w[i];
    last_positive = ids[i];
    if (u < cumulative) return ids[i];
  }
  return last_positive;  // rounding left u at the very top
}

void Sampler::FillTopLogprobs(absl::Span<const float> raw, float log_z, SampleResult& result) const {
  const size_t want = static_cast<size_t>(params_.top_logprobs);
  const size_t n = raw.size();
  std::vector<TokenLogprob>& top = result.top;
  top.reserve(want + 1);
  size_t i = 0;
  for (; i < n && top.size() < want; ++i) {
    const float v = std::isnan(raw[i]) ? kNegInf : raw[i];
    // Insert keeping best-first order; equal logits keep the lower id first.
    auto pos = std::upper_bound(top.begin(), top.end(), v,
                                [](float value, const TokenLogprob& t) { return value > t.logprob; });
    top.insert(pos, TokenLogprob{static_cast<int32_t>(i), v});
  }
  // Full: only a logit above the current last one enters (NaN never does);
  // the row kernel skips the rest of the vocabulary a vector at a time.
  while (want > 0 && i < n) {
    i += row::FindFirstAbove(raw.data() + i, n - i, top.back().logprob);
    if (i == n) break;
    const float v = raw[i];
    top.insert(std::upper_bound(top.begin(), top.end(), v,
                                [](float value, const TokenLogprob& t) { return value > t.logprob; }),
               TokenLogprob{static_cast<int32_t>(i), v});
    top.pop_back();
    ++i;
  }
  for (TokenLogprob& t : top) t.logprob -= log_z;
}

bool Sampler::AdjustsLogits() const {
  const SamplingParams& p = params_;
  return !p.logit_bias.empty() || (!counts_.empty() && p.repetition_penalty != 1.0f) ||
         (generated_ > 0 && (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f));
}

SampleResult Sampler::Sample(absl::Span<const float> logits) {
  SampleResult result{-1, kNegInf, {}};
  const size_t n = logits.size();
  if (n == 0) return result;
  if (scratch_logits_.size() < n) {
    scratch_logits_.resize(n);
    scratch_weights_.resize(n);
    scratch_ids_.resize(n);
  }
  // The logits are read in place unless they must change: NaN becomes -inf
  // and the bias and penalties rewrite the ids they name, in a copy (the raw
  // row stays the reference of the reported logprobs).
  const row::RowMax raw = row::ScanMax(logits.data(), n);
  const bool penalise = AdjustsLogits();
  const float* x = logits.data();
  if (raw.has_nan || penalise) {
    row::SanitizeCopy(logits.data(), n, scratch_logits_.data());
    x = scratch_logits_.data();
  }

  // Log-normaliser of the raw logits, for the reported logprobs.
  float log_z = kNegInf;
  if (std::isfinite(raw.max)) {
    log_z = raw.max + static_cast<float>(std::log(row::SumExpShifted(x, n, raw.max, 1.0f)));
  }

  float m = raw.max;
  if (penalise) {
    ApplyLogitBias(absl::MakeSpan(scratch_logits_.data(), n));
    ApplyPenalties(absl::MakeSpan(scratch_logits_.data(), n));
    m = row::ScanMax(x, n).max;
  }
  const SamplingParams& p = params_;
  if (p.temperature == 0.0f || !std::isfinite(m)) {
    // Argmax, lowest id on ties; every logit NaN / -inf gives id 0.
    const size_t at = row::FindFirstEqual(x, n, m);
    result.id = at < n ? static_cast<int32_t>(at) : 0;
  } else if (p.top_k == 0 && p.top_p >= 1.0f && p.min_p == 0.0f) {
    result.id = DrawAll(x, n, m);
  } else {
    result.id = Draw(x, absl::MakeConstSpan(scratch_ids_.data(), SelectCandidates(x, n, m)), m);
  }
  const float chosen = std::isnan(logits[result.id]) ? kNegInf : logits[result.id];
  result.logprob = std::isfinite(log_z) ? chosen - log_z : kNegInf;
  if (p.top_logprobs > 0) FillTopLogprobs(logits, log_z, result);
  return result;
}

}  // namespace decoded
