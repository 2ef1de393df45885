#include "models/moe_ffn.h"

#include "absl/strings/str_cat.h"

namespace decoded {

namespace {

// llama.cpp's llama_expert_gating_func_type.
constexpr int64_t kGatingNone = 0;
constexpr int64_t kGatingSoftmax = 1;
constexpr int64_t kGatingSigmoid = 2;

absl::Status Invalid(const HParams& hp, const char* key, int64_t value, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("model file: ", hp.key(key), " = ", value, " ", why));
}

}  // namespace

absl::StatusOr<MoeFfnConfig> ReadMoeFfnConfig(const HParams& hp, bool default_norm_topk_prob) {
  namespace hb = hparam_bounds;
  MoeFfnConfig cfg;
  MoeRouting& r = cfg.routing;
  auto n = hp.Int("expert_count", {2, kMaxMoeExperts});
  if (!n.ok()) return n.status();
  r.n_expert = *n;
  auto k = hp.Int("expert_used_count", {1, r.n_expert, hp.key("expert_count")});
  if (!k.ok()) return k.status();
  r.k = *k;
  auto ffn = hp.Int("expert_feed_forward_length", {1, hb::kMaxWidth});
  if (!ffn.ok()) return ffn.status();
  cfg.expert_ffn = *ffn;
  r.norm_topk_prob = default_norm_topk_prob;
  const GgufFile& file = hp.weights().file();
  if (file.Find(hp.key("expert_weights_norm")) != nullptr) {
    auto norm = file.GetBool(hp.key("expert_weights_norm"));
    if (!norm.ok()) return norm.status();
    r.norm_topk_prob = *norm;
  }
  auto gating = hp.IntOr("expert_gating_func", kGatingNone, {0, 16});
  if (!gating.ok()) return gating.status();
  if (*gating == kGatingSigmoid) {
    r.gating = MoeGating::kSigmoid;
  } else if (*gating != kGatingNone && *gating != kGatingSoftmax) {
    return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("expert_gating_func"), " = ", *gating,
                                                 " is not supported (softmax 1 or sigmoid 2 routing)"));
  }
  // 0 is llama.cpp's "not scaled", as 1.
  auto scale = hp.FloatOr("expert_weights_scale", 1.0, {1e-6, hb::kMaxFloat32, true});
  if (!scale.ok()) return scale.status();
  r.scale = *scale == 0.0 ? 1.0f : static_cast<float>(*scale);

  auto n_group = hp.IntOr("expert_group_count", 1, {1, r.n_expert, hp.key("expert_count")});
  if (!n_group.ok()) return n_group.status();
  r.n_group = *n_group;
  if (r.n_expert % r.n_group != 0) {
    return Invalid(hp, "expert_group_count", r.n_group,
                   absl::StrCat("does not divide ", hp.key("expert_count"), " = ", r.n_expert));
  }
  const GgufValue* used_key = file.Find(hp.key("expert_group_used_count"));
  if (r.n_group > 1 && used_key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model file: ", hp.key("expert_group_used_count"),
                                                   " is missing (required with ", hp.key("expert_group_count"),
                                                   " = ", r.n_group, ")"));
  }
  auto topk_group = hp.IntOr("expert_group_used_count", r.n_group, {1, r.n_group, hp.key("expert_group_count")});
  if (!topk_group.ok()) return topk_group.status();
  r.topk_group = *topk_group;
  const int32_t per_group = r.n_expert / r.n_group;
  // Softmax: DeepSeek-V2's best-expert group score; sigmoid: DeepSeek-V3's
  // top-2 sum (see the header).
  r.group_score = r.gating == MoeGating::kSigmoid ? MoeGroupScore::kTop2Sum : MoeGroupScore::kMax;
  if (r.n_group > 1 && r.group_score == MoeGroupScore::kTop2Sum && per_group < 2) {
    return Invalid(hp, "expert_group_count", r.n_group,
                   absl::StrCat("leaves groups of one expert (", hp.key("expert_count"), " = ", r.n_expert,
                                "); sigmoid routing scores a group by its best two"));
  }
  if (r.k > r.topk_group * per_group) {
    return Invalid(hp, "expert_used_count", r.k,
                   absl::StrCat("exceeds the ", r.topk_group * per_group, " experts of ",
                                hp.key("expert_group_used_count"), " = ", r.topk_group, " groups of ", per_group));
  }

  auto n_shared = hp.IntOr("expert_shared_count", 0, {0, kMaxMoeSharedExperts});
  if (!n_shared.ok()) return n_shared.status();
  cfg.n_shared = *n_shared;
  if (int64_t{cfg.n_shared} * cfg.expert_ffn > hb::kMaxWidth) {
    return Invalid(hp, "expert_shared_count", cfg.n_shared,
                   absl::StrCat("x ", hp.key("expert_feed_forward_length"), " = ", cfg.expert_ffn, " exceeds ",
                                hb::kMaxWidth));
  }
  if (file.Find(hp.key("expert_shared_feed_forward_length")) != nullptr) {
    return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("expert_shared_feed_forward_length"),
                                                 " is not supported (shared experts are ",
                                                 hp.key("expert_shared_count"), " x ",
                                                 hp.key("expert_feed_forward_length"), " wide)"));
  }
  return cfg;
}

