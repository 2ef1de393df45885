#include "engine/serving/turn_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace decoded::serving {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

float LogSoftmaxAt(absl::Span<const float> logits, int32_t id) {
  float max = -INFINITY;
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  return static_cast<float>(static_cast<double>(logits[id]) - max - std::log(sum));
}

bool AllFinite(absl::Span<const float> values) {
  // IEEE 754 binary32: exponent bits all ones is infinity or NaN. A branch-free
  // OR over the row vectorizes; the scan costs ~1% of a decode step.
  uint32_t all_ones = 0;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    all_ones |= static_cast<uint32_t>((bits & 0x7F800000u) == 0x7F800000u);
  }
  return all_ones == 0;
}

TurnRunner::TurnRunner(const ServingModel& model, PreparedTurn turn, std::vector<int32_t> carry,
                       int32_t context_tokens, Clock::time_point accepted, int32_t recompute)
    : model_(model),
      turn_(std::move(turn)),
      prefill_(std::move(carry)),
      carry_size_(prefill_.size()),
      recompute_(std::min(static_cast<size_t>(std::max(recompute, 0)), prefill_.size())),
      context_at_start_(context_tokens),
      sampler_(turn_.sampling, model.vocab_size()),
      stop_matcher_(turn_.stopping.stop_sequences),
      text_(model.NewTextDecoder()),
      accepted_(accepted) {
  prefill_.insert(prefill_.end(), turn_.prompt.begin(), turn_.prompt.end());
  // Penalties see the turn: its prompt now (the repetition penalty only),
  // its generated tokens as sampled. The carry is context from earlier turns
  // (an earlier turn's last sampled token, recomputed context), as when it
  // was cached: the same context gives the same penalties either way.
  for (size_t i = carry_size_; i < prefill_.size(); ++i) sampler_.AcceptPrompt(prefill_[i]);
}

void TurnRunner::PrependRecompute(absl::Span<const int32_t> tokens) {
  if (prefill_pos_ != 0 || first_step_) return;  // only before the first step
  prefill_.insert(prefill_.begin(), tokens.begin(), tokens.end());
  carry_size_ += tokens.size();
  recompute_ += tokens.size();
}

void TurnRunner::SkipCachedPrefill(int32_t n) {
  if (first_step_ || n < 0 || static_cast<size_t>(n) >= prefill_.size() || prefill_pos_ != cached_prefix_) return;
  prefill_pos_ = static_cast<size_t>(n);
  cached_prefix_ = static_cast<size_t>(n);
}

StepOutput TurnRunner::Step(DecodeContext& ctx, Executor& executor, int32_t max_prefill_chunk) {
  const Clock::time_point start = Clock::now();
  if (!first_step_) first_step_ = start;

  if (prefill_pos_ < prefill_.size()) {
    const int32_t n = std::min(std::clamp(max_prefill_chunk, 1, kMaxPrefillChunk), PrefillRemaining());
    absl::StatusOr<absl::Span<const float>> logits = ctx.Prefill(NextPrefill(n), turn_.prompt_logprobs, executor);
    return FinishPrefill(n, std::move(logits), Seconds(Clock::now() - start), ctx);
  }

  // Decode: feed the token sampled last step, sample the next.
  absl::StatusOr<absl::Span<const float>> logits = ctx.Decode(*unfed_, executor);
  return FinishDecode(std::move(logits), Seconds(Clock::now() - start), ctx);
}

SpanLogits TurnRunner::PrefillLogits(int32_t n) const {
  if (turn_.prompt_logprobs) return SpanLogits::kAll;
  const bool ends_prompt = prefill_pos_ + static_cast<size_t>(n) == prefill_.size();
  return ends_prompt && turn_.stopping.max_new_tokens > 0 ? SpanLogits::kLast : SpanLogits::kNone;
}

