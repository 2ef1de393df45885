// The identity and plan state every family holds, so a family file states
// only its layers: what the driver and the plan key read (family name,
// structural hash, weights, backend, dims, MaskPlan, RopePlan, offset path,
// trained context length) lives here once.
//
// A family fills the protected fields while it loads (before Create returns);
// they are read-only afterwards, so a loaded family is safe to share between
// threads like any DecodeModel.
#ifndef DECODED_MODELS_FAMILY_BASE_H_
#define DECODED_MODELS_FAMILY_BASE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "engine/decode_model.h"
#include "engine/model_registry.h"

namespace decoded {

class FamilyBase : public DecodeModel {
 public:
  const std::string& family() const override { return family_; }
  uint64_t structural_hash() const override { return hash_; }
  const Weights& weights() const override { return *weights_; }
  Backend& backend() const override { return *backend_; }
  const DecodeDims& dims() const override { return dims_; }
  const MaskPlan& mask_plan() const override { return mask_plan_; }
  const RopePlan& rope_plan() const override { return rope_plan_; }
  KvOffsetPath kv_offset_path() const override { return offset_path_; }
  int32_t trained_context_length() const override { return context_length_; }

 protected:
  // `options` may override the backend (default: CPU) and the offset path
  // (default: the family's `default_offset_path`, the device offset unless
  // the family states otherwise).
  FamilyBase(std::string family, std::shared_ptr<const Weights> weights, const FamilyOptions& options,
             KvOffsetPath default_offset_path = KvOffsetPath::kDeviceOffset)
      : family_(std::move(family)),
        weights_(std::move(weights)),
        backend_(options.backend ? options.backend : &CpuBackend()),
        offset_path_(options.kv_offset_path.value_or(default_offset_path)) {}

  const std::string family_;
  const std::shared_ptr<const Weights> weights_;
  Backend* const backend_;
  const KvOffsetPath offset_path_;
  // Set while loading.
  DecodeDims dims_;
  int32_t context_length_ = 0;
  MaskPlan mask_plan_;
  RopePlan rope_plan_;
  uint64_t hash_ = 0;  // everything that shapes the graph, hashed by the family
};

}  // namespace decoded

#endif  // DECODED_MODELS_FAMILY_BASE_H_
