// The mixture-of-experts SwiGLU FFN as llama.cpp's converter writes it
// (conversion/qwen.py Qwen2MoeModel for qwen3moe, conversion/deepseek.py
// DeepseekV2Model for deepseek2): per layer a router
// blk.N.ffn_gate_inp.weight [n_expert, hidden], the experts stacked into 3-D
// tensors blk.N.ffn_{gate,up}_exps.weight [n_expert, expert_ffn, hidden] and
// blk.N.ffn_down_exps.weight [n_expert, hidden, expert_ffn] (GGUF ne = {cols,
// rows, n_expert}); optionally the selection bias blk.N.exp_probs_b.bias
// [n_expert] (f32; DeepSeek-V3's e_score_correction_bias) and the shared
// experts blk.N.ffn_{gate,up}_shexp.weight [n_shared * expert_ffn, hidden],
// blk.N.ffn_down_shexp.weight [hidden, n_shared * expert_ffn]: one dense
// SwiGLU FFN every token runs, added to the routed output (DeepSeekMoE,
// Dai et al. 2024; HF DeepseekV2Moe.shared_experts).
//
// Keys (<arch>.*), the routing they set being engine/moe_routing.h's:
//   expert_count               n_expert, in [2, kMaxMoeExperts];
//   expert_used_count          k, in [1, n_expert];
//   expert_feed_forward_length expert_ffn;
//   expert_weights_norm        bool, renormalize the k weights (HF
//                              norm_topk_prob); absent: the family's default
//                              (qwen3moe: llama.cpp's fixed true; deepseek2:
//                              false, the converter writes only true);
//   expert_weights_scale       routed_scaling_factor, > 0 (0 or absent: 1);
//   expert_gating_func         llama.cpp's enum: 0 (none) or absent = softmax,
//                              1 softmax, 2 sigmoid; 3 (softmax over the
//                              selected weights) and 4 (sqrt softplus) are
//                              UNIMPLEMENTED;
//   expert_group_count         n_group (absent: 1), dividing n_expert;
//   expert_group_used_count    topk_group in [1, n_group], required when
//                              n_group > 1; k must fit in the kept groups;
//   expert_shared_count        n_shared (absent: 0).
// Group scoring is not in the file: softmax routing scores a group by its
// best expert (HF DeepseekV2TopkRouter "group_limited_greedy", DeepSeek-V2),
// sigmoid routing by the sum of its best two (HF DeepseekV3TopkRouter
// "noaux_tc", DeepSeek-V3). llama.cpp's build_moe_ffn always uses the top-2
// sum, so for a softmax model with groups (DeepSeek-V2 236B: 8 groups, 3
// kept) its choice can differ from the reference model's; decoded follows
// the reference (HF).
//
// A family that uses it reads the config once, binds each layer's weights and
// builds the FFN with one Graph::moe_ffn node fed by the router matmul (plus
// the shared experts' ordinary matmuls), so the routing is data the held
// decode plan reads per token.
#ifndef DECODED_MODELS_MOE_FFN_H_
#define DECODED_MODELS_MOE_FFN_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/graph/graph.h"
#include "engine/hparams.h"
#include "engine/moe_routing.h"

namespace decoded {

struct MoeFfnConfig {
  MoeRouting routing;  // n_expert, k, gating, norm_topk_prob, scale, groups (has_bias: per layer)
  int32_t expert_ffn = 0;
  int32_t n_shared = 0;  // shared experts, fused into one FFN of n_shared * expert_ffn

  template <typename H>
  friend H AbslHashValue(H h, const MoeFfnConfig& c) {
    const MoeRouting& r = c.routing;
    return H::combine(std::move(h), r.n_expert, r.k, static_cast<int>(r.gating), r.norm_topk_prob, r.scale,
                      r.n_group, r.topk_group, static_cast<int>(r.group_score), c.expert_ffn, c.n_shared);
  }
};

struct MoeFfnWeights {
  const WeightTensor* router = nullptr;     // ffn_gate_inp.weight [n_expert, hidden]
  const WeightTensor* gate_exps = nullptr;  // [n_expert, expert_ffn, hidden]
  const WeightTensor* up_exps = nullptr;    // [n_expert, expert_ffn, hidden]
  const WeightTensor* down_exps = nullptr;  // [n_expert, hidden, expert_ffn]
  const WeightTensor* probs_bias = nullptr;  // exp_probs_b.bias f32 [1, n_expert], or null
  const WeightTensor* gate_shexp = nullptr;  // [n_shared * expert_ffn, hidden], null when n_shared = 0
  const WeightTensor* up_shexp = nullptr;    // [n_shared * expert_ffn, hidden]
  const WeightTensor* down_shexp = nullptr;  // [hidden, n_shared * expert_ffn]
};

// INVALID_ARGUMENT naming the key for a value out of range or inconsistent
// with the others (k = 0, k > n_expert, groups not dividing the experts,
// topk_group > n_group, k above the experts of the kept groups, a negative
// scale); UNIMPLEMENTED naming the key for routing not done here (gating
// functions 3 and 4, expert_shared_feed_forward_length's separately sized
// shared expert).
absl::StatusOr<MoeFfnConfig> ReadMoeFfnConfig(const HParams& hp, bool default_norm_topk_prob);

// Layer `layer`'s router, experts, optional selection bias and shared experts,
// every shape checked against the keys (INVALID_ARGUMENT naming tensor and
// key, also for shared-expert tensors when expert_shared_count is 0 and for a
// bias that is not f32; NOT_FOUND naming a missing tensor); UNIMPLEMENTED
// for a gated shared expert (ffn_gate_inp_shexp, Qwen2-MoE).
absl::StatusOr<MoeFfnWeights> BindMoeFfn(const HParams& hp, const Weights& weights, int32_t layer,
                                         const MoeFfnConfig& cfg, const Dim& hidden);

// h f32 [rows, hidden] -> f32 [rows, hidden]; nodes "<prefix>ffn_gate_inp",
// "<prefix>ffn_moe", and with shared experts "<prefix>ffn_{gate,up,down}_shexp"
// and "<prefix>ffn_moe_out" (routed + shared).
NodeId BuildMoeFfn(Graph& g, NodeId h, const MoeFfnWeights& w, const MoeFfnConfig& cfg, const std::string& prefix);

// Upper bound on expert_count: far above released models (Qwen3-MoE 128,
// DeepSeek-V3 256), low enough that routing scans stay trivial.
inline constexpr int64_t kMaxMoeExperts = 4096;
// Upper bound on expert_shared_count (DeepSeek-V2 2, V2-Lite 2, V3 1).
inline constexpr int64_t kMaxMoeSharedExperts = 64;

}  // namespace decoded

#endif  // DECODED_MODELS_MOE_FFN_H_
