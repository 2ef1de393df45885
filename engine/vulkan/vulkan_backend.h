// The Vulkan compute backend (docs/vulkan.md): decode and prefill plans on any
// Vulkan 1.2 device with buffer device addresses — NVIDIA, AMD and Intel GPUs,
// and Mesa's lavapipe, the CPU implementation CI proves the kernels on.
//
// A backend serves ONE model: it holds the device copies of that model's
// weights (uploaded once, as the GGUF's quantized bytes) keyed by the host
// bytes' address, so the model's weights must outlive it (Model::Load keeps
// them together). Buffers, plans and executors it makes keep the device
// alive. Thread-safe.
#ifndef DECODED_ENGINE_VULKAN_VULKAN_BACKEND_H_
#define DECODED_ENGINE_VULKAN_VULKAN_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/vulkan/vulkan_device.h"
#include "engine/vulkan/vulkan_plan.h"

namespace decoded::vulkan {

struct BackendOptions {
  PlanOptions plan;
};

std::unique_ptr<Backend> CreateBackend(std::shared_ptr<Device> device, const BackendOptions& options = {});

// Bytes of weights a backend uploaded (all backends of the process, live).
int64_t UploadedWeightBytes();
// Bytes Backend::Upload wrote (per-token data, KV tables, D1 constants), all
// backends of the process, ever: what a step costs in host-to-device writes.
int64_t UploadedDataBytes();

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_VULKAN_BACKEND_H_
