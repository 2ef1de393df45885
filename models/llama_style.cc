#include "models/llama_style.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "engine/hparam_bounds.h"
#include "engine/hparams.h"
#include "models/family_base.h"
#include "models/fused_weights.h"
#include "models/moe_ffn.h"
#include "models/qkv_weights.h"
#include "models/rope_scaling.h"
#include "models/transformer_dims.h"

namespace decoded {
namespace {

struct LlamaStyleConfig {
  int32_t ffn = 0;
  double rope_base = 10000.0;  // llama.cpp's default
  double rope_freq_scale = 1.0;
  int32_t rot_dims = 0;                  // rope.dimension_count: leading dims of each head that rotate
  std::vector<float> rope_freq_factors;  // rope_freqs.weight; empty without it
  std::optional<YarnScaling> rope_yarn;  // rope.scaling.type = "yarn"
  double rope_attention_factor = 1.0;    // YaRN's cos/sin multiplier
  int32_t sliding_window = 0;            // 0: none
  double eps = 1e-5;
  MoeFfnConfig moe;  // LlamaFfn::kMoeSwiGlu only
};

struct LayerWeights {
  const WeightTensor *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm;
  const WeightTensor *gate = nullptr, *up = nullptr, *down = nullptr;  // LlamaFfn::kSwiGlu
  MoeFfnWeights moe;                                                      // LlamaFfn::kMoeSwiGlu
  const WeightTensor *bq = nullptr, *bk = nullptr, *bv = nullptr;  // all or none
  const WeightTensor *q_norm = nullptr, *k_norm = nullptr;         // LlamaStyleSpec::qk_norm
  const WeightTensor *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // LlamaStyleSpec::post_norms
};

class LlamaStyle final : public FamilyBase {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeModel>> Create(const LlamaStyleSpec& spec,
                                                             std::shared_ptr<const Weights> weights,
                                                             const FamilyOptions& options) {
    auto m = std::unique_ptr<LlamaStyle>(new LlamaStyle(spec, std::move(weights), options));
    if (auto s = m->ReadConfig(); !s.ok()) return s;
    if (auto s = m->BindWeights(); !s.ok()) return s;
    return std::unique_ptr<DecodeModel>(std::move(m));
  }

  NodeId embed(Graph& g, NodeId token_ids) const override {
    return g.get_rows(g.weight(*tok_embd_), token_ids, "inp_embd");
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
    if (w.bq != nullptr) {
      q = g.add_row(q, g.weight(*w.bq), p + "attn_q_bias");
      k = g.add_row(k, g.weight(*w.bk), p + "attn_k_bias");
      v = g.add_row(v, g.weight(*w.bv), p + "attn_v_bias");
    }
    if (w.q_norm != nullptr) {
      q = g.rms_norm(q, g.weight(*w.q_norm), eps, p + "attn_q_norm");  // per head: the weight is [1, head_dim]
      k = g.rms_norm(k, g.weight(*w.k_norm), eps, p + "attn_k_norm");
    }
    q = in.rope(q, d.n_heads, p + "rope_q");
    k = in.rope(k, d.n_kv_heads, p + "rope_k");
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
    NodeId a = in.attention(q, k, v, {.scale = scale});
    a = g.matmul(g.weight(*w.wo), a, p + "attn_output");
    if (w.post_attn_norm != nullptr) a = g.rms_norm(a, g.weight(*w.post_attn_norm), eps, p + "post_attention_norm");
    const NodeId x = g.add(in.x, a, p + "attn_residual");

    h = g.rms_norm(x, g.weight(*w.ffn_norm), eps, p + "ffn_norm");
    NodeId f;
    if (spec_.ffn == LlamaFfn::kMoeSwiGlu) {
      f = BuildMoeFfn(g, h, w.moe, cfg_.moe, p);
    } else {
      const NodeId gate = g.matmul(g.weight(*w.gate), h, p + "ffn_gate");
      const NodeId up = g.matmul(g.weight(*w.up), h, p + "ffn_up");
      f = g.matmul(g.weight(*w.down), g.swiglu(gate, up, p + "ffn_swiglu"), p + "ffn_down");
    }
    if (w.post_ffn_norm != nullptr) f = g.rms_norm(f, g.weight(*w.post_ffn_norm), eps, p + "post_ffw_norm");
    return g.add(x, f, p + "ffn_residual");
  }

