// Phi-2 (HF transformers models/phi/modeling_phi.py, PhiForCausalLM); GGUF
// names, keys and defaults as llama.cpp's phi2 architecture.
//
// Per layer: ONE LayerNorm (with bias) feeds attention and the MLP in
// parallel, out = x + attn(ln(x)) + mlp(ln(x)). Attention has q/k/v/output
// biases (q/k/v separate or fused attn_qkv, models/qkv_weights.h) and
// partial rotary: the first rope.dimension_count dimensions of each head
// rotate (NeoX pairing within them), the rest pass through. The MLP is
// fc1 -> GELU(tanh, HF "gelu_new") -> fc2, both with biases. A final
// LayerNorm with bias and an output projection with bias close the model.
//
// Phi-2 rides the SymEnv KV-write offset path (seed: the phi path).
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
#include "engine/model_registry.h"
#include "models/family_base.h"
#include "models/qkv_weights.h"
#include "models/transformer_dims.h"

namespace decoded {
namespace {

constexpr char kArch[] = "phi2";

struct Phi2Config {
  int32_t ffn = 0;
  int32_t rot_dims = 0;        // rope.dimension_count: rotated dimensions per head
  double rope_base = 10000.0;  // llama.cpp's default; the converter writes none for phi2
  double eps = 1e-5;
};

struct LayerWeights {
  const WeightTensor *norm, *norm_b;
  QkvWeights qkv;
  const WeightTensor *wo, *bo, *up, *up_b, *down, *down_b;
};

class Phi2 final : public FamilyBase {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeModel>> Create(std::shared_ptr<const Weights> weights,
                                                             const FamilyOptions& options) {
    auto m = std::unique_ptr<Phi2>(new Phi2(std::move(weights), options));
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
    const DecodeDims& d = dims_;
    auto linear = [&](const WeightTensor& wt, const WeightTensor& b, NodeId x, const std::string& name) {
      return g.add_row(g.matmul(g.weight(wt), x, p + name), g.weight(b), p + name + "_bias");
    };

    const NodeId h = g.layer_norm(in.x, g.weight(*w.norm), g.weight(*w.norm_b), static_cast<float>(cfg_.eps),
                                  p + "attn_norm");
    NodeId q = linear(*w.qkv.wq, *w.qkv.bq, h, "attn_q");
    NodeId k = linear(*w.qkv.wk, *w.qkv.bk, h, "attn_k");
    const NodeId v = linear(*w.qkv.wv, *w.qkv.bv, h, "attn_v");
    q = in.rope(q, d.n_heads, p + "rope_q");
    k = in.rope(k, d.n_kv_heads, p + "rope_k");
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
    const NodeId a = linear(*w.wo, *w.bo, in.attention(q, k, v, {.scale = scale}), "attn_output");

    const NodeId up = g.gelu(linear(*w.up, *w.up_b, h, "ffn_up"), p + "ffn_gelu");
    const NodeId f = linear(*w.down, *w.down_b, up, "ffn_down");
    // HF sums attn + mlp first, then the residual.
    return g.add(g.add(a, f, p + "attn_ffn"), in.x, p + "residual");
  }

  NodeId output_logits(Graph& g, NodeId hidden) const override {
    const NodeId h = g.layer_norm(hidden, g.weight(*output_norm_), g.weight(*output_norm_b_),
                                  static_cast<float>(cfg_.eps), "output_norm");
    return g.add_row(g.matmul(g.weight(*output_), h, "output"), g.weight(*output_b_), "output_bias");
  }

 private:
  Phi2(std::shared_ptr<const Weights> weights, const FamilyOptions& options)
      : FamilyBase(kArch, std::move(weights), options, KvOffsetPath::kSymbol) {}

  // Every number comes through HParams (engine/hparams.h), checked before
  // anything is sized by it. Defaults are llama.cpp's.
  absl::Status ReadConfig() {
    namespace hb = hparam_bounds;
    HParams hp(*weights_, kArch);
    DecodeDims& d = dims_;
    auto assign = [](auto& dst, auto v) -> absl::Status {
      if (!v.ok()) return v.status();
      dst = *v;
      return absl::OkStatus();
    };
    if (absl::Status s = ReadTransformerDims(hp, d, &cfg_.ffn); !s.ok()) return s;
    const std::function<absl::Status()> reads[] = {
        [&] { return assign(context_length_, hp.Int("context_length", {1, hb::kMaxContextLength})); },
        [&] {
          return assign(cfg_.eps, hp.Float("attention.layer_norm_epsilon", {hb::kMinNormalFloat32, 1.0}));
        },
        // Partial rotary: an even count of leading dimensions of each head.
        [&] {
          return assign(cfg_.rot_dims, hp.IntOr("rope.dimension_count", d.head_dim,
                                                {2, d.head_dim, hp.key("attention.key_length"), 2}));
        },
        [&] { return assign(cfg_.rope_base, hp.FloatOr("rope.freq_base", 10000.0, {1.0, hb::kMaxFloat32})); },
        // The converter writes no scaling for phi2; one that changes the
        // positions or frequencies is not modelled here.
        [&]() -> absl::Status {
          auto factor = hp.FloatOr("rope.scaling.factor", 0, {1.0 / 1024, 1024, true});
          if (!factor.ok()) return factor.status();
          if (*factor == 0 || *factor == 1.0) return absl::OkStatus();
          return absl::UnimplementedError(absl::StrCat("model file: ", hp.key("rope.scaling.factor"), " = ", *factor,
                                                       ": RoPE scaling is not supported for ", kArch));
        },
    };
    for (const auto& read : reads) {
      if (absl::Status s = read(); !s.ok()) return s;
    }
    auto mp = MaskPlan::Create(std::vector<int32_t>(static_cast<size_t>(d.n_layers), 0));
    if (!mp.ok()) return mp.status();
    mask_plan_ = *std::move(mp);
    // llama.cpp runs phi2 with NEOX RoPE on unpermuted Q/K rows (HF rotate_half).
    auto rp = RopePlan::Create(std::vector<RopeLayer>(static_cast<size_t>(d.n_layers),
                                                      RopeLayer{true, cfg_.rope_base, 1.0}),
                               d.head_dim, RopePairing::kNeox, cfg_.rot_dims);
    if (!rp.ok()) return rp.status();
    rope_plan_ = *std::move(rp);
    return absl::OkStatus();
  }

