// One turn's generation state and its step function: the per-turn generation
// loop, unrolled into steps so the scheduler can interleave sessions.
//
// A turn's prompt is prefilled in chunks of at most kMaxPrefillChunk tokens
// (one chunk per step); the step that prefills the last chunk also samples the
// first token. Every later step feeds the previously sampled token through
// Decode and samples the next. After each sampled token the stop rules run in
// this order: stop sequence (text) -> stop token (end-of-generation ids unless
// ignore_eos, then stop_token_ids) -> max_new_tokens -> context full.
//
// The last sampled token is never fed within its turn (generation ended), so
// it is handed back as "carry": the session prepends it to its next turn's
// prompt, keeping the KV cache equal to the full token history. A turn that
// ends before its prefill has fed the carry it was given hands it back too.
//
// Logits that are not finite (NaN, infinity: a broken model file or kernel)
// are never sampled from: the turn ends with kError (INTERNAL).
//
// Not thread-safe: the scheduler runs one step of a session at a time.
#ifndef DECODED_ENGINE_SERVING_TURN_RUNNER_H_
#define DECODED_ENGINE_SERVING_TURN_RUNNER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime.h"
#include "engine/sampling/sampler.h"
#include "engine/serving/engine.h"
#include "engine/serving/serving_model.h"

namespace decoded::serving {

using Clock = std::chrono::steady_clock;

// A validated turn with its input already tokenized.
struct PreparedTurn {
  // A chat turn: `messages` continue the session's conversation and the
  // scheduler derives `prompt` when the turn starts (Scheduler::StartTurn),
  // from the template's rendering of the whole conversation.
  bool chat = false;
  std::vector<ChatMessage> messages;
  std::vector<int32_t> prompt;  // the turn's own input tokens (non-empty), without a BOS the server adds
  // >= 0: the model's BOS, prepended when the turn opens an empty context
  // (unless the prompt already starts with it). -1: the prompt is used as is.
  int32_t bos_id = -1;
  SamplingParams sampling;
  StoppingParams stopping;
  bool prompt_logprobs = false;
};

struct StepOutput {
  bool prefill = false;   // the step ran Prefill (else Decode, or nothing)
  double seconds = 0;     // duration of the model call
  int32_t fed = 0;        // tokens the model call put into the KV cache
  std::vector<TokenEvent> tokens;
  std::optional<TurnEnd> end;  // set when the turn ended with this step
  bool nonfinite_logits = false;  // the step ended the turn because of NaN/inf logits
};

class TurnRunner {
 public:
  // `carry`: tokens of the context not yet in the KV cache; they are
  // prefilled first. Its first `recompute` tokens are context whose KV blocks
  // were given back (a preemption, Scheduler): they are computed again but
  // are not this turn's input, so they give no prompt logprobs, and
  // Usage::cached_tokens does not count them. The rest were sampled by
  // earlier turns and never fed. Penalties see none of the carry: only the
  // turn's prompt and what it generates. `context_tokens`: the
  // session's context when the turn begins (KV cache + carry). `turn.prompt`
  // is final (BOS placed).
  TurnRunner(const ServingModel& model, PreparedTurn turn, std::vector<int32_t> carry,
             int32_t context_tokens, Clock::time_point accepted, int32_t recompute = 0);
  TurnRunner(const TurnRunner&) = delete;
  TurnRunner& operator=(const TurnRunner&) = delete;

  // Runs one step on `ctx`. A failing model call ends the turn with kError.
  // `max_prefill_chunk` (1..kMaxPrefillChunk) bounds a prefill step: the
  // scheduler passes a small one while other sessions wait, so one long
  // prompt does not stall their decoding for a whole large chunk.
  StepOutput Step(DecodeContext& ctx, Executor& executor, int32_t max_prefill_chunk = kMaxPrefillChunk);

  // The token the next step feeds through Decode when that step is a decode
  // step (the prompt is in the KV cache and a sampled token waits); nullopt
  // when the next step prefills. A decode step may then run outside, batched
  // with other sessions' (BatchDecoder), and be completed by FinishDecode.
  std::optional<int32_t> PendingDecodeToken() const;

  // Tokens of the prompt (carry first) not yet in the KV cache.
  int32_t PrefillRemaining() const { return static_cast<int32_t>(prefill_.size() - prefill_pos_); }
  // The next `n` of them (1 <= n <= PrefillRemaining()): a prefill span a
  // mixed step (BatchDecoder::Step) runs outside, completed by FinishPrefill.
  absl::Span<const int32_t> NextPrefill(int32_t n) const {
    return absl::MakeConstSpan(prefill_).subspan(prefill_pos_, static_cast<size_t>(n));
  }
  // The logits rows a span of the next `n` prefill tokens needs: every row
  // for prompt logprobs, else the last when the span ends the prompt and the
  // turn samples, else none.
  SpanLogits PrefillLogits(int32_t n) const;
  // Completes a prefill span of the next `n` tokens that ran elsewhere:
  // `logits` holds the rows PrefillLogits(n) asked for (or the step's error),
  // `seconds` the step's duration. Samples the first token when the span
  // ends the prompt, as Step does.
  StepOutput FinishPrefill(int32_t n, absl::StatusOr<absl::Span<const float>> logits, double seconds,
                           DecodeContext& ctx);

