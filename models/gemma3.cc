// Gemma 3 (text): Gemma Team, "Gemma 3 Technical Report" (2025); layer
// structure as HF transformers models/gemma3/modeling_gemma3.py; GGUF names
// and defaults as llama.cpp's gemma3 architecture.
//
// Per layer: pre-norm attention with per-head q/k RMSNorm, post-attention
// norm, pre/post FFN norms around a gated GELU(tanh) FFN. RMSNorm weights are
// stored in GGUF as (1 + w), so the graph multiplies by them directly.
// Layer il is global iff (il + 1) % sliding_window_pattern == 0; local layers
// use a sliding window and the local RoPE base.
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "engine/decode_model.h"
#include "engine/hparam_bounds.h"
#include "engine/hparams.h"
#include "models/transformer_dims.h"
#include "engine/model_registry.h"
#include "models/family_base.h"

namespace decoded {
namespace {

struct Gemma3Config {
  int32_t ffn = 0;
  int32_t sliding_window = 0;
  int32_t sliding_window_pattern = 6;  // llama.cpp's gemma3 default (5 local : 1 global)
  double rope_base_global = 1e6;
  double rope_base_local = 1e4;       // llama.cpp's gemma3 default
  double rope_scale_global = 1.0;     // linear scaling of global layers (HF rope_scaling)
  double eps = 1e-6;
  double query_pre_attn_scalar = 0;   // attention scale = 1 / sqrt(this)
  double attn_softcap = 0;
  double final_softcap = 0;
};

struct LayerWeights {
  const WeightTensor *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *post_attn_norm;
  const WeightTensor *ffn_norm, *gate, *up, *down, *post_ffn_norm;
};

class Gemma3 final : public FamilyBase {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeModel>> Create(std::shared_ptr<const Weights> weights,
                                                             const FamilyOptions& options) {
    auto m = std::unique_ptr<Gemma3>(new Gemma3(std::move(weights), options));
    if (auto s = m->ReadConfig(); !s.ok()) return s;
    if (auto s = m->BindWeights(); !s.ok()) return s;
    return std::unique_ptr<DecodeModel>(std::move(m));
  }

  NodeId embed(Graph& g, NodeId token_ids) const override {
    const NodeId x = g.get_rows(g.weight(*tok_embd_), token_ids, "inp_embd");
    // HF scales by sqrt(hidden) cast to the activation dtype (f32 here).
    return g.scale(x, static_cast<float>(std::sqrt(static_cast<double>(dims_.hidden))), "inp_scaled");
  }

  NodeId decode_apply_layer(const DecodeLayerInputs& in) const override {
    Graph& g = in.graph;
    const LayerWeights& w = layers_[static_cast<size_t>(in.layer)];
    const std::string p = absl::StrCat("blk.", in.layer, ".");
    const float eps = static_cast<float>(cfg_.eps);
    const DecodeDims& d = dims_;

    NodeId h = g.rms_norm(in.x, g.weight(*w.attn_norm), eps, p + "attn_norm");
    NodeId q = g.matmul(g.weight(*w.wq), h, p + "attn_q");
    NodeId k = g.matmul(g.weight(*w.wk), h, p + "attn_k");
    NodeId v = g.matmul(g.weight(*w.wv), h, p + "attn_v");
    q = g.rms_norm(q, g.weight(*w.q_norm), eps, p + "attn_q_norm");
    k = g.rms_norm(k, g.weight(*w.k_norm), eps, p + "attn_k_norm");
    q = in.rope(q, d.n_heads, p + "rope_q");
    k = in.rope(k, d.n_kv_heads, p + "rope_k");
    const float scale = static_cast<float>(1.0 / std::sqrt(cfg_.query_pre_attn_scalar));
    NodeId a = in.attention(q, k, v, {.scale = scale, .softcap = static_cast<float>(cfg_.attn_softcap)});
    a = g.matmul(g.weight(*w.wo), a, p + "attn_output");
    a = g.rms_norm(a, g.weight(*w.post_attn_norm), eps, p + "post_attention_norm");
    const NodeId x = g.add(in.x, a, p + "attn_residual");

    h = g.rms_norm(x, g.weight(*w.ffn_norm), eps, p + "ffn_norm");
    const NodeId gate = g.matmul(g.weight(*w.gate), h, p + "ffn_gate");
    const NodeId up = g.matmul(g.weight(*w.up), h, p + "ffn_up");
    NodeId f = g.matmul(g.weight(*w.down), g.gelu_mul(gate, up, p + "ffn_gelu_mul"), p + "ffn_down");
    f = g.rms_norm(f, g.weight(*w.post_ffn_norm), eps, p + "post_ffw_norm");
    return g.add(x, f, p + "ffn_residual");
  }

