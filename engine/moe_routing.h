// How a mixture-of-experts layer turns one row of router logits into the k
// experts it runs and their weights: the attributes of Graph::moe_ffn and of
// the CPU kernel behind it (cpu::MoeRoute).
//
// Per row, in this order (llama.cpp build_moe_ffn, HF DeepseekV2TopkRouter /
// DeepseekV3TopkRouter / Qwen3MoeTopKRouter):
//   1. probs p = softmax(logits) (kSoftmax) or sigmoid(logits) (kSigmoid);
//   2. selection scores s = p + bias, the optional per-expert selection bias
//      (DeepSeek-V3's e_score_correction_bias, GGUF exp_probs_b); the bias
//      steers the choice only, never the weights;
//   3. group-limited selection when n_group > 1: the n_expert experts are
//      n_group consecutive groups; each group is scored (kMax: its largest s,
//      DeepSeek-V2 "group_limited_greedy"; kTop2Sum: the sum of its two
//      largest s, DeepSeek-V3 "noaux_tc") and only the experts of the
//      topk_group best groups stay eligible;
//   4. the k eligible experts with the largest s, in descending order, ties
//      taken by the lower index (groups alike);
//   5. weights w_j = p[e_j]; divided by their sum when norm_topk_prob; then
//      multiplied by scale (routed_scaling_factor; 1 = none).
// The layer's output is sum_j w_j * expert_{e_j}(x).
#ifndef DECODED_ENGINE_MOE_ROUTING_H_
#define DECODED_ENGINE_MOE_ROUTING_H_

#include <cstdint>

namespace decoded {

enum class MoeGating : int32_t {
  kSoftmax = 0,
  kSigmoid = 1,
};

enum class MoeGroupScore : int32_t {
  kMax = 0,      // DeepSeek-V2 group_limited_greedy
  kTop2Sum = 1,  // DeepSeek-V3 noaux_tc (groups of >= 2 experts)
};

struct MoeRouting {
  int32_t n_expert = 0;
  int32_t k = 0;  // experts used per row, in [1, n_expert]
  MoeGating gating = MoeGating::kSoftmax;
  bool norm_topk_prob = false;
  float scale = 1.0f;
  int32_t n_group = 1;     // divides n_expert; 1: no groups
  int32_t topk_group = 1;  // groups kept, in [1, n_group]; k <= topk_group * n_expert / n_group
  MoeGroupScore group_score = MoeGroupScore::kMax;
  bool has_bias = false;   // a selection bias f32 [n_expert] is given
};

}  // namespace decoded

#endif  // DECODED_ENGINE_MOE_ROUTING_H_
