// A DecodeModel that delegates everything to a real family but substitutes
// its MaskPlan and/or RopePlan: the "deliberately broken" variants the
// reference tests use to show their tolerances catch real bugs (a window off
// by one, local/global RoPE bases swapped, no sliding window).
#ifndef DECODED_TESTS_COMMON_PLAN_OVERRIDE_MODEL_H_
#define DECODED_TESTS_COMMON_PLAN_OVERRIDE_MODEL_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/decode_model.h"

namespace decoded::testing {

class PlanOverrideModel final : public DecodeModel {
 public:
  PlanOverrideModel(const DecodeModel& base, std::optional<MaskPlan> mask, std::optional<RopePlan> rope)
      : base_(base), mask_(std::move(mask)), rope_(std::move(rope)) {}

  // The base model with every layer's RoPE variant swapped for the other one
  // (requires exactly two variants, e.g. Gemma 3's local and global bases).
  static PlanOverrideModel SwappedRopeBases(const DecodeModel& base) {
    const RopePlan& rp = base.rope_plan();
    std::vector<RopeLayer> layers;
    for (int32_t il = 0; il < base.dims().n_layers; ++il) layers.push_back(rp.variant(1 - rp.variant_of(il)));
    return PlanOverrideModel(base, std::nullopt,
                             *RopePlan::Create(layers, rp.head_dim(), rp.pairing(), rp.rot_dims()));
  }

  // The base model with the other RoPE pairing (NeoX <-> adjacent).
  static PlanOverrideModel OtherRopePairing(const DecodeModel& base) {
    const RopePlan& rp = base.rope_plan();
    std::vector<RopeLayer> layers;
    for (int32_t il = 0; il < base.dims().n_layers; ++il) {
      const int32_t v = rp.variant_of(il);
      layers.push_back(v < 0 ? RopeLayer{false, 0, 0} : rp.variant(v));
    }
    const RopePairing other =
        rp.pairing() == RopePairing::kNeox ? RopePairing::kAdjacent : RopePairing::kNeox;
    return PlanOverrideModel(base, std::nullopt, *RopePlan::Create(layers, rp.head_dim(), other, rp.rot_dims()));
  }

  // The base model rotating whole heads (its partial rotary ignored).
  static PlanOverrideModel FullRotary(const DecodeModel& base) {
    const RopePlan& rp = base.rope_plan();
    return PlanOverrideModel(base, std::nullopt,
                             *RopePlan::Create(Layers(base), rp.head_dim(), rp.pairing(), rp.head_dim()));
  }

  // The base model with RoPE on every layer, its NoPE layers included (all
  // with variant 0's base and scale).
  static PlanOverrideModel RopeOnEveryLayer(const DecodeModel& base) {
    const RopePlan& rp = base.rope_plan();
    const std::vector<RopeLayer> layers(static_cast<size_t>(base.dims().n_layers), rp.variant(0));
    return PlanOverrideModel(base, std::nullopt,
                             *RopePlan::Create(layers, rp.head_dim(), rp.pairing(), rp.rot_dims()));
  }

  const std::string& family() const override { return base_.family(); }
  uint64_t structural_hash() const override { return base_.structural_hash() ^ 1; }
  const Weights& weights() const override { return base_.weights(); }
  Backend& backend() const override { return base_.backend(); }
  int32_t trained_context_length() const override { return base_.trained_context_length(); }
  const DecodeDims& dims() const override { return base_.dims(); }
  const MaskPlan& mask_plan() const override { return mask_ ? *mask_ : base_.mask_plan(); }
  const RopePlan& rope_plan() const override { return rope_ ? *rope_ : base_.rope_plan(); }
  NodeId embed(Graph& g, NodeId ids) const override { return base_.embed(g, ids); }
  NodeId decode_apply_layer(const DecodeLayerInputs& in) const override { return base_.decode_apply_layer(in); }
  NodeId output_logits(Graph& g, NodeId h) const override { return base_.output_logits(g, h); }
  KvOffsetPath kv_offset_path() const override { return base_.kv_offset_path(); }

 private:
  // The base model's per-layer RoPE entries (NoPE layers disabled).
  static std::vector<RopeLayer> Layers(const DecodeModel& base) {
    const RopePlan& rp = base.rope_plan();
    std::vector<RopeLayer> layers;
    for (int32_t il = 0; il < base.dims().n_layers; ++il) {
      const int32_t v = rp.variant_of(il);
      layers.push_back(v < 0 ? RopeLayer{false, 0, 0} : rp.variant(v));
    }
    return layers;
  }

  const DecodeModel& base_;
  std::optional<MaskPlan> mask_;
  std::optional<RopePlan> rope_;
};

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_PLAN_OVERRIDE_MODEL_H_
