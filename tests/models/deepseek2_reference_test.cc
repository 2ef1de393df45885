// deepseek2 (multi-head latent attention, dense and DeepSeekMoE FFN)
// through the shared driver, against Hugging Face transformers on tiny
// random-weight models (fixtures: tools/make_deepseek2_fixtures.py):
// deepseek2_tiny has the low-rank q path (q_lora_rank 24),
// deepseek2lite_tiny the direct q, both dense; deepseek2moe_tiny
// (DeepseekV2ForCausalLM) and deepseek3_tiny (DeepseekV3ForCausalLM) add
// MoE layers after a dense one (their routing: deepseek2_moe_test). Logits
// are compared over the whole prompt (D1, all rows) and every decode step
// (D2), teacher-forced with HF's tokens. Broken variants exceed the
// tolerance: the other RoPE pairing, and on the dense fixtures RoPE applied
// to the nope parts instead of the decoupled rope parts, the kv latent left
// un-normed. D2 equals D1
// byte for byte, both KV-write offset paths agree, a session builds its
// graph once, and the KV cache holds the latent: (kv_lora_rank +
// qk_rope_head_dim) floats per token and layer.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine_counters.h"
#include "engine/graph/optimizer.h"
#include "gtest/gtest.h"
#include "tests/common/hf_reference.h"
#include "tests/common/plan_override_model.h"

namespace decoded {
namespace {

namespace wt = ::decoded::testing;

// Measured max |ours - HF| (printed by LogitsMatchTransformersWithinTolerance):
// see docs/families.md; the broken variants miss by orders of magnitude more.
constexpr double kTolerance = 5e-5;

class Deepseek2ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Deepseek2ReferenceTest, LogitsMatchTransformersWithinTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  EXPECT_EQ(f.model->family(), "deepseek2");
  const double err = wt::MaxAbsErrorVsHf(*f.model, f.ref);
  std::printf("[ measured ] %s: max |ours - HF| = %.3g over %zu prompt rows + %zu decode steps\n", GetParam().c_str(),
              err, f.ref["prompt_ids"].size(), f.ref["decode_ids"].size());
  EXPECT_LT(err, kTolerance);
}

TEST_P(Deepseek2ReferenceTest, OtherRopePairingExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  wt::PlanOverrideModel broken = wt::PlanOverrideModel::OtherRopePairing(*f.model);
  ASSERT_NE(broken.rope_plan().pairing(), f.model->rope_plan().pairing());
  const double err = wt::MaxAbsErrorVsHf(broken, f.ref);
  std::printf("[ measured ] %s with the other RoPE pairing: max err %.6g\n", GetParam().c_str(), err);
  EXPECT_GT(err, 10 * kTolerance);
}

// The cache holds one latent row per token and layer, not per-head K and V.
TEST_P(Deepseek2ReferenceTest, KvCacheHoldsTheCompressedLatent) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const auto& cfg = f.ref["config"];
  const int64_t kv_lora = cfg["kv_lora_rank"].get<int64_t>(), rope = cfg["qk_rope_head_dim"].get<int64_t>();
  const int64_t heads = cfg["num_attention_heads"].get<int64_t>(), nope = cfg["qk_nope_head_dim"].get<int64_t>();
  const int64_t v_head = cfg["v_head_dim"].get<int64_t>(), layers = cfg["num_hidden_layers"].get<int64_t>();
  const KvLayout kl = f.model->dims().kv_layout();
  EXPECT_EQ(kl, KvLayout::SharedLatent(static_cast<int32_t>(kv_lora + rope), static_cast<int32_t>(kv_lora)));
  constexpr int32_t kCapacity = 40;
  auto kv = KvCache::Create(f.model->backend(), f.model->dims().n_layers, kl, kCapacity);
  ASSERT_TRUE(kv.ok()) << kv.status();
  const int64_t per_token = (*kv)->bytes() / kCapacity;
  EXPECT_EQ(per_token, (kv_lora + rope) * 4 * layers);
  EXPECT_EQ((*kv)->v(0), nullptr);
  // What HF's expanded K and V (per head: nope + rope, and v_head) would take.
  const int64_t expanded = heads * (nope + rope + v_head) * 4 * layers;
  std::printf("[ measured ] %s KV bytes per token: %lld latent vs %lld expanded per-head K/V (%.2fx)\n",
              GetParam().c_str(), static_cast<long long>(per_token), static_cast<long long>(expanded),
              static_cast<double>(expanded) / static_cast<double>(per_token));
  EXPECT_LT(per_token, expanded);
}