  absl::Status BindWeights() {
    DecodeDims& d = dims_;
    HParams hp(*weights_, kArch);
    auto bound = BindEmbeddingAndOutput(hp, *weights_, d);
    if (!bound.ok()) return bound.status();
    tok_embd_ = bound->tok_embd;
    output_ = bound->output;
    const Dim one{1, "a norm or bias weight"};
    const Dim hidden = hp.dim("embedding_length", d.hidden);
    const Dim vocab{d.vocab, absl::StrCat("the vocabulary (rows of token_embd.weight) = ", d.vocab)};
    const Dim head_dim = hp.dim("attention.key_length", d.head_dim);
    const Dim q_dim = hp.dim("attention.head_count", d.n_heads) * head_dim;
    const Dim kv_dim = hp.dim("attention.head_count_kv", d.n_kv_heads) * head_dim;
    const Dim ffn = hp.dim("feed_forward_length", cfg_.ffn);

    // Binds a tensor; f32 required for norms and biases (`f32`).
    auto bind = [&](const std::string& name, const Dim& rows, const Dim& cols, bool f32,
                    const WeightTensor** dst) -> absl::Status {
      auto t = hp.Tensor(name, rows, cols);
      if (!t.ok()) return t.status();
      if (f32 && (*t)->type != DType::kF32) {
        return absl::UnimplementedError(absl::StrCat("tensor ", name, ": norm and bias weights must be f32, got ",
                                                     DTypeName((*t)->type)));
      }
      *dst = *t;
      return absl::OkStatus();
    };
    // output_norm.weight is bound above too; this adds the f32 check.
    if (auto s = bind("output_norm.weight", one, hidden, true, &output_norm_); !s.ok()) return s;
    if (auto s = bind("output_norm.bias", one, hidden, true, &output_norm_b_); !s.ok()) return s;
    if (auto s = bind("output.bias", one, vocab, true, &output_b_); !s.ok()) return s;

    bool fused = false;
    for (int32_t il = 0; il < d.n_layers; ++il) {
      const std::string p = absl::StrCat("blk.", il, ".");
      // Per-head q/k LayerNorm (HF qk_layernorm) is not modelled.
      for (const char* unmodelled : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
        if (weights_->Find(p + unmodelled) != nullptr) {
          return absl::UnimplementedError(absl::StrCat("model file: tensor ", p, unmodelled,
                                                       " (q/k LayerNorm) is not supported for ", kArch));
        }
      }
      LayerWeights lw{};
      auto qkv = BindQkv(hp, *weights_, il, q_dim, kv_dim, hidden, QkvBias::kRequired, views_);
      if (!qkv.ok()) return qkv.status();
      lw.qkv = *qkv;
      fused = fused || qkv->fused;
      struct Want {
        const WeightTensor** dst;
        const char* name;
        const Dim& rows;
        const Dim& cols;
        bool f32;
      };
      const Want wants[] = {
          {&lw.norm, "attn_norm.weight", one, hidden, true},  {&lw.norm_b, "attn_norm.bias", one, hidden, true},
          {&lw.wo, "attn_output.weight", hidden, q_dim, false}, {&lw.bo, "attn_output.bias", one, hidden, true},
          {&lw.up, "ffn_up.weight", ffn, hidden, false},       {&lw.up_b, "ffn_up.bias", one, ffn, true},
          {&lw.down, "ffn_down.weight", hidden, ffn, false},   {&lw.down_b, "ffn_down.bias", one, hidden, true},
      };
      for (const Want& want : wants) {
        if (auto s = bind(p + want.name, want.rows, want.cols, want.f32, want.dst); !s.ok()) return s;
      }
      layers_.push_back(lw);
    }
    hash_ = absl::HashOf(std::string(kArch), d.n_layers, d.hidden, d.n_heads, d.n_kv_heads, d.head_dim, d.vocab,
                         cfg_.ffn, cfg_.rot_dims, cfg_.rope_base, cfg_.eps, output_ == tok_embd_, fused);
    return absl::OkStatus();
  }

  Phi2Config cfg_;
  const WeightTensor* tok_embd_ = nullptr;
  const WeightTensor* output_ = nullptr;
  const WeightTensor* output_b_ = nullptr;
  const WeightTensor* output_norm_ = nullptr;
  const WeightTensor* output_norm_b_ = nullptr;
  WeightViews views_;  // fused attn_qkv row ranges
  std::vector<LayerWeights> layers_;
};

absl::StatusOr<std::unique_ptr<DecodeModel>> CreatePhi2(std::shared_ptr<const Weights> weights,
                                                        const FamilyOptions& options) {
  return Phi2::Create(std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("phi2", CreatePhi2);

}  // namespace decoded