absl::StatusOr<MoeFfnWeights> BindMoeFfn(const HParams& hp, const Weights& weights, int32_t layer,
                                         const MoeFfnConfig& cfg, const Dim& hidden) {
  const std::string p = absl::StrCat("blk.", layer, ".");
  if (weights.Find(p + "ffn_gate_inp_shexp.weight") != nullptr) {
    return absl::UnimplementedError(absl::StrCat("model file: tensor ", p,
                                                 "ffn_gate_inp_shexp.weight (a gated shared expert) is not "
                                                 "supported"));
  }
  const Dim n_expert = hp.dim("expert_count", cfg.routing.n_expert);
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
  if (weights.Find(p + "exp_probs_b.bias") != nullptr) {
    auto t = hp.Tensor(p + "exp_probs_b.bias", Dim{1, "a bias vector"}, n_expert);
    if (!t.ok()) return t.status();
    if ((*t)->type != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("model file: tensor ", p, "exp_probs_b.bias must be f32, got ",
                                                     DTypeName((*t)->type)));
    }
    w.probs_bias = *t;
  }
  const char* shexp[] = {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"};
  if (cfg.n_shared == 0) {
    for (const char* name : shexp) {
      if (weights.Find(p + name) != nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("model file: tensor ", p, name, " (a shared expert) beside ",
                                                       hp.key("expert_shared_count"), " = 0"));
      }
    }
    return w;
  }
  const Dim shared = hp.dim("expert_shared_count", cfg.n_shared) * ffn;
  for (const Bind& b : {Bind{&w.gate_shexp, shexp[0], shared, hidden}, Bind{&w.up_shexp, shexp[1], shared, hidden},
                        Bind{&w.down_shexp, shexp[2], hidden, shared}}) {
    auto t = hp.Tensor(p + b.name, b.rows, b.cols);
    if (!t.ok()) return t.status();
    *b.dst = *t;
  }
  return w;
}

NodeId BuildMoeFfn(Graph& g, NodeId h, const MoeFfnWeights& w, const MoeFfnConfig& cfg, const std::string& prefix) {
  const NodeId logits = g.matmul(g.weight(*w.router), h, prefix + "ffn_gate_inp");
  const NodeId bias = w.probs_bias != nullptr ? g.weight(*w.probs_bias) : kNoNode;
  const NodeId routed = g.moe_ffn(h, logits, g.weight(*w.gate_exps), g.weight(*w.up_exps), g.weight(*w.down_exps),
                                  bias, cfg.routing, prefix + "ffn_moe");
  if (w.gate_shexp == nullptr) return routed;
  const NodeId act = g.swiglu(g.matmul(g.weight(*w.gate_shexp), h, prefix + "ffn_gate_shexp"),
                              g.matmul(g.weight(*w.up_shexp), h, prefix + "ffn_up_shexp"), prefix + "ffn_shexp_swiglu");
  return g.add(routed, g.matmul(g.weight(*w.down_shexp), act, prefix + "ffn_down_shexp"), prefix + "ffn_moe_out");
}

}  // namespace decoded
