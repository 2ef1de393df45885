// Token sampling from a logits row, and stop-sequence matching.
//
// Order of the sampling pipeline (the order llama.cpp's default sampler chain
// and HF `generate` agree on): logit bias -> penalties -> temperature == 0 ?
// argmax : (top-k -> top-p -> min-p -> softmax at temperature -> draw).
// Logit bias as in the OpenAI API (a per-token value added to the logit),
// first as llama.cpp's chain puts its logit-bias sampler.
// Formulas: repetition penalty as in CTRL (Keskar et al. 2019; divide positive,
// multiply negative logits); presence/frequency penalties as in the OpenAI API
// (logit -= presence * [count > 0] + frequency * count).
#ifndef DECODED_ENGINE_SAMPLING_SAMPLER_H_
#define DECODED_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace decoded {

// Temperatures below this are greedy, as in vLLM (its _SAMPLING_EPS): the
// softmax at T divides logits by T, and 1/T of a subnormal T is inf (the
// draw then degenerates), while at T = 1e-5 any logit gap above 0.001
// already gives the top token all the mass a float holds.
inline constexpr float kGreedyTemperature = 1e-5f;

// Most entries of SamplingParams::logit_bias: each costs one add per sampled
// token, so the limit bounds the work one request adds to every step.
inline constexpr int kMaxLogitBias = 1024;

struct SamplingParams {
  float temperature = 0.0f;        // 0 (or below kGreedyTemperature) = greedy; must be >= 0 and finite
  int32_t top_k = 0;               // 0 = off; must be >= 0
  float top_p = 1.0f;              // (0, 1]
  float min_p = 0.0f;              // [0, 1)
  float repetition_penalty = 1.0f; // > 0; 1 = off
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  uint64_t seed = 0;               // same seed + same logits -> same tokens
  int32_t top_logprobs = 0;        // [0, 20]: report this many alternatives per token
  // (token id, bias) pairs, bias added to that id's logit before the
  // penalties; each bias finite, in [-100, 100] (the OpenAI API's range: -100
  // all but bans a token, +100 all but forces it); at most kMaxLogitBias
  // pairs. Ids outside the vocabulary are the caller's to refuse (the
  // sampler ignores them); a repeated id adds each of its biases.
  std::vector<std::pair<int32_t, float>> logit_bias;
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
//
// Semantics of Sample(logits), f32 [n] with n = logits.size() (normally the
// vocabulary size; ids are indices into `logits`):
//  * NaN logits count as -inf (never chosen unless every logit is NaN/-inf,
//    in which case id 0 is returned).
//  * logit_bias is added first; then the penalties (ApplyPenalties):
//    repetition first, on ids seen by AcceptPrompt() or Accept(), then
//    presence/frequency on ids seen by Accept() (llama.cpp's sampler order).
//  * temperature == 0: argmax of the biased, penalised logits (lowest id on ties);
//    top-k/top-p/min-p are then irrelevant.
//  * otherwise, on those logits at temperature 1: top-k keeps the k
//    highest; top-p keeps the smallest highest-first prefix whose probability
//    (renormalised over what top-k kept) reaches top_p; min-p keeps tokens with
//    p >= min_p * p_max; the survivors are drawn from softmax(logit / T) with
//    one 53-bit uniform from mt19937_64(seed) per draw.
//  * logprob / top: log-softmax of the *raw* logits (no bias or penalty,
//    T = 1), as vLLM reports by default.
// Cost: O(n) per call: greedy without penalties reads the row twice (max,
// then the log-normaliser's exp-sum) and finds the first maximum; the row
// kernels are per instruction-set tier (row_kernels.h); top-k uses a size-k heap;
// top-p without top-k sorts only the ids within a few nats of the maximum
// that hold the nucleus, not the whole vocabulary.
// Allocation: scratch buffers grow on the first call only; `top` allocates
// when top_logprobs > 0.
class Sampler {
 public:
  // `params` should have passed ValidateSamplingParams; out-of-range values
  // are clamped to the nearest meaningful setting rather than trusted.
  Sampler(const SamplingParams& params, int32_t vocab_size);
  // A token of the turn's prompt: seen by the repetition penalty only.
  // Ids outside [0, vocab_size) are ignored (as by Accept).
  void AcceptPrompt(int32_t id);
  // A token the turn generated: seen by all three penalties.
  void Accept(int32_t id);
  // An empty `logits` yields {id = -1, logprob = -inf}.
  SampleResult Sample(absl::Span<const float> logits);
  // The bias step of Sample(), in place: logits[id] += bias for each pair of
  // logit_bias with id < logits.size(). O(pairs).
  void ApplyLogitBias(absl::Span<float> logits) const;
  // The penalty step of Sample(), in place, for each id < logits.size() seen
  // by AcceptPrompt() or Accept(): logit = logit > 0 ? logit /
  // repetition_penalty : logit * repetition_penalty (CTRL, Keskar et al.
  // 2019; HF's RepetitionPenaltyLogitsProcessor: prompt and output), then,
  // if Accept() saw it `count` > 0 times, logit -= presence_penalty +
  // frequency_penalty * count (the OpenAI API's formula, whose count is of
  // sampled tokens; vLLM's apply_penalties). O(distinct accepted ids).
  void ApplyPenalties(absl::Span<float> logits) const;

 private:
  // True when a logit bias is set, or a penalty that is not off has ids to
  // act on: Sample() then works on a copy of the logits.
  bool AdjustsLogits() const;
  // Fills scratch_ids_ with the top-k / top-p / min-p survivors of the
  // NaN-free penalised logits x (max m); returns their number.
  size_t SelectCandidates(const float* x, size_t n, float m);
  // The k best ids (lowest ids among ties) into scratch_ids_; returns k.
  size_t SelectTopK(const float* x, size_t n, size_t k);
  // Draws from softmax(x / T) over `ids`, or over all n ids.
  int32_t Draw(const float* x, absl::Span<const int32_t> ids, float max_logit);
  int32_t DrawAll(const float* x, size_t n, float max_logit);
  void FillTopLogprobs(absl::Span<const float> raw, float log_z, SampleResult& result) const;

  SamplingParams params_;
  int32_t vocab_size_;
  std::mt19937_64 rng_;
  // Per id seen: its count among generated tokens (0 for an id seen only in
  // the prompt).
  absl::flat_hash_map<int32_t, int32_t> counts_;
  int64_t generated_ = 0;  // Accept() calls with an id in the vocabulary
  std::vector<float> scratch_logits_;   // NaN-free penalised copy of the logits (when needed), [n]
  std::vector<float> scratch_weights_;  // exp values, [n]
  std::vector<int32_t> scratch_ids_;    // candidate ids, [n]
};

// Detects stop sequences in generated text. Push() returns the text that is
// safe to emit now: text that might still turn out to be the start of a stop
// sequence is held back; once a stop sequence completes, Push() returns the
// text before it and stopped() becomes true (the stop text itself is not emitted).
// Empty stop sequences are ignored. After stopped(), Push() returns "".
// Matching is on bytes; emitted text is cut only at the start of a stop
// sequence or of a held-back prefix of one, so complete UTF-8 input stays
// complete UTF-8 output.
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
