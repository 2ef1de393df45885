// Name -> factory table of model families. Each family registers itself from
// its own file (models/<family>.cc) with DECODED_REGISTER_FAMILY; nothing
// under engine/ switches over family names.
#ifndef DECODED_ENGINE_MODEL_REGISTRY_H_
#define DECODED_ENGINE_MODEL_REGISTRY_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/decode_model.h"
#include "engine/weights.h"

namespace decoded {

struct FamilyOptions {
  Backend* backend = nullptr;                   // default: CpuBackend()
  std::optional<KvOffsetPath> kv_offset_path;   // override the family's choice (tests)
};

using FamilyFactory =
    std::function<absl::StatusOr<std::unique_ptr<DecodeModel>>(std::shared_ptr<const Weights>, const FamilyOptions&)>;

// Registers `architecture` (the GGUF general.architecture value). Returns true
// so it can initialise a static.
bool RegisterFamily(const std::string& architecture, FamilyFactory factory);

// Builds the family named by the file's general.architecture.
// UNIMPLEMENTED (listing the known families) for an unknown architecture;
// the family's own INVALID_ARGUMENT / NOT_FOUND for bad hyper-parameters or
// missing tensors.
absl::StatusOr<std::unique_ptr<DecodeModel>> CreateFamily(std::shared_ptr<const Weights> weights,
                                                          const FamilyOptions& options = {});

std::vector<std::string> RegisteredFamilies();

}  // namespace decoded

#define DECODED_REGISTER_FAMILY(arch, factory) \
  [[maybe_unused]] static const bool decoded_family_registered_##factory = ::decoded::RegisterFamily(arch, factory)

#endif  // DECODED_ENGINE_MODEL_REGISTRY_H_
