#include "models/moe_ffn.h"

#include "absl/strings/str_cat.h"

namespace decoded {

absl::StatusOr<MoeFfnConfig> ReadMoeFfnConfig(const HParams& hp, bool default_norm_topk_prob) {
  namespace hb = hparam_bounds;
  MoeFfnConfig cfg;
  auto n = hp.Int("expert_count", {2, kMaxMoeExperts});
  if (!n.ok()) return n.status();
  cfg.n_expert = *n;
  auto k = hp.Int("expert_used_count", {1, cfg.n_expert, hp.key("expert_count")});
  if (!k.ok()) return k.status();
  cfg.k = *k;
  auto ffn = hp.Int("expert_feed_forward_length", {1, hb::kMaxWidth});
  if (!ffn.ok()) return ffn.status();
  cfg.expert_ffn = *ffn;
  cfg.norm_topk_prob = default_norm_topk_prob;
  const GgufFile& file = hp.weights().file();
  if (file.Find(hp.key("expert_weights_norm")) != nullptr) {
    auto norm = file.GetBool(hp.key("expert_weights_norm"));
    if (!norm.ok()) return norm.status();
    cfg.norm_topk_prob = *norm;
  }
  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX.
  constexpr int64_t kSoftmaxGating = 1;
  if (file.Find(hp.key("expert_gating_func")) != nullptr) {
    auto f = hp.Int("expert_gating_func", {0, 16});
    if (!f.ok()) return f.status();
    if (*f != kSoftmaxGating) {
      return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("expert_gating_func"), " = ", *f,
                                                   " is not supported (only softmax routing, 1)"));
    }
  }
  if (file.Find(hp.key("expert_weights_scale")) != nullptr) {
    auto scale = hp.Float("expert_weights_scale", {0.0, hb::kMaxFloat32});
    if (!scale.ok()) return scale.status();
    if (*scale != 0.0 && *scale != 1.0) {
      return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("expert_weights_scale"), " = ", *scale,
                                                   " is not supported (routing weights are not scaled)"));
    }
  }
  for (const char* key : {"expert_shared_count", "expert_shared_feed_forward_length", "expert_group_count"}) {
    if (file.Find(hp.key(key)) != nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("model file: ", hp.key(key), " is not supported (no shared experts or expert groups)"));
    }
  }
  return cfg;
}

absl::StatusOr<MoeFfnWeights> BindMoeFfn(const HParams& hp, const Weights& weights, int32_t layer,
                                         const MoeFfnConfig& cfg, const Dim& hidden) {
  const std::string p = absl::StrCat("blk.", layer, ".");
  for (const char* shexp : {"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                            "ffn_down_shexp.weight"}) {
    if (weights.Find(p + shexp) != nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("model file: tensor ", p, shexp, " (a shared expert) is not supported"));
    }
  }
  const Dim n_expert = hp.dim("expert_count", cfg.n_expert);
  const Dim ffn = hp.dim("expert_feed_forward_length", cfg.expert_ffn);
  MoeFfnWeights w;
  auto router = hp.Tensor(p + "ffn_gate_inp.weight", n_expert, hidden);
  if (!router.ok()) return router.status();
  w.router = *router;
  struct Bind {
    const WeightTensor** dst;
    const char* name;
    const Dim& rows;
    const Dim& cols;
  };
  for (const Bind& b : {Bind{&w.gate_exps, "ffn_gate_exps.weight", ffn, hidden},
                        Bind{&w.up_exps, "ffn_up_exps.weight", ffn, hidden},
                        Bind{&w.down_exps, "ffn_down_exps.weight", hidden, ffn}}) {
    auto t = hp.Tensor3(p + b.name, n_expert, b.rows, b.cols);
    if (!t.ok()) return t.status();
    *b.dst = *t;
  }
  return w;
}

NodeId BuildMoeFfn(Graph& g, NodeId h, const MoeFfnWeights& w, const MoeFfnConfig& cfg, const std::string& prefix) {
  const NodeId logits = g.matmul(g.weight(*w.router), h, prefix + "ffn_gate_inp");
  return g.moe_ffn(h, logits, g.weight(*w.gate_exps), g.weight(*w.up_exps), g.weight(*w.down_exps), cfg.k,
                   cfg.norm_topk_prob, prefix + "ffn_moe");
}

}  // namespace decoded