  NodeId output_logits(Graph& g, NodeId hidden) const override {
    const NodeId h = g.rms_norm(hidden, g.weight(*output_norm_), static_cast<float>(cfg_.eps), "output_norm");
    NodeId logits = g.matmul(g.weight(*output_), h, "output");
    if (cfg_.final_softcap > 0) logits = g.softcap(logits, static_cast<float>(cfg_.final_softcap), "final_softcap");
    return logits;
  }

 private:
  Gemma3(std::shared_ptr<const Weights> weights, const FamilyOptions& options)
      : FamilyBase("gemma3", std::move(weights), options) {}

  // Every number comes through HParams, which checks it (engine/hparams.h)
  // before anything below is sized by it. Defaults are llama.cpp's for gemma3.
  absl::Status ReadConfig() {
    namespace hb = hparam_bounds;
    HParams hp(*weights_, family_);
    DecodeDims& d = dims_;
    auto assign = [](auto& dst, auto v) -> absl::Status {
      if (!v.ok()) return v.status();
      dst = *v;
      return absl::OkStatus();
    };
    if (absl::Status s = ReadTransformerDims(hp, d, &cfg_.ffn); !s.ok()) return s;
    // Each read may use the ones before it, so they run in order.
    const std::function<absl::Status()> reads[] = {
        [&] { return assign(context_length_, hp.Int("context_length", {1, hb::kMaxContextLength})); },
        // A window wider than the context would be a global layer in disguise.
        [&] {
          return assign(cfg_.sliding_window, hp.Int("attention.sliding_window",
                                                    {1, context_length_, hp.key("context_length")}));
        },
        // At least one global layer: the pattern cannot exceed the layer count.
        [&] {
          return assign(cfg_.sliding_window_pattern, hp.IntOr("attention.sliding_window_pattern", 6,
                                                              {1, d.n_layers, hp.key("block_count")}));
        },
        [&] {
          return assign(cfg_.eps, hp.FloatOr("attention.layer_norm_rms_epsilon", 1e-6,
                                             {hb::kMinNormalFloat32, 1.0}));
        },
        // Bases below 1 would reverse the frequency order (no model does this)
        // and tiny ones overflow the float32 RoPE angles.
        [&] { return assign(cfg_.rope_base_global, hp.FloatOr("rope.freq_base", 1e6, {1.0, hb::kMaxFloat32})); },
        [&] {
          return assign(cfg_.rope_base_local, hp.FloatOr("rope.freq_base_swa", 1e4, {1.0, hb::kMaxFloat32}));
        },
        // A cap multiplies tanh(s / cap): below 1 it only crushes the scores,
        // and a cap rounding to 0 in float32 would make 0 / 0.
        [&] {
          return assign(cfg_.attn_softcap, hp.FloatOr("attn_logit_softcapping", 0, {1.0, hb::kMaxFloat32, true}));
        },
        [&] {
          return assign(cfg_.final_softcap, hp.FloatOr("final_logit_softcapping", 0, {1.0, hb::kMaxFloat32, true}));
        },
        // The attention scale is 1 / sqrt(this): a head size, at least 1.
        [&] {
          return assign(cfg_.query_pre_attn_scalar, hp.FloatOr("attention.query_pre_attn_scalar", d.head_dim,
                                                               {1.0, hb::kMaxFloat32}));
        },
        // Linear position scaling of the global layers (HF rope_scaling
        // "linear"); 0 means none, as in llama.cpp. The range keeps
        // position * scale finite in float32 over kMaxContextLength.
        [&]() -> absl::Status {
          auto factor = hp.FloatOr("rope.scaling.factor", 0, {1.0 / 1024, 1024, true});
          if (!factor.ok()) return factor.status();
          cfg_.rope_scale_global = *factor == 0 ? 1.0 : 1.0 / *factor;
          return absl::OkStatus();
        },
    };
    for (const auto& read : reads) {
      if (absl::Status s = read(); !s.ok()) return s;
    }

    std::vector<int32_t> windows;
    std::vector<RopeLayer> ropes;
    for (int32_t il = 0; il < d.n_layers; ++il) {
      const bool global = (il + 1) % cfg_.sliding_window_pattern == 0;
      windows.push_back(global ? 0 : cfg_.sliding_window);
      ropes.push_back(global ? RopeLayer{true, cfg_.rope_base_global, cfg_.rope_scale_global}
                             : RopeLayer{true, cfg_.rope_base_local, 1.0});
    }
    auto mp = MaskPlan::Create(windows);
    if (!mp.ok()) return mp.status();
    mask_plan_ = *std::move(mp);
    auto rp = RopePlan::Create(ropes, d.head_dim);
    if (!rp.ok()) return rp.status();
    rope_plan_ = *std::move(rp);
    return absl::OkStatus();
  }