StepOutput TurnRunner::FinishPrefill(int32_t n, absl::StatusOr<absl::Span<const float>> logits, double seconds,
                                     DecodeContext& ctx) {
  StepOutput out;
  out.prefill = true;
  out.seconds = seconds;
  if (!first_step_) first_step_ = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(seconds));
  prefill_seconds_ += seconds;
  if (!logits.ok()) {
    EndWithError(logits.status(), out);
    return out;
  }
  // The span is in the KV cache now, whatever its logits are.
  const size_t chunk_start = prefill_pos_;
  prefill_pos_ += static_cast<size_t>(n);
  out.fed = n;
  const size_t vocab = static_cast<size_t>(model_.vocab_size());
  // Only rows that are read are checked: prompt logprob rows and the row
  // the first token is sampled from (a span that asked for no rows may still
  // carry one: DecodeContext::Prefill always returns the last).
  const bool samples = prefill_pos_ == prefill_.size() && turn_.stopping.max_new_tokens > 0;
  absl::Span<const float> last;
  if (samples) last = turn_.prompt_logprobs ? logits->subspan((static_cast<size_t>(n) - 1) * vocab, vocab) : *logits;
  if (!AllFinite(turn_.prompt_logprobs ? *logits : last)) {
    out.nonfinite_logits = true;
    EndWithError(absl::OkStatus(), out);
    return out;
  }
  if (turn_.prompt_logprobs) {
    // Row i predicts token chunk_start + i + 1, which may open the next span.
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const size_t next = chunk_start + i + 1;
      if (next >= prefill_.size()) break;
      if (next <= recompute_) continue;  // predicts recomputed context: not the turn's input
      prompt_logprobs_.push_back(LogSoftmaxAt(logits->subspan(i * vocab, vocab), prefill_[next]));
    }
  }
  if (prefill_pos_ < prefill_.size()) return out;
  if (!samples) {
    out.end = MakeEnd(FinishReason::kLength);
    return out;
  }
  if (ctx.cached_len() >= ctx.capacity()) {
    // The prompt filled the context: a sampled token would have no position.
    out.end = MakeEnd(FinishReason::kContextFull);
    return out;
  }
  SampleAndEmit(last, ctx, out);
  return out;
}

std::optional<int32_t> TurnRunner::PendingDecodeToken() const {
  if (prefill_pos_ < prefill_.size()) return std::nullopt;
  return unfed_;
}

StepOutput TurnRunner::FinishDecode(absl::StatusOr<absl::Span<const float>> logits, double seconds,
                                    DecodeContext& ctx) {
  StepOutput out;
  out.seconds = seconds;
  decode_seconds_ += seconds;
  if (!logits.ok()) {
    // The token stays unfed (it is the carry if the turn ends here).
    EndWithError(logits.status(), out);
    return out;
  }
  unfed_.reset();
  out.fed = 1;
  if (!AllFinite(*logits)) {
    out.nonfinite_logits = true;
    EndWithError(absl::OkStatus(), out);
    return out;
  }
  SampleAndEmit(*logits, ctx, out);
  return out;
}

void TurnRunner::EndWithError(absl::Status status, StepOutput& out) {
  TurnEnd end = MakeEnd(FinishReason::kError);
  end.error = out.nonfinite_logits
                  ? absl::InternalError(absl::StrCat("the model produced non-finite logits (NaN or infinity) in "
                                                     "the step ending at context position ",
                                                     end.usage.context_tokens - 1,
                                                     "; the model file or its numbers are broken"))
                  : std::move(status);
  out.end = std::move(end);
}

