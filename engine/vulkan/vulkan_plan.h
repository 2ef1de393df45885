// A compiled plan on a Vulkan device: the graph lowered to a list of kernel
// dispatches whose push constants hold every address (weights, the plan's
// data-node buffers, its arena, the KV binding table), recorded ONCE into a
// command buffer and resubmitted by every Run. Per-token data changes the
// bytes behind those addresses (the driver's uploads into mapped buffers),
// never the recording: no re-recording, descriptor update or allocation per
// token. Between dispatches a memory barrier orders each kernel's writes
// before the next one's reads; the last makes the arena visible to the host.
//
// What a recording holds and what invalidates it: only addresses that live as
// long as the plan (its arena, constants, control words, the bound input
// buffers and the weights), so nothing does; a plan is rebuilt only when its
// PlanKey changes (engine/decode_session.h).
//
// The symbol KV-offset path (SymEnv::kv_pos) becomes a word array of the
// plan's control buffer that Run copies the host symbols into before the
// submission: a captured plan reads host symbols the only way it can.
#ifndef DECODED_ENGINE_VULKAN_VULKAN_PLAN_H_
#define DECODED_ENGINE_VULKAN_VULKAN_PLAN_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/vulkan/vulkan_device.h"

namespace decoded::vulkan {

// Device copies of weights, uploaded once (vulkan_backend.cc).
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // The device address of `w`'s bytes, uploading them on first use.
  virtual absl::StatusOr<uint64_t> Address(const WeightTensor& w) = 0;
};

struct PlanOptions {
  // Re-record the command buffer on every Run: the control that shows what
  // the held recording saves (tests, benchmarks). Results are the same.
  bool record_every_run = false;
};

// UNIMPLEMENTED naming the first node the kernels cannot run: a weight type
// without a kernel (matmul, get_rows, MoE experts), a quantized weight whose
// columns are not whole 32-element units, attention wider than 1024 per head.
absl::Status CheckGraphSupported(const Graph& graph);

// INVALID_ARGUMENT as CompiledPlan's contract (engine/backend.h) and for an
// input buffer that is not this device's; RESOURCE_EXHAUSTED when the arena
// or constants do not fit; UNIMPLEMENTED as CheckGraphSupported.
absl::StatusOr<std::unique_ptr<CompiledPlan>> CompilePlan(std::shared_ptr<Device> device, WeightStore& weights,
                                                          Graph graph, MemoryPlan plan,
                                                          const PlanResources& resources, const PlanOptions& options);

// Activation rows from which a prefill chunk's matmuls take the tiled
// mat-mat (matmul_tiled.comp) rather than the mat-vec on `device`. A CPU
// device (lavapipe, Gemma 3 270M prefill on 2 vCPUs): 48, where the tiled
// kernel starts to win (0.81x the mat-vec's prefill rate at 32 rows, 1.14x
// at 48, 1.48x at 64). A GPU: 16, not yet measured (llama.cpp's Vulkan
// backend keeps its mat-vec up to 8 columns).
int64_t TiledMatMulMinRows(const Device& device);
// Whether `device` has the shared memory the tiled mat-mat needs.
bool TiledMatMulAvailable(const Device& device);

// Process-wide counts, for tests, benchmarks and metrics.
struct PlanStats {
  int64_t recordings = 0;           // command buffers recorded
  int64_t submissions = 0;          // plan runs submitted
  int64_t dispatches_recorded = 0;  // kernel dispatches written into recordings
  int64_t tiled_matmuls = 0;        // matmuls compiled to the tiled mat-mat (prefill chunks)
};
PlanStats GetPlanStats();

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_VULKAN_PLAN_H_
