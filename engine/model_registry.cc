#include "engine/model_registry.h"

#include <map>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace decoded {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, FamilyFactory> factories ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

bool RegisterFamily(const std::string& architecture, FamilyFactory factory) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.factories[architecture] = std::move(factory);
  return true;
}

std::vector<std::string> RegisteredFamilies() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<DecodeModel>> CreateFamily(std::shared_ptr<const Weights> weights,
                                                          const FamilyOptions& options) {
  auto arch = weights->file().GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  FamilyFactory factory;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    auto it = r.factories.find(*arch);
    if (it == r.factories.end()) {
      std::vector<std::string> names;
      for (const auto& [name, f] : r.factories) names.push_back(name);
      return absl::UnimplementedError("model architecture '" + *arch + "' is not supported (supported: " +
                                      absl::StrJoin(names, ", ") + ")");
    }
    factory = it->second;
  }
  return factory(std::move(weights), options);
}

}  // namespace decoded
