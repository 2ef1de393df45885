// The mixture-of-experts SwiGLU FFN as llama.cpp's converter writes it
// (conversion/qwen.py Qwen2MoeModel, shared by qwen3moe): per layer a router
// blk.N.ffn_gate_inp.weight [n_expert, hidden] and the experts stacked into
// 3-D tensors blk.N.ffn_{gate,up}_exps.weight [n_expert, expert_ffn, hidden]
// and blk.N.ffn_down_exps.weight [n_expert, hidden, expert_ffn]
// (GGUF ne = {cols, rows, n_expert}).
//
// Keys: <arch>.expert_count (n_expert), <arch>.expert_used_count (k, in
// [1, n_expert]), <arch>.expert_feed_forward_length, and optionally
// <arch>.expert_weights_norm (bool: renormalize the k routing weights; absent
// means the family's default, which for qwen3moe is llama.cpp's fixed true,
// HF's norm_topk_prob of every released Qwen3-MoE).
//
// A family that uses it reads the config once, binds each layer's weights and
// builds the FFN with one Graph::moe_ffn node fed by the router matmul, so
// the routing is data the held decode plan reads per token.
#ifndef DECODED_MODELS_MOE_FFN_H_
#define DECODED_MODELS_MOE_FFN_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/graph/graph.h"
#include "engine/hparams.h"

namespace decoded {

struct MoeFfnConfig {
  int32_t n_expert = 0;
  int32_t k = 0;
  int32_t expert_ffn = 0;
  bool norm_topk_prob = true;
};

struct MoeFfnWeights {
  const WeightTensor* router = nullptr;     // ffn_gate_inp.weight [n_expert, hidden]
  const WeightTensor* gate_exps = nullptr;  // [n_expert, expert_ffn, hidden]
  const WeightTensor* up_exps = nullptr;    // [n_expert, expert_ffn, hidden]
  const WeightTensor* down_exps = nullptr;  // [n_expert, hidden, expert_ffn]
};

// INVALID_ARGUMENT naming the key for a count out of range (k = 0, k >
// n_expert, n_expert above kMaxMoeExperts); UNIMPLEMENTED naming the key for
// routing this layer does not do (a gating function other than softmax,
// expert weight scaling, shared experts, expert groups).
absl::StatusOr<MoeFfnConfig> ReadMoeFfnConfig(const HParams& hp, bool default_norm_topk_prob);

// Layer `layer`'s router and experts, every shape checked against the keys
// (INVALID_ARGUMENT naming tensor and key; NOT_FOUND naming a missing tensor);
// UNIMPLEMENTED for shared-expert tensors (ffn_*_shexp).
absl::StatusOr<MoeFfnWeights> BindMoeFfn(const HParams& hp, const Weights& weights, int32_t layer,
                                         const MoeFfnConfig& cfg, const Dim& hidden);

// h f32 [rows, hidden] -> f32 [rows, hidden]; nodes "<prefix>ffn_gate_inp" and
// "<prefix>ffn_moe".
NodeId BuildMoeFfn(Graph& g, NodeId h, const MoeFfnWeights& w, const MoeFfnConfig& cfg, const std::string& prefix);

// Upper bound on expert_count: far above released models (Qwen3-MoE 128,
// DeepSeek-V3 256), low enough that routing scans stay trivial.
inline constexpr int64_t kMaxMoeExperts = 4096;

}  // namespace decoded

#endif  // DECODED_MODELS_MOE_FFN_H_
