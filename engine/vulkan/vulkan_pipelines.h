// The compute pipelines of one device: one pipeline layout (push constants
// only, kernels.h) and a pipeline per kernel, created on first use and kept
// for the device's life (lavapipe compiles each SPIR-V module to machine
// code, so a pipeline is built once per process, not once per plan).
// Thread-safe.
#ifndef DECODED_ENGINE_VULKAN_VULKAN_PIPELINES_H_
#define DECODED_ENGINE_VULKAN_VULKAN_PIPELINES_H_

#include <array>

#include <vulkan/vulkan.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/vulkan/kernels.h"

namespace decoded::vulkan {

class Device;

class Pipelines {
 public:
  explicit Pipelines(Device& device) : device_(device) {}
  ~Pipelines();
  Pipelines(const Pipelines&) = delete;
  Pipelines& operator=(const Pipelines&) = delete;

  // The layout every kernel's pipeline uses.
  absl::StatusOr<VkPipelineLayout> Layout();
  absl::StatusOr<VkPipeline> Get(Kernel k);

 private:
  absl::StatusOr<VkPipelineLayout> LayoutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Device& device_;
  absl::Mutex mu_;
  VkPipelineLayout layout_ ABSL_GUARDED_BY(mu_) = VK_NULL_HANDLE;
  std::array<VkPipeline, static_cast<size_t>(Kernel::kCount)> pipelines_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_VULKAN_PIPELINES_H_
