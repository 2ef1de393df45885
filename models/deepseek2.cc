// DeepSeek-V2 (HF transformers models/deepseek_v2, DeepseekV2ForCausalLM);
// GGUF names and keys as llama.cpp's deepseek2 architecture writes them
// (conversion/deepseek.py): MLA stored as MQA over the latent, kv_b split per
// head into attn_k_b (k half, transposed) and attn_v_b.
//
// Per layer: x + attn(rmsnorm(x)), then + SwiGLU(rmsnorm(.)). Attention is
// multi-head latent attention (DeepSeek-V2 paper, section 2.1):
//   q        attn_q, or attn_q_a -> RMSNorm attn_q_a_norm -> attn_q_b when
//            attention.q_lora_rank is set; per head [q_nope | q_rope];
//   kv       attn_kv_a_mqa -> [latent (kv_lora_rank) | k_rope (rope dims)];
//            the latent is RMS-normed (attn_kv_a_norm); k_rope is one head
//            shared by all query heads (decoupled RoPE);
//   RoPE     on q_rope and k_rope only, adjacent pairs (HF rotates complex
//            pairs; llama.cpp NORM, nothing permuted);
//   cache    one row per token: [normed latent | rotated k_rope]
//            (KvLayout::SharedLatent), the value being the latent itself;
//   absorbed the up-projections are folded into q and the output instead of
//            expanding the cache: q_lat_h = q_nope_h W_kb_h (so
//            q_lat_h . latent = q_nope_h . k_nope_h), scores
//            [q_lat_h | q_rope_h] . row * 1 / sqrt(qk_nope + qk_rope), the
//            attention output per head is a latent, and W_vb_h maps it to
//            v_head_dim before attn_output.
// FFN: the first leading_dense_block_count layers (HF first_k_dense_replace)
// have a dense SwiGLU (ffn_{gate,up,down}); every later layer is DeepSeekMoE
// (HF DeepseekV2Moe, llama.cpp build_moe_ffn + the shared-expert build_ffn;
// models/moe_ffn.h): routed SwiGLU experts chosen per token (softmax router,
// or sigmoid plus the exp_probs_b selection bias as DeepSeek-V3 writes it;
// group-limited top-k over expert_group_count groups keeping
// expert_group_used_count; weights renormalized when expert_weights_norm,
// then scaled by expert_weights_scale) plus the shared experts'
// dense SwiGLU of expert_shared_count * expert_feed_forward_length, added.
// Only the k selected experts are computed per token.
// YaRN (DeepSeek-V2's 128k models; HF deepseek_v2 with rope_type "yarn"): the
// rope parts rotate with YaRN's frequencies (RopeLayer::yarn) and the softmax
// scale is multiplied by yarn_get_mscale(factor, mscale_all_dim)^2 (see
// ReadScaling below for the keys and the cos/sin factor).
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/decode_model.h"
#include "engine/hparam_bounds.h"
#include "engine/hparams.h"
#include "engine/model_registry.h"
#include "models/family_base.h"
#include "models/fused_weights.h"
#include "models/moe_ffn.h"
#include "models/rope_scaling.h"
#include "models/transformer_dims.h"

