// The model an in-process bench runs, loaded as the daemon loads it.
#ifndef DECODED_BENCH_BENCH_MODEL_H_
#define DECODED_BENCH_BENCH_MODEL_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cpu_isa.h"
#include "engine/device_spec.h"
#include "engine/kv_layout.h"
#include "engine/runtime.h"

namespace decoded::bench {

// The CPU's kernel tier from the environment (DECODED_CPU_ISA), the backend
// `device` names (--device: cpu, vulkan or vulkan:N) and KV caches of the type
// `kv_type` names (--kv_type), then the GGUF file at `path`. The error's
// message starts with what failed ("cpu isa", "--device", "--kv_type", "model").
inline absl::StatusOr<std::shared_ptr<const Model>> LoadBenchModel(const std::string& path, std::string_view device,
                                                                   std::string_view kv_type) {
  auto failed = [](std::string_view what, const absl::Status& st) {
    return absl::Status(st.code(), std::string(what) + ": " + std::string(st.message()));
  };
  if (absl::Status isa = InitCpuIsaFromEnvironment(); !isa.ok()) return failed("cpu isa", isa);
  absl::StatusOr<std::shared_ptr<Backend>> backend = OpenBackend(device);
  if (!backend.ok()) return failed("--device", backend.status());
  const absl::StatusOr<DType> type = KvTypeFromName(kv_type);
  if (!type.ok()) return failed("--kv_type", type.status());
  ModelLoadOptions load;
  load.backend = *std::move(backend);
  load.kv_type = *type;
  absl::StatusOr<std::shared_ptr<const Model>> model = Model::Load(path, load);
  if (!model.ok()) return failed("model", model.status());
  return model;
}

}  // namespace decoded::bench

#endif  // DECODED_BENCH_BENCH_MODEL_H_
