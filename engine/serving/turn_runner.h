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
// prompt, keeping the KV cache equal to the full token history.
//
// Not thread-safe: the scheduler runs one step of a session at a time.
#ifndef DECODED_ENGINE_SERVING_TURN_RUNNER_H_
#define DECODED_ENGINE_SERVING_TURN_RUNNER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/runtime.h"
#include "engine/sampling/sampler.h"
#include "engine/serving/engine.h"
#include "engine/serving/serving_model.h"

namespace decoded::serving {

using Clock = std::chrono::steady_clock;

// A validated turn with its input already tokenized.
struct PreparedTurn {
  std::vector<int32_t> prompt;  // the turn's own input tokens (non-empty)
  SamplingParams sampling;
  StoppingParams stopping;
  bool prompt_logprobs = false;
};

struct StepOutput {
  bool prefill = false;   // the step ran Prefill (else Decode, or nothing)
  double seconds = 0;     // duration of the model call
  std::vector<TokenEvent> tokens;
  std::optional<TurnEnd> end;  // set when the turn ended with this step
};

class TurnRunner {
 public:
  // `carry`: tokens sampled by earlier turns and not yet in `cached_len`
  // positions of the context; they are prefilled first and counted as prompt.
  TurnRunner(const ServingModel& model, PreparedTurn turn, std::vector<int32_t> carry,
             int32_t cached_len, Clock::time_point accepted);
  TurnRunner(const TurnRunner&) = delete;
  TurnRunner& operator=(const TurnRunner&) = delete;

  // Runs one step on `ctx`. A failing model call ends the turn with kError.
  // `max_prefill_chunk` (1..kMaxPrefillChunk) bounds a prefill step: the
  // scheduler passes a small one while other sessions wait, so one long
  // prompt does not stall their decoding for a whole large chunk.
  StepOutput Step(DecodeContext& ctx, Executor& executor, int32_t max_prefill_chunk = kMaxPrefillChunk);

  // Ends the turn with kCancelled (held-back text is dropped).
  TurnEnd Cancel();

  // Sampled tokens not in the KV cache once the turn has ended (0 or 1).
  std::vector<int32_t> TakeCarry();

 private:
  void SampleAndEmit(absl::Span<const float> logits, DecodeContext& ctx, StepOutput& out);
  TurnEnd MakeEnd(FinishReason reason);

  const ServingModel& model_;
  PreparedTurn turn_;
  std::vector<int32_t> prefill_;  // carry + prompt
  size_t prefill_pos_ = 0;
  int32_t cached_at_start_ = 0;
  Sampler sampler_;
  StopMatcher stop_matcher_;
  std::unique_ptr<TextDecoder> text_;
  std::optional<int32_t> unfed_;  // last sampled token, not yet through Decode
  int32_t generated_ = 0;
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

}  // namespace decoded::serving

#endif  // DECODED_ENGINE_SERVING_TURN_RUNNER_H_