namespace decoded {
namespace {

constexpr char kArch[] = "deepseek2";
// The attention kernels accumulate one value row per head on the stack.
constexpr int64_t kMaxKvLoraRank = 1024;

struct Deepseek2Config {
  int32_t ffn = 0;
  int32_t q_lora_rank = 0;  // 0: q projected directly (attn_q)
  int32_t kv_lora_rank = 0;
  int32_t qk_nope = 0;
  int32_t qk_rope = 0;
  int32_t v_head = 0;
  int32_t dense_layers = 0;  // leading_dense_block_count
  MoeFfnConfig moe;          // the layers from dense_layers on
  double rope_base = 10000.0;
  std::optional<YarnScaling> rope_yarn;  // rope.scaling.type = "yarn"
  double rope_attention_factor = 1.0;    // YaRN's cos/sin multiplier
  double softmax_scale_factor = 1.0;     // multiplies 1 / sqrt(qk_nope + qk_rope)
  double eps = 1e-6;
};

struct LayerWeights {
  const WeightTensor *attn_norm, *q, *q_a, *q_a_norm, *q_b, *kv_a, *kv_a_norm, *k_b, *v_b, *wo;
  const WeightTensor *ffn_norm, *gate, *up, *down;  // gate/up/down: dense layers
  MoeFfnWeights moe;                                 // the MoE layers
};

class Deepseek2 final : public FamilyBase {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeModel>> Create(std::shared_ptr<const Weights> weights,
                                                             const FamilyOptions& options) {
    auto m = std::unique_ptr<Deepseek2>(new Deepseek2(std::move(weights), options));
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
    const int32_t heads = dims_.n_heads;
    const float eps = static_cast<float>(cfg_.eps);
    auto mm = [&](const WeightTensor* wt, NodeId x, const char* name) { return g.matmul(g.weight(*wt), x, p + name); };

    const NodeId h = g.rms_norm(in.x, g.weight(*w.attn_norm), eps, p + "attn_norm");
    const NodeId q = w.q != nullptr ? mm(w.q, h, "attn_q")
                                    : mm(w.q_b, g.rms_norm(mm(w.q_a, h, "attn_q_a"), g.weight(*w.q_a_norm), eps,
                                                           p + "attn_q_a_norm"),
                                         "attn_q_b");
    const NodeId q_nope = g.head_slice(q, heads, 0, cfg_.qk_nope, p + "q_nope");
    const NodeId q_rope = in.rope(g.head_slice(q, heads, cfg_.qk_nope, cfg_.qk_rope, p + "q_pe"), heads, p + "rope_q");

    const NodeId kv = mm(w.kv_a, h, "attn_kv_a_mqa");
    const NodeId latent = g.rms_norm(g.head_slice(kv, 1, 0, cfg_.kv_lora_rank, p + "kv_latent"),
                                     g.weight(*w.kv_a_norm), eps, p + "attn_kv_a_norm");
    const NodeId k_rope =
        in.rope(g.head_slice(kv, 1, cfg_.kv_lora_rank, cfg_.qk_rope, p + "k_pe"), 1, p + "rope_k");
    const NodeId k_row = g.head_concat(latent, k_rope, 1, p + "kv_cache_row");

    const NodeId q_lat = g.head_matmul(g.weight(*w.k_b), q_nope, heads, p + "attn_k_b");
    const NodeId q_row = g.head_concat(q_lat, q_rope, heads, p + "q_absorbed");
    const float scale =
        static_cast<float>(cfg_.softmax_scale_factor / std::sqrt(static_cast<double>(cfg_.qk_nope + cfg_.qk_rope)));
    const NodeId o_lat = in.attention(q_row, k_row, kNoNode, {.scale = scale});
    const NodeId o = g.head_matmul(g.weight(*w.v_b), o_lat, heads, p + "attn_v_b");
    const NodeId x1 = g.add(in.x, mm(w.wo, o, "attn_output"), p + "attn_residual");

    const NodeId f = g.rms_norm(x1, g.weight(*w.ffn_norm), eps, p + "ffn_norm");
    if (in.layer >= cfg_.dense_layers) return g.add(x1, BuildMoeFfn(g, f, w.moe, cfg_.moe, p), p + "ffn_residual");
    const NodeId act = g.swiglu(mm(w.gate, f, "ffn_gate"), mm(w.up, f, "ffn_up"), p + "ffn_swiglu");
    return g.add(x1, mm(w.down, act, "ffn_down"), p + "ffn_residual");
  }

  NodeId output_logits(Graph& g, NodeId hidden) const override {
    const NodeId h = g.rms_norm(hidden, g.weight(*output_norm_), static_cast<float>(cfg_.eps), "output_norm");
    return g.matmul(g.weight(*output_), h, "output");
  }