TEST_P(Deepseek2ReferenceTest, HeldPlanIsByteIdenticalToRebuildAndBuildsOnce) {
  wt::ExpectHeldPlanEqualsRebuildWithOneBuild(wt::LoadHfFixture(GetParam()), /*n=*/12);
}

TEST_P(Deepseek2ReferenceTest, DeviceOffsetAndSymbolPathsGiveIdenticalLogits) {
  wt::HfFixture dev = wt::LoadHfFixture(GetParam(), KvOffsetPath::kDeviceOffset);
  wt::HfFixture sym = wt::LoadHfFixture(GetParam(), KvOffsetPath::kSymbol);
  ASSERT_NE(dev.model, nullptr);
  ASSERT_NE(sym.model, nullptr);
  ASSERT_EQ(dev.model->kv_offset_path(), KvOffsetPath::kDeviceOffset);
  ASSERT_EQ(sym.model->kv_offset_path(), KvOffsetPath::kSymbol);
  CpuExecutor ex(2);
  const DecodeModel& m = *dev.model;
  auto kv_d = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), 32);
  auto kv_s = *KvCache::Create(m.backend(), m.dims().n_layers, m.dims().kv_layout(), 32);
  DecodeSession sd, ss;
  const std::vector<float> a = wt::DecodeSteps(*dev.model, *kv_d, sd, ex, 1, 12, true);
  const std::vector<float> b = wt::DecodeSteps(*sym.model, *kv_s, ss, ex, 1, 12, true);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 12u * m.dims().vocab);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  drop_decode_session(sd);
  drop_decode_session(ss);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Deepseek2ReferenceTest,
                         ::testing::Values("deepseek2", "deepseek2lite", "deepseek2moe", "deepseek3"),
                         [](const auto& info) { return info.param; });

// The MLA layer rebuilt here from the weights by name (absorbed, as the
// family builds it), faithfully or with one deliberate fault; embedding,
// plans, cache layout and output are the real family's.
enum class Fault { kNone, kRopeOnNopeParts, kNoKvLatentNorm };

class RebuiltMlaLayer final : public DecodeModel {
 public:
  RebuiltMlaLayer(const DecodeModel& base, const nlohmann::json& cfg, Fault fault)
      : base_(base), fault_(fault), heads_(cfg["num_attention_heads"]), nope_(cfg["qk_nope_head_dim"]),
        rope_(cfg["qk_rope_head_dim"]), kv_lora_(cfg["kv_lora_rank"]), eps_(cfg["rms_norm_eps"].get<float>()) {}