  NodeId output_logits(Graph& g, NodeId hidden) const override {
    const NodeId h = g.rms_norm(hidden, g.weight(*output_norm_), static_cast<float>(cfg_.eps), "output_norm");
    return g.matmul(g.weight(*output_), h, "output");
  }

 private:
  LlamaStyle(LlamaStyleSpec spec, std::shared_ptr<const Weights> weights, const FamilyOptions& options)
      : FamilyBase(spec.arch, std::move(weights), options), spec_(std::move(spec)) {}

  // Every number comes through HParams (engine/hparams.h), checked before
  // anything is sized by it. Defaults are llama.cpp's.
  absl::Status ReadConfig() {
    namespace hb = hparam_bounds;
    HParams hp(*weights_, spec_.arch);
    DecodeDims& d = dims_;
    auto assign = [](auto& dst, auto v) -> absl::Status {
      if (!v.ok()) return v.status();
      dst = *v;
      return absl::OkStatus();
    };
    if (absl::Status s = ReadTransformerDims(hp, d, &cfg_.ffn); !s.ok()) return s;
    const std::function<absl::Status()> reads[] = {
        // More rotated dimensions than the head holds is a malformed file;
        // fewer (partial rotary) only a family that states it rotates part of
        // a head (its pairing then applies within the rotated part).
        [&]() -> absl::Status {
          auto rot = hp.IntOr("rope.dimension_count", d.head_dim, {2, d.head_dim, hp.key("attention.key_length"), 2});
          if (!rot.ok()) return rot.status();
          cfg_.rot_dims = *rot;
          if (*rot == d.head_dim || spec_.partial_rotary) return absl::OkStatus();
          return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.dimension_count"), " = ", *rot,
                                                       " rotates part of a head of ", d.head_dim,
                                                       "; partial rotary is not supported for ", spec_.arch));
        },
        // Multi-token-prediction layers (GLM-OCR's NextN) are counted in
        // block_count but are not decoder layers.
        [&]() -> absl::Status {
          if (weights_->file().Find(hp.key("nextn_predict_layers")) == nullptr) return absl::OkStatus();
          auto n = hp.Int("nextn_predict_layers", {0, d.n_layers});
          if (!n.ok()) return n.status();
          if (*n == 0) return absl::OkStatus();
          return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("nextn_predict_layers"), " = ", *n,
                                                       ": NextN / multi-token-prediction layers are not supported for ",
                                                       spec_.arch));
        },
        [&] { return assign(context_length_, hp.Int("context_length", {1, hb::kMaxContextLength})); },
        [&]() -> absl::Status {
          if (!spec_.sliding_window) return absl::OkStatus();
          // A window at least as long as the context is global in effect
          // (Phi-3-mini-128k states 262144 over a 131072 context).
          return assign(cfg_.sliding_window, hp.IntOr("attention.sliding_window", 0, {0, hb::kMaxContextLength}));
        },
        [&] {
          return assign(cfg_.eps, hp.Float("attention.layer_norm_rms_epsilon", {hb::kMinNormalFloat32, 1.0}));
        },
        [&] { return assign(cfg_.rope_base, hp.FloatOr("rope.freq_base", 10000.0, {1.0, hb::kMaxFloat32})); },
        [&]() -> absl::Status { return ReadScaling(hp); },
        [&]() -> absl::Status {
          if (spec_.ffn != LlamaFfn::kMoeSwiGlu) return absl::OkStatus();
          return assign(cfg_.moe, ReadMoeFfnConfig(hp, spec_.moe_norm_topk_prob));
        },
    };
    for (const auto& read : reads) {
      if (absl::Status s = read(); !s.ok()) return s;
    }
    auto mp = MaskPlan::Create(std::vector<int32_t>(static_cast<size_t>(d.n_layers), cfg_.sliding_window));
    if (!mp.ok()) return mp.status();
    mask_plan_ = *std::move(mp);
    std::vector<RopeLayer> ropes;
    for (int32_t il = 0; il < d.n_layers; ++il) {
      const bool rotates = spec_.rope_on_layer == nullptr || spec_.rope_on_layer(il);
      RopeLayer rope{rotates, cfg_.rope_base, cfg_.rope_freq_scale, cfg_.rope_freq_factors};
      rope.yarn = cfg_.rope_yarn;
      rope.attention_factor = cfg_.rope_attention_factor;
      ropes.push_back(std::move(rope));
    }
    auto rp = RopePlan::Create(ropes, d.head_dim, spec_.rope_pairing, cfg_.rot_dims);
    if (!rp.ok()) return rp.status();
    rope_plan_ = *std::move(rp);
    return absl::OkStatus();
  }

  // "linear" (HF rope_scaling linear) is a position scale; "yarn" blends the
  // frequencies and scales cos/sin (engine/rope_yarn.h), keys read by
  // models/rope_scaling.h. Llama 3.1's frequency scaling comes as
  // rope_freqs.weight (llama.cpp's converter writes no scaling type for it)
  // and divides the frequencies. LongRoPE (Phi-3's rope_factors_long/short,
  // which also rescale cos/sin and switch with the context length) is refused.
  absl::Status ReadScaling(const HParams& hp) {
    namespace hb = hparam_bounds;
    for (const char* longrope : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
      if (weights_->Find(longrope) != nullptr) {
        return absl::UnimplementedError(absl::StrCat("model file: tensor ", longrope,
                                                     " (LongRoPE, e.g. Phi-3 128k) is not supported for ",
                                                     spec_.arch));
      }
    }
    // M-RoPE (GLM-4V, Qwen2-VL) splits the rotated pairs into sections
    // rotated by different position axes.
    if (weights_->file().Find(hp.key("rope.dimension_sections")) != nullptr) {
      return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.dimension_sections"),
                                                   " (multi-axis M-RoPE) is not supported for ", spec_.arch));
    }
    auto scaling = ReadRopeScaling(hp, context_length_);
    if (!scaling.ok()) return scaling.status();
    if (scaling->type == RopeScaling::Type::kLinear) cfg_.rope_freq_scale = 1.0 / scaling->factor;
    if (scaling->type == RopeScaling::Type::kYarn) {
      // HF's attention_factor: stated, or from the factor alone. The
      // mscale / mscale_all_dim variant (yarn_log_multiplier) is DeepSeek's
      // (models/deepseek2.cc); llama.cpp's converter does not write it for
      // these architectures and their loaders do not read it.
      if (scaling->yarn_log_multiplier.has_value()) {
        return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.scaling.yarn_log_multiplier"),
                                                     " (YaRN mscale / mscale_all_dim) is not supported for ",
                                                     spec_.arch));
      }
      if (weights_->Find("rope_freqs.weight") != nullptr) {
        return absl::UnimplementedError(absl::StrCat("model file: tensor rope_freqs.weight beside ",
                                                     hp.key("rope.scaling.type"), " = \"yarn\" is not supported for ",
                                                     spec_.arch, " (one frequency scaling per file)"));
      }
      cfg_.rope_yarn = scaling->yarn;
      cfg_.rope_attention_factor = scaling->yarn_attn_factor.value_or(YarnMscale(scaling->factor));
    }

    if (weights_->Find("rope_freqs.weight") == nullptr) return absl::OkStatus();
    const int32_t half = cfg_.rot_dims / 2;
    auto t = hp.Tensor("rope_freqs.weight", Dim{1, "a vector"},
                       Dim{half, absl::StrCat("half the rotated dimensions (", hp.key("rope.dimension_count"), " = ",
                                              cfg_.rot_dims, ")")});
    if (!t.ok()) return t.status();
    if (auto s = RequireF32(**t); !s.ok()) return s;
    // A divisor below 1/1024 would speed a frequency up past any model's and
    // let pos * inv_freq overflow float32 within kMaxContextLength.
    constexpr double kMinFactor = 1.0 / 1024;
    cfg_.rope_freq_factors.resize(static_cast<size_t>(half));
    std::memcpy(cfg_.rope_freq_factors.data(), (*t)->data, static_cast<size_t>(half) * sizeof(float));
    for (int32_t i = 0; i < half; ++i) {
      const float f = cfg_.rope_freq_factors[static_cast<size_t>(i)];
      if (!std::isfinite(f) || f < kMinFactor || f > hb::kMaxFloat32) {
        return absl::InvalidArgumentError(absl::StrCat("model file: tensor rope_freqs.weight[", i, "] = ", f,
                                                       " is not a frequency divisor in [", kMinFactor, ", ",
                                                       hb::kMaxFloat32, "]"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status BindWeights() {
    DecodeDims& d = dims_;
    HParams hp(*weights_, spec_.arch);
    auto bound = BindEmbeddingAndOutput(hp, *weights_, d);
    if (!bound.ok()) return bound.status();
    tok_embd_ = bound->tok_embd;
    output_ = bound->output;
    output_norm_ = bound->output_norm;
    const Dim hidden = hp.dim("embedding_length", d.hidden);
    const Dim one{1, "a norm weight"};
    if (auto s = RequireF32(*output_norm_); !s.ok()) return s;

    const Dim head_dim = hp.dim("attention.key_length", d.head_dim);
    const Dim q_dim = hp.dim("attention.head_count", d.n_heads) * head_dim;
    const Dim kv_dim = hp.dim("attention.head_count_kv", d.n_kv_heads) * head_dim;
    const Dim ffn = hp.dim("feed_forward_length", cfg_.ffn);
    const FusedPart gate_up_parts[] = {{"gate", ffn}, {"up", ffn}};
    const QkvBias qkv_bias = spec_.qkv_bias_required ? QkvBias::kRequired : QkvBias::kOptional;
    bool has_bias = false;
    for (int32_t il = 0; il < d.n_layers; ++il) {
      const std::string p = absl::StrCat("blk.", il, ".");
      LayerWeights lw{};
      auto bind = [&](const WeightTensor*& dst, const char* name, const Dim& rows, const Dim& cols) -> absl::Status {
        auto t = hp.Tensor(p + name, rows, cols);
        if (!t.ok()) return t.status();
        dst = *t;
        return absl::OkStatus();
      };
      auto absent = [&](const char* name, const char* because) -> absl::Status {
        if (weights_->Find(p + name) == nullptr) return absl::OkStatus();
        return absl::InvalidArgumentError(absl::StrCat("model file: tensor ", p, name, " is unexpected: ", because));
      };
      const std::function<absl::Status()> binds[] = {
          [&] { return bind(lw.attn_norm, "attn_norm.weight", one, hidden); },
          // Q/K/V and their biases, fused or separate, whichever the file holds.
          [&]() -> absl::Status {
            auto qkv = BindQkv(hp, *weights_, il, q_dim, kv_dim, hidden, qkv_bias, views_);
            if (!qkv.ok()) return qkv.status();
            lw.wq = qkv->wq;
            lw.wk = qkv->wk;
            lw.wv = qkv->wv;
            lw.bq = qkv->bq;
            lw.bk = qkv->bk;
            lw.bv = qkv->bv;
            return absl::OkStatus();
          },
          [&] { return bind(lw.wo, "attn_output.weight", hidden, q_dim); },
          [&]() -> absl::Status {
            if (!spec_.qk_norm) return absl::OkStatus();
            if (auto s = bind(lw.q_norm, "attn_q_norm.weight", one, head_dim); !s.ok()) return s;
            return bind(lw.k_norm, "attn_k_norm.weight", one, head_dim);
          },
          [&]() -> absl::Status {
            if (!spec_.post_norms) return absl::OkStatus();
            return bind(lw.post_attn_norm, "post_attention_norm.weight", one, hidden);
          },
          [&] { return bind(lw.ffn_norm, "ffn_norm.weight", one, hidden); },
          [&]() -> absl::Status {
            if (spec_.ffn == LlamaFfn::kMoeSwiGlu) {
              for (const char* dense : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) {
                if (auto s = absent(dense, "this architecture's FFN is routed experts (ffn_*_exps)"); !s.ok()) {
                  return s;
                }
              }
              auto moe = BindMoeFfn(hp, *weights_, il, cfg_.moe, hidden);
              if (!moe.ok()) return moe.status();
              lw.moe = *moe;
              return absl::OkStatus();
            }
            if (!spec_.fused_gate_up) {
              if (auto s = bind(lw.gate, "ffn_gate.weight", ffn, hidden); !s.ok()) return s;
              return bind(lw.up, "ffn_up.weight", ffn, hidden);
            }
            if (auto s = absent("ffn_gate.weight", "this architecture holds gate and up fused in ffn_up.weight");
                !s.ok()) {
              return s;
            }
            auto parts = BindFusedRows(hp, p + "ffn_up.weight", gate_up_parts, hidden, views_);
            if (!parts.ok()) return parts.status();
            lw.gate = (*parts)[0];
            lw.up = (*parts)[1];
            return absl::OkStatus();
          },
          [&]() -> absl::Status {
            if (spec_.ffn == LlamaFfn::kMoeSwiGlu) return absl::OkStatus();
            return bind(lw.down, "ffn_down.weight", hidden, ffn);
          },
          [&]() -> absl::Status {
            if (!spec_.post_norms) return absl::OkStatus();
            return bind(lw.post_ffn_norm, "post_ffw_norm.weight", one, hidden);
          },
      };
      for (const auto& b : binds) {
        if (absl::Status s = b(); !s.ok()) return s;
      }
      for (const WeightTensor* norm_w :
           {lw.attn_norm, lw.ffn_norm, lw.q_norm, lw.k_norm, lw.post_attn_norm, lw.post_ffn_norm}) {
        if (norm_w == nullptr) continue;
        if (auto s = RequireF32(*norm_w); !s.ok()) return s;
      }
      // Q/K/V biases (BindQkv: all three or none) the same in every layer.
      const bool layer_bias = lw.bq != nullptr;
      if (il > 0 && layer_bias != has_bias) {
        return absl::InvalidArgumentError(absl::StrCat("model file: layer ", il, (layer_bias ? " has" : " lacks"),
                                                       " q/k/v biases, unlike layer 0"));
      }
      has_bias = layer_bias;
      for (const char* name : {"attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"}) {
        if (weights_->Find(p + name) != nullptr) {
          return absl::UnimplementedError(absl::StrCat("model file: tensor ", p, name, " is not supported for ",
                                                       spec_.arch, " (this layer has only q/k/v biases)"));
        }
      }
      for (const char* name : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
        if (!spec_.qk_norm && weights_->Find(p + name) != nullptr) {
          return absl::UnimplementedError(absl::StrCat("model file: tensor ", p, name, " is not supported for ",
                                                       spec_.arch, " (its layer has no q/k norm)"));
        }
      }
      for (const char* name : {"post_attention_norm.weight", "post_ffw_norm.weight"}) {
        if (!spec_.post_norms && weights_->Find(p + name) != nullptr) {
          return absl::UnimplementedError(absl::StrCat("model file: tensor ", p, name, " is not supported for ",
                                                       spec_.arch, " (its layer has no post-attention / FFN norms)"));
        }
      }
      layers_.push_back(lw);
    }
    std::vector<int32_t> rope_variants;
    for (int32_t il = 0; il < d.n_layers; ++il) rope_variants.push_back(rope_plan_.variant_of(il));
    hash_ = absl::HashOf(spec_.arch, static_cast<int>(spec_.rope_pairing), has_bias, spec_.qk_norm,
                         spec_.fused_gate_up, spec_.post_norms, cfg_.rot_dims, d.n_layers, d.hidden, d.n_heads,
                         d.n_kv_heads, d.head_dim, d.vocab, cfg_.ffn, cfg_.rope_base, cfg_.rope_freq_scale,
                         cfg_.rope_freq_factors, cfg_.rope_yarn.has_value(), cfg_.rope_yarn.value_or(YarnScaling{}),
                         cfg_.rope_attention_factor, cfg_.sliding_window, cfg_.eps, output_ == tok_embd_, rope_variants,
                         static_cast<int>(spec_.ffn), cfg_.moe);
    return absl::OkStatus();
  }

  static absl::Status RequireF32(const WeightTensor& t) {
    if (t.type == DType::kF32) return absl::OkStatus();
    return absl::UnimplementedError(
        absl::StrCat("tensor ", t.name, ": norm and RoPE factor weights must be f32, got ", DTypeName(t.type)));
  }

  const LlamaStyleSpec spec_;
  LlamaStyleConfig cfg_;
  const WeightTensor* tok_embd_ = nullptr;
  const WeightTensor* output_ = nullptr;
  const WeightTensor* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  WeightViews views_;  // parts of fused weights (models/fused_weights.h)
};

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateLlamaStyle(const LlamaStyleSpec& spec,
                                                              std::shared_ptr<const Weights> weights,
                                                              const FamilyOptions& options) {
  return LlamaStyle::Create(spec, std::move(weights), options);
}

}  // namespace decoded