 private:
  Deepseek2(std::shared_ptr<const Weights> weights, const FamilyOptions& options)
      : FamilyBase(kArch, std::move(weights), options) {}

  absl::Status ReadConfig() {
    namespace hb = hparam_bounds;
    HParams hp(*weights_, kArch);
    DecodeDims& d = dims_;
    Deepseek2Config& c = cfg_;
    auto assign = [](auto& dst, auto v) -> absl::Status {
      if (!v.ok()) return v.status();
      dst = *v;
      return absl::OkStatus();
    };
    int32_t key_length = 0, value_length = 0, key_length_mla = 0;
    // Each read may use the ones before it, so they run in order.
    const std::function<absl::Status()> reads[] = {
        [&] { return assign(d.n_layers, hp.LayerCount("block_count")); },
        [&] { return assign(d.hidden, hp.Int("embedding_length", {1, hb::kMaxWidth})); },
        [&] { return assign(c.ffn, hp.Int("feed_forward_length", {1, hb::kMaxWidth})); },
        [&] { return assign(d.n_heads, hp.Int("attention.head_count", {1, hb::kMaxHeads})); },
        // MLA is stored as MQA over the latent: one KV "head".
        [&] { return assign(d.n_kv_heads, hp.IntOr("attention.head_count_kv", 1, {1, 1, "MLA (one latent)"})); },
        [&] { return assign(context_length_, hp.Int("context_length", {1, hb::kMaxContextLength})); },
        [&] {
          return assign(c.eps, hp.Float("attention.layer_norm_rms_epsilon", {hb::kMinNormalFloat32, 1.0}));
        },
        [&] { return assign(c.q_lora_rank, hp.IntOr("attention.q_lora_rank", 0, {0, hb::kMaxWidth})); },
        [&] { return assign(c.kv_lora_rank, hp.Int("attention.kv_lora_rank", {1, kMaxKvLoraRank})); },
        [&] { return assign(c.qk_rope, hp.Int("rope.dimension_count", {2, hb::kMaxHeadDim, "", 2})); },
        // The cached row: latent then k_rope.
        [&] {
          return assign(key_length, hp.Int("attention.key_length", {c.kv_lora_rank + c.qk_rope,
                                                                     c.kv_lora_rank + c.qk_rope,
                                                                     hp.key("attention.kv_lora_rank") + " + " +
                                                                         hp.key("rope.dimension_count")}));
        },
        [&] {
          return assign(value_length, hp.Int("attention.value_length",
                                             {c.kv_lora_rank, c.kv_lora_rank, hp.key("attention.kv_lora_rank")}));
        },
        // Per query head: nope + rope for q.k, v_head_dim for the value.
        [&] {
          return assign(key_length_mla, hp.Int("attention.key_length_mla",
                                               {c.qk_rope + 1, hb::kMaxHeadDim, ""}));
        },
        [&] { return assign(c.v_head, hp.Int("attention.value_length_mla", {1, hb::kMaxHeadDim})); },
        [&] { return assign(c.rope_base, hp.FloatOr("rope.freq_base", 10000.0, {1.0, hb::kMaxFloat32})); },
        [&] { return ReadScaling(hp); },
        [&] {
          return assign(c.dense_layers, hp.IntOr("leading_dense_block_count", 0, {0, d.n_layers,
                                                                                  hp.key("block_count")}));
        },
        // The MoE keys matter only when some layer is MoE (the converter
        // writes expert_feed_forward_length and expert_shared_count always).
        [&]() -> absl::Status {
          if (c.dense_layers == d.n_layers) return absl::OkStatus();
          // llama.cpp's deepseek2 renormalizes only when the file says so.
          return assign(c.moe, ReadMoeFfnConfig(hp, /*default_norm_topk_prob=*/false));
        },
    };
    for (const auto& read : reads) {
      if (absl::Status s = read(); !s.ok()) return s;
    }
    c.qk_nope = key_length_mla - c.qk_rope;
    d.head_dim = key_length;  // the MQA head over the latent, as the file states it
    d.kv = KvLayout::SharedLatent(key_length, value_length);
    auto mp = MaskPlan::Create(std::vector<int32_t>(static_cast<size_t>(d.n_layers), 0));
    if (!mp.ok()) return mp.status();
    mask_plan_ = *std::move(mp);
    // RoPE runs on the rope parts alone: its "head" is qk_rope wide (HF's
    // head_dim, over which YaRN spreads its frequencies too).
    RopeLayer rope{true, c.rope_base, 1.0};
    rope.yarn = c.rope_yarn;
    rope.attention_factor = c.rope_attention_factor;
    auto rp = RopePlan::Create(std::vector<RopeLayer>(static_cast<size_t>(d.n_layers), rope), c.qk_rope,
                               RopePairing::kAdjacent);
    if (!rp.ok()) return rp.status();
    rope_plan_ = *std::move(rp);
    return absl::OkStatus();
  }