  NodeId decode_apply_layer(const DecodeLayerInputs& in) const override {
    Graph& g = in.graph;
    const std::string p = absl::StrCat("blk.", in.layer, ".");
    auto w = [&](const std::string& name) {
      // 3-D weights (attn_k_b, attn_v_b: one plane per head) are read by
      // head_matmul as their planes' rows stacked, as the family binds them.
      WeightTensor t = *base_.weights().Find(p + name + ".weight");
      t.rows *= t.planes;
      t.planes = 1;
      return g.weight(stacked_.emplace_back(std::move(t)));
    };
    auto mm = [&](const std::string& t, NodeId x) { return g.matmul(w(t), x, p + t); };
    const NodeId h = g.rms_norm(in.x, w("attn_norm"), eps_, p + "attn_norm");
    const NodeId q = base_.weights().Find(p + "attn_q.weight") != nullptr
                         ? mm("attn_q", h)
                         : mm("attn_q_b", g.rms_norm(mm("attn_q_a", h), w("attn_q_a_norm"), eps_, p + "q_a_norm"));
    NodeId q_nope = g.head_slice(q, heads_, 0, nope_, p + "q_nope");
    NodeId q_pe = g.head_slice(q, heads_, nope_, rope_, p + "q_pe");
    const NodeId kv = mm("attn_kv_a_mqa", h);
    NodeId latent = g.head_slice(kv, 1, 0, kv_lora_, p + "kv_latent");
    if (fault_ != Fault::kNoKvLatentNorm) latent = g.rms_norm(latent, w("attn_kv_a_norm"), eps_, p + "kv_a_norm");
    NodeId k_pe = g.head_slice(kv, 1, kv_lora_, rope_, p + "k_pe");
    if (fault_ == Fault::kRopeOnNopeParts) {
      // The rotation lands on the first rope-width of each q nope part and of
      // the latent; the rope parts pass unrotated.
      q_nope = g.head_concat(in.rope(g.head_slice(q_nope, heads_, 0, rope_, p + "a"), heads_, p + "rq"),
                             g.head_slice(q_nope, heads_, rope_, nope_ - rope_, p + "b"), heads_, p + "q_nope_rot");
      latent = g.head_concat(in.rope(g.head_slice(latent, 1, 0, rope_, p + "c"), 1, p + "rk"),
                             g.head_slice(latent, 1, rope_, kv_lora_ - rope_, p + "d"), 1, p + "latent_rot");
    } else {
      q_pe = in.rope(q_pe, heads_, p + "rope_q");
      k_pe = in.rope(k_pe, 1, p + "rope_k");
    }
    const NodeId k_row = g.head_concat(latent, k_pe, 1, p + "k_row");
    const NodeId q_row = g.head_concat(g.head_matmul(w("attn_k_b"), q_nope, heads_, p + "k_b"), q_pe, heads_,
                                       p + "q_row");
    const float scale = 1.0f / std::sqrt(static_cast<float>(nope_ + rope_));
    const NodeId o = g.head_matmul(w("attn_v_b"), in.attention(q_row, k_row, kNoNode, {.scale = scale}), heads_,
                                   p + "v_b");
    const NodeId x1 = g.add(in.x, mm("attn_output", o), p + "attn_residual");
    const NodeId f = g.rms_norm(x1, w("ffn_norm"), eps_, p + "ffn_norm");
    return g.add(x1, mm("ffn_down", g.swiglu(mm("ffn_gate", f), mm("ffn_up", f), p + "swiglu")), p + "ffn_residual");
  }

  const std::string& family() const override { return base_.family(); }
  uint64_t structural_hash() const override { return base_.structural_hash() ^ (7 + static_cast<uint64_t>(fault_)); }
  const Weights& weights() const override { return base_.weights(); }
  Backend& backend() const override { return base_.backend(); }
  int32_t trained_context_length() const override { return base_.trained_context_length(); }
  const DecodeDims& dims() const override { return base_.dims(); }
  const MaskPlan& mask_plan() const override { return base_.mask_plan(); }
  const RopePlan& rope_plan() const override { return base_.rope_plan(); }
  NodeId embed(Graph& g, NodeId ids) const override { return base_.embed(g, ids); }
  NodeId output_logits(Graph& g, NodeId h) const override { return base_.output_logits(g, h); }
  KvOffsetPath kv_offset_path() const override { return base_.kv_offset_path(); }

 private:
  const DecodeModel& base_;
  const Fault fault_;
  const int32_t heads_, nope_, rope_, kv_lora_;
  const float eps_;
  mutable std::deque<WeightTensor> stacked_;  // views the graphs refer to (a deque keeps them in place)
};

class Deepseek2BrokenVariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Deepseek2BrokenVariantTest, RebuiltLayerMatchesAndEachFaultExceedsTolerance) {
  wt::HfFixture f = wt::LoadHfFixture(GetParam());
  ASSERT_NE(f.model, nullptr);
  const nlohmann::json& cfg = f.ref["config"];
  ASSERT_GE(cfg["qk_nope_head_dim"].get<int>(), cfg["qk_rope_head_dim"].get<int>());
  const double faithful = wt::MaxAbsErrorVsHf(RebuiltMlaLayer(*f.model, cfg, Fault::kNone), f.ref);
  EXPECT_LT(faithful, kTolerance);
  const double nope_rope = wt::MaxAbsErrorVsHf(RebuiltMlaLayer(*f.model, cfg, Fault::kRopeOnNopeParts), f.ref);
  const double no_norm = wt::MaxAbsErrorVsHf(RebuiltMlaLayer(*f.model, cfg, Fault::kNoKvLatentNorm), f.ref);
  std::printf("[ measured ] %s rebuilt: %.3g; RoPE on the nope parts: %.6g; kv latent not normed: %.6g\n",
              GetParam().c_str(), faithful, nope_rope, no_norm);
  EXPECT_GT(nope_rope, 10 * kTolerance);
  EXPECT_GT(no_norm, 10 * kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Deepseek2BrokenVariantTest, ::testing::Values("deepseek2", "deepseek2lite"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace decoded