  // Completes a decode step that ran elsewhere: `logits` are this turn's row
  // [vocab] (or the step's error), `seconds` the step's duration; samples and
  // applies the stop rules as Step does.
  StepOutput FinishDecode(absl::StatusOr<absl::Span<const float>> logits, double seconds, DecodeContext& ctx);

  // Ends the turn before its next step with `reason` (kCancelled or
  // kShutdown); text held back (stop-sequence prefix, incomplete UTF-8)
  // goes out as TurnEnd::text.
  TurnEnd End(FinishReason reason);

  // Before the turn's first step: the KV cache's `tokens` (its whole
  // context, in order) were given back; they become recomputed carry, ahead
  // of the carry the turn was given (see the constructor's `recompute`).
  void PrependRecompute(absl::Span<const int32_t> tokens);

  // Prefix caching, before the turn's first step: what it prefills (carry,
  // then prompt) from the context's first position on, when the context
  // held nothing at its start; and the first `n` of them (< their number)
  // are in the KV cache already, from cached blocks (0: undo). They count
  // as Usage::cached_tokens; penalties saw them as input all the same.
  absl::Span<const int32_t> prefill_tokens() const { return prefill_; }
  void SkipCachedPrefill(int32_t n);
  int32_t cached_prefix() const { return static_cast<int32_t>(cached_prefix_); }

  // The tokens this turn has put into the KV cache (cached prefix, prefill,
  // then the sampled ones fed back), and the i-th of them.
  size_t fed_tokens() const { return prefill_pos_ + generated_ids_.size() - (unfed_ ? 1 : 0); }
  int32_t FedToken(size_t i) const {
    return i < prefill_pos_ ? prefill_[i] : generated_ids_[i - prefill_pos_];
  }

  // Tokens of the context not in the KV cache once the turn has ended: the
  // last sampled token, or the carry this turn was given if it never fed it.
  std::vector<int32_t> TakeCarry();
  // How many leading tokens of what TakeCarry returns (call it first) are
  // recomputed context that was never fed.
  int32_t UnfedRecompute() const {
    return prefill_pos_ < recompute_ ? static_cast<int32_t>(recompute_ - prefill_pos_) : 0;
  }

  // Appends the tokens this turn put into the context (its prompt tokens
  // that were fed, then every sampled token, the unfed last one included) to
  // `history`, which held the context when the turn began.
  void AppendContextTokens(std::vector<int32_t>& history) const;

  const PreparedTurn& turn() const { return turn_; }
  int32_t generated() const { return generated_; }
  bool prompt_complete() const { return PromptTokensFed() == static_cast<int32_t>(turn_.prompt.size()); }
  // The reply text the client received (token events and TurnEnd::text).
  const std::string& reply_text() const { return reply_text_; }

 private:
  void SampleAndEmit(absl::Span<const float> logits, DecodeContext& ctx, StepOutput& out);
  // Ends the turn with kError: `status`, or INTERNAL for non-finite logits.
  void EndWithError(absl::Status status, StepOutput& out);
  // The prompt tokens (not carry) that have entered the context.
  int32_t PromptTokensFed() const;
  TurnEnd MakeEnd(FinishReason reason);

  const ServingModel& model_;
  PreparedTurn turn_;
  std::vector<int32_t> prefill_;  // carry + prompt
  size_t carry_size_ = 0;
  size_t recompute_ = 0;  // leading carry tokens that are recomputed context
  size_t cached_prefix_ = 0;  // leading prefill tokens mapped from cached blocks
  size_t prefill_pos_ = 0;
  int32_t context_at_start_ = 0;
  Sampler sampler_;
  StopMatcher stop_matcher_;
  std::unique_ptr<TextDecoder> text_;
  std::optional<int32_t> unfed_;  // last sampled token, not yet through Decode
  int32_t generated_ = 0;
  std::vector<int32_t> generated_ids_;
  std::string reply_text_;
  std::vector<float> prompt_logprobs_;

  Clock::time_point accepted_;
  std::optional<Clock::time_point> first_step_;
  std::optional<Clock::time_point> first_token_;
  Clock::time_point last_token_;
  double prefill_seconds_ = 0;
  double decode_seconds_ = 0;
};

// log softmax(logits)[id], accumulated in double. `logits` is one [vocab] row.
float LogSoftmaxAt(absl::Span<const float> logits, int32_t id);

// True when every value is finite (no NaN, no infinity).
bool AllFinite(absl::Span<const float> values);

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_TURN_RUNNER_H_