  // DeepSeek-V2's 128k models are YaRN (factor 40, original 4096, mscale =
  // mscale_all_dim = 0.707). llama.cpp's converter writes type, factor,
  // original context, the betas, and yarn_log_multiplier = 0.1 *
  // mscale_all_dim (conversion/deepseek.py); mscale itself is not written.
  // HF deepseek_v2 multiplies the softmax scale by
  // yarn_get_mscale(factor, mscale_all_dim)^2 and cos/sin by its
  // attention_factor: the stated yarn_attn_factor, else
  // mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set,
  // else mscale(factor, 1). With yarn_log_multiplier the file is read as
  // mscale == mscale_all_dim (every DeepSeek-V2 config; llama.cpp assumes the
  // same), so cos/sin keep factor 1. Without it (a config without
  // mscale_all_dim) the softmax scale stays and cos/sin take
  // mscale(factor, 1), as HF computes; llama.cpp instead moves that factor
  // squared onto the whole softmax scale, nope parts included. Linear
  // scaling is refused: no DeepSeek-V2 uses it and llama.cpp's deepseek2
  // graph would apply the YaRN mscale to it.
  absl::Status ReadScaling(const HParams& hp) {
    auto scaling = ReadRopeScaling(hp, context_length_);
    if (!scaling.ok()) return scaling.status();
    Deepseek2Config& c = cfg_;
    switch (scaling->type) {
      case RopeScaling::Type::kNone:
        return absl::OkStatus();
      case RopeScaling::Type::kLinear:
        return absl::UnimplementedError(absl::StrCat("model file: linear RoPE scaling (", hp.key("rope.scaling.factor"),
                                                     " = ", scaling->factor, ") is not supported for ", kArch,
                                                     " (only YaRN)"));
      case RopeScaling::Type::kYarn:
        break;
    }
    c.rope_yarn = scaling->yarn;
    const double mscale_all_dim = scaling->yarn_log_multiplier.value_or(0.0) / 0.1;
    if (mscale_all_dim != 0) {
      c.rope_attention_factor = scaling->yarn_attn_factor.value_or(1.0);
      const double m = YarnMscale(scaling->factor, mscale_all_dim);
      c.softmax_scale_factor = m * m;
    } else {
      c.rope_attention_factor = scaling->yarn_attn_factor.value_or(YarnMscale(scaling->factor));
    }
    return absl::OkStatus();
  }