void TurnRunner::SampleAndEmit(absl::Span<const float> logits, DecodeContext& ctx, StepOutput& out) {
  SampleResult r = sampler_.Sample(logits);
  sampler_.Accept(r.id);
  unfed_ = r.id;
  ++generated_;
  generated_ids_.push_back(r.id);
  const Clock::time_point now = Clock::now();
  if (!first_token_) first_token_ = now;
  last_token_ = now;

  const StoppingParams& stop = turn_.stopping;
  const bool stop_token =
      (!stop.ignore_eos && model_.IsEndOfGeneration(r.id)) ||
      std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), r.id) != stop.stop_token_ids.end();

  TokenEvent event;
  event.id = r.id;
  event.logprob = r.logprob;
  event.top = std::move(r.top);
  // A stop token's own text is not output, like a stop sequence's.
  if (!stop_token) event.text = stop_matcher_.Push(text_->Push(r.id));

  std::optional<FinishReason> reason;
  if (stop_matcher_.stopped()) {
    reason = FinishReason::kStopSequence;
  } else if (stop_token) {
    reason = FinishReason::kStopToken;
  } else if (generated_ >= stop.max_new_tokens) {
    reason = FinishReason::kLength;
  } else if (ctx.cached_len() + 1 >= ctx.capacity()) {
    // The sampled token takes the context's last position (it is fed at the
    // next turn's start); nothing after it would fit.
    reason = FinishReason::kContextFull;
  }
  if (reason && *reason != FinishReason::kStopSequence) {
    event.text += stop_matcher_.Push(text_->Flush());
    if (!stop_matcher_.stopped()) event.text += stop_matcher_.Flush();
  }
  reply_text_ += event.text;
  out.tokens.push_back(std::move(event));
  if (reason) out.end = MakeEnd(*reason);
}

TurnEnd TurnRunner::End(FinishReason reason) {
  TurnEnd end = MakeEnd(reason);
  // Text held back for a possible stop sequence or an incomplete UTF-8
  // sequence goes out with the end, so the turn's events spell everything its
  // tokens put in the context.
  end.text = stop_matcher_.Push(text_->Flush());
  if (!stop_matcher_.stopped()) end.text += stop_matcher_.Flush();
  reply_text_ += end.text;
  return end;
}

void TurnRunner::AppendContextTokens(std::vector<int32_t>& history) const {
  history.insert(history.end(), turn_.prompt.begin(), turn_.prompt.begin() + PromptTokensFed());
  history.insert(history.end(), generated_ids_.begin(), generated_ids_.end());
}

std::vector<int32_t> TurnRunner::TakeCarry() {
  std::vector<int32_t> carry;
  if (prefill_pos_ < carry_size_) carry.assign(prefill_.begin() + prefill_pos_, prefill_.begin() + carry_size_);
  if (unfed_) carry.push_back(*unfed_);
  unfed_.reset();
  prefill_pos_ = std::max(prefill_pos_, carry_size_);
  return carry;
}

int32_t TurnRunner::PromptTokensFed() const {
  return static_cast<int32_t>(prefill_pos_ > carry_size_ ? prefill_pos_ - carry_size_ : 0);
}

TurnEnd TurnRunner::MakeEnd(FinishReason reason) {
  TurnEnd end;
  end.reason = reason;
  end.usage.prompt_tokens = static_cast<int32_t>(turn_.prompt.size());
  end.usage.generated_tokens = generated_;
  // Context it kept, and what the prefix cache gave of the rest (recomputed
  // context included: it was not computed again).
  end.usage.cached_tokens = context_at_start_ - static_cast<int32_t>(recompute_) + static_cast<int32_t>(cached_prefix_);
  end.usage.prefilled_tokens = static_cast<int32_t>(prefill_pos_ - cached_prefix_);
  end.usage.context_tokens = context_at_start_ + PromptTokensFed() + generated_;
  const Clock::time_point now = Clock::now();
  end.timings.queue_ms = Millis((first_step_ ? *first_step_ : now) - accepted_);
  end.timings.ttft_ms = first_token_ ? Millis(*first_token_ - accepted_) : 0;
  end.timings.prefill_ms = prefill_seconds_ * 1e3;
  end.timings.decode_ms = decode_seconds_ * 1e3;
  end.timings.total_ms = Millis(now - accepted_);
  if (generated_ > 1) end.timings.mean_inter_token_ms = Millis(last_token_ - *first_token_) / (generated_ - 1);
  if (turn_.prompt_logprobs) end.prompt_logprobs = std::move(prompt_logprobs_);
  return end;
}

}  // namespace decoded::serving