  // Binds every tensor, each checked against the keys its shape derives from.
  absl::Status BindWeights() {
    DecodeDims& d = dims_;
    HParams hp(*weights_, family_);
    auto bound = BindEmbeddingAndOutput(hp, *weights_, d);
    if (!bound.ok()) return bound.status();
    tok_embd_ = bound->tok_embd;
    output_ = bound->output;
    output_norm_ = bound->output_norm;
    const Dim hidden = hp.dim("embedding_length", d.hidden);
    const Dim one{1, "a norm weight"};

    const Dim head_dim = hp.dim("attention.key_length", d.head_dim);
    const Dim q_dim = hp.dim("attention.head_count", d.n_heads) * head_dim;
    const Dim kv_dim = hp.dim("attention.head_count_kv", d.n_kv_heads) * head_dim;
    const Dim ffn = hp.dim("feed_forward_length", cfg_.ffn);
    for (int32_t il = 0; il < d.n_layers; ++il) {
      const std::string p = absl::StrCat("blk.", il, ".");
      LayerWeights lw{};
      struct Want {
        const WeightTensor** dst;
        const char* name;
        const Dim& rows;
        const Dim& cols;
      };
      const Want wants[] = {
          {&lw.attn_norm, "attn_norm", one, hidden},       {&lw.wq, "attn_q", q_dim, hidden},
          {&lw.wk, "attn_k", kv_dim, hidden},              {&lw.wv, "attn_v", kv_dim, hidden},
          {&lw.wo, "attn_output", hidden, q_dim},          {&lw.q_norm, "attn_q_norm", one, head_dim},
          {&lw.k_norm, "attn_k_norm", one, head_dim},      {&lw.post_attn_norm, "post_attention_norm", one, hidden},
          {&lw.ffn_norm, "ffn_norm", one, hidden},         {&lw.gate, "ffn_gate", ffn, hidden},
          {&lw.up, "ffn_up", ffn, hidden},                 {&lw.down, "ffn_down", hidden, ffn},
          {&lw.post_ffn_norm, "post_ffw_norm", one, hidden},
      };
      for (const Want& want : wants) {
        auto t = hp.Tensor(p + want.name + ".weight", want.rows, want.cols);
        if (!t.ok()) return t.status();
        *want.dst = *t;
      }
      for (const WeightTensor* norm_w : {lw.attn_norm, lw.q_norm, lw.k_norm, lw.post_attn_norm, lw.ffn_norm,
                                         lw.post_ffn_norm}) {
        if (norm_w->type != DType::kF32) {
          return absl::UnimplementedError(absl::StrCat("tensor ", norm_w->name, ": norm weights must be f32, got ",
                                                       DTypeName(norm_w->type)));
        }
      }
      layers_.push_back(lw);
    }
    hash_ = absl::HashOf(d.n_layers, d.hidden, d.n_heads, d.n_kv_heads, d.head_dim, d.vocab, cfg_.ffn,
                         cfg_.sliding_window, cfg_.sliding_window_pattern, cfg_.rope_base_global,
                         cfg_.rope_base_local, cfg_.rope_scale_global, cfg_.query_pre_attn_scalar,
                         cfg_.attn_softcap, cfg_.final_softcap, cfg_.eps);
    return absl::OkStatus();
  }

  Gemma3Config cfg_;
  const WeightTensor* tok_embd_ = nullptr;
  const WeightTensor* output_ = nullptr;
  const WeightTensor* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
};

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateGemma3(std::shared_ptr<const Weights> weights,
                                                          const FamilyOptions& options) {
  return Gemma3::Create(std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("gemma3", CreateGemma3);

}  // namespace decoded
