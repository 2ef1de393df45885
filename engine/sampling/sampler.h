// Token sampling from a logits row, and stop-sequence matching.
//
// Order of the sampling pipeline (the order llama.cpp's default sampler chain
// and HF `generate` agree on): penalties -> temperature == 0 ? argmax :
// (top-k -> top-p -> min-p -> softmax at temperature -> draw).
// Formulas: repetition penalty as in CTRL (Keskar et al. 2019; divide positive,
// multiply negative logits); presence/frequency penalties as in the OpenAI API
// (logit -= presence * [count > 0] + frequency * count).
#ifndef DECODED_ENGINE_SAMPLING_SAMPLER_H_
#define DECODED_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace decoded {

struct SamplingParams {
  float temperature = 0.0f;        // 0 = greedy; must be >= 0 and finite
  int32_t top_k = 0;               // 0 = off; must be >= 0
  float top_p = 1.0f;              // (0, 1]
  float min_p = 0.0f;              // [0, 1)
  float repetition_penalty = 1.0f; // > 0; 1 = off
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  uint64_t seed = 0;               // same seed + same logits -> same tokens
  int32_t top_logprobs = 0;        // [0, 20]: report this many alternatives per token
};

// INVALID_ARGUMENT naming the field for any parameter outside its range.
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct TokenLogprob {
  int32_t id;
  float logprob;  // natural log of the probability under the model's softmax at temperature 1
};

struct SampleResult {
  int32_t id;
  float logprob;                     // of the chosen token (unpenalised, temperature 1)
  std::vector<TokenLogprob> top;     // params.top_logprobs alternatives, best first
};

// One sampler per turn. Holds its RNG and the token counts for penalties.
// Not thread-safe. Scratch buffers are reused across calls.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t vocab_size);
  // Tokens already in the context (prompt and generated) for the penalties.
  void Accept(int32_t id);
  SampleResult Sample(absl::Span<const float> logits);

 private:
  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  absl::flat_hash_map<int32_t, int32_t> counts_;
  std::vector<float> scratch_logits_;
  std::vector<int32_t> scratch_ids_;
};

// Detects stop sequences in generated text. Push() returns the text that is
// safe to emit now: text that might still turn out to be the start of a stop
// sequence is held back; once a stop sequence completes, Push() returns the
// text before it and stopped() becomes true (the stop text itself is not emitted).
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stop_sequences);
  std::string Push(std::string_view text);
  std::string Flush();  // held-back text when generation ends for another reason
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_SAMPLING_SAMPLER_H_