  absl::Status BindWeights() {
    DecodeDims& d = dims_;
    const Deepseek2Config& c = cfg_;
    HParams hp(*weights_, kArch);
    auto bound = BindEmbeddingAndOutput(hp, *weights_, d);
    if (!bound.ok()) return bound.status();
    tok_embd_ = bound->tok_embd;
    output_ = bound->output;
    output_norm_ = bound->output_norm;
    const Dim one{1, "a norm weight"};
    const Dim hidden = hp.dim("embedding_length", d.hidden);
    const Dim heads = hp.dim("attention.head_count", d.n_heads);
    const Dim q_dim = heads * hp.dim("attention.key_length_mla", c.qk_nope + c.qk_rope);
    const Dim q_lora = hp.dim("attention.q_lora_rank", c.q_lora_rank);
    const Dim kv_lora = hp.dim("attention.kv_lora_rank", c.kv_lora_rank);
    const Dim kv_a = hp.dim("attention.key_length", c.kv_lora_rank + c.qk_rope);
    const Dim nope{c.qk_nope, absl::StrCat(hp.key("attention.key_length_mla"), " - ", hp.key("rope.dimension_count"),
                                           " = ", c.qk_nope)};
    const Dim v_head = hp.dim("attention.value_length_mla", c.v_head);
    const Dim ffn = hp.dim("feed_forward_length", c.ffn);

    auto bind = [&](const std::string& name, const Dim& rows, const Dim& cols, bool f32,
                    const WeightTensor** dst) -> absl::Status {
      auto t = hp.Tensor(name, rows, cols);
      if (!t.ok()) return t.status();
      if (f32 && (*t)->type != DType::kF32) {
        return absl::UnimplementedError(
            absl::StrCat("tensor ", name, ": norm weights must be f32, got ", DTypeName((*t)->type)));
      }
      *dst = *t;
      return absl::OkStatus();
    };
    if (output_norm_->type != DType::kF32) {
      return absl::UnimplementedError("tensor output_norm.weight: norm weights must be f32");
    }
    for (int32_t il = 0; il < d.n_layers; ++il) {
      const std::string p = absl::StrCat("blk.", il, ".");
      // A layer's FFN is dense or MoE as leading_dense_block_count says;
      // the other kind's tensors would be silently unused.
      const bool moe_layer = il >= c.dense_layers;
      static constexpr const char* kDenseFfn[] = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
      static constexpr const char* kMoeFfn[] = {
          "ffn_gate_inp.weight",   "ffn_gate_exps.weight", "ffn_up_exps.weight",    "ffn_down_exps.weight",
          "ffn_gate_shexp.weight", "ffn_up_shexp.weight",  "ffn_down_shexp.weight", "exp_probs_b.bias"};
      for (const char* other : moe_layer ? absl::MakeConstSpan(kDenseFfn) : absl::MakeConstSpan(kMoeFfn)) {
        if (weights_->Find(p + other) != nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model file: tensor ", p, other, " in a ", moe_layer ? "mixture-of-experts" : "dense", " layer (",
              hp.key("leading_dense_block_count"), " = ", c.dense_layers, ")"));
        }
      }
      for (const char* unmodelled : {"attn_q_a.bias", "attn_kv_a_mqa.bias", "attn_output.bias", "attn_q.bias"}) {
        if (weights_->Find(p + unmodelled) != nullptr) {
          return absl::UnimplementedError(absl::StrCat("model file: tensor ", p, unmodelled,
                                                       " (attention bias) is not supported for ", kArch));
        }
      }
      if (weights_->Find(p + "attn_kv_b.weight") != nullptr && weights_->Find(p + "attn_k_b.weight") == nullptr) {
        return absl::UnimplementedError(absl::StrCat("model file: tensor ", p,
                                                     "attn_kv_b.weight without attn_k_b / attn_v_b (a file from a "
                                                     "converter that did not split kv_b) is not supported for ",
                                                     kArch, "; reconvert it"));
      }
      LayerWeights lw{};
      struct Want {
        const WeightTensor** dst;
        std::string name;
        Dim rows;
        Dim cols;
        bool f32;
      };
      std::vector<Want> wants = {
          {&lw.attn_norm, "attn_norm.weight", one, hidden, true},
          {&lw.kv_a, "attn_kv_a_mqa.weight", kv_a, hidden, false},
          {&lw.kv_a_norm, "attn_kv_a_norm.weight", one, kv_lora, true},
          {&lw.wo, "attn_output.weight", hidden, heads * v_head, false},
          {&lw.ffn_norm, "ffn_norm.weight", one, hidden, true},
      };
      if (!moe_layer) {
        wants.push_back({&lw.gate, "ffn_gate.weight", ffn, hidden, false});
        wants.push_back({&lw.up, "ffn_up.weight", ffn, hidden, false});
        wants.push_back({&lw.down, "ffn_down.weight", hidden, ffn, false});
      }
      if (c.q_lora_rank > 0) {
        if (weights_->Find(p + "attn_q.weight") != nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("model file: tensor ", p, "attn_q.weight beside ",
                                                         hp.key("attention.q_lora_rank"), " = ", c.q_lora_rank,
                                                         " (q is either direct or low-rank)"));
        }
        wants.push_back({&lw.q_a, "attn_q_a.weight", q_lora, hidden, false});
        wants.push_back({&lw.q_a_norm, "attn_q_a_norm.weight", one, q_lora, true});
        wants.push_back({&lw.q_b, "attn_q_b.weight", q_dim, q_lora, false});
      } else {
        if (weights_->Find(p + "attn_q_a.weight") != nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("model file: tensor ", p, "attn_q_a.weight without ",
                                                         hp.key("attention.q_lora_rank")));
        }
        wants.push_back({&lw.q, "attn_q.weight", q_dim, hidden, false});
      }
      // attn_k_b [heads, kv_lora, nope] and attn_v_b [heads, v_head, kv_lora]:
      // one plane per head, read by head_matmul as the planes' rows stacked.
      for (auto [dst, name, rows, cols] : {std::tuple{&lw.k_b, "attn_k_b.weight", kv_lora, nope},
                                           std::tuple{&lw.v_b, "attn_v_b.weight", v_head, kv_lora}}) {
        auto t = hp.Tensor3(p + std::string(name), heads, rows, cols);
        if (!t.ok()) return t.status();
        WeightTensor stacked = **t;
        stacked.rows *= stacked.planes;
        stacked.planes = 1;
        *dst = views_.Add(std::move(stacked));
      }
      for (const Want& want : wants) {
        if (auto s = bind(p + want.name, want.rows, want.cols, want.f32, want.dst); !s.ok()) return s;
      }
      if (moe_layer) {
        auto moe = BindMoeFfn(hp, *weights_, il, c.moe, hidden);
        if (!moe.ok()) return moe.status();
        lw.moe = *moe;
      }
      layers_.push_back(lw);
    }
    hash_ = absl::HashOf(std::string(kArch), d.n_layers, d.hidden, d.n_heads, d.vocab, c.ffn, c.q_lora_rank,
                         c.kv_lora_rank, c.qk_nope, c.qk_rope, c.v_head, c.rope_base, c.rope_yarn.has_value(),
                         c.rope_yarn.value_or(YarnScaling{}), c.rope_attention_factor, c.softmax_scale_factor, c.eps,
                         output_ == tok_embd_, c.dense_layers, c.dense_layers < d.n_layers ? c.moe : MoeFfnConfig{});
    return absl::OkStatus();
  }

  Deepseek2Config cfg_;
  const WeightTensor* tok_embd_ = nullptr;
  const WeightTensor* output_ = nullptr;
  const WeightTensor* output_norm_ = nullptr;
  WeightViews views_;  // the stacked per-head attn_k_b / attn_v_b
  std::vector<LayerWeights> layers_;
};

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateDeepseek2(std::shared_ptr<const Weights> weights,
                                                             const FamilyOptions& options) {
  return Deepseek2::Create(std::move(weights), options);
}

}  // namespace

DECODED_REGISTER_FAMILY("deepseek2", CreateDeepseek2);

}  // namespace decoded
