// A worker's executor on a Vulkan device: the timeline semaphore its
// submissions signal (one submission per step, waited for on the host before
// the step's logits are read) and a CPU thread team for the host work beside
// the GPU (sampling the step's rows: Executor::ParallelFor).
//
// Used by one thread at a time (the worker that owns it), like every executor.
#ifndef DECODED_ENGINE_VULKAN_VULKAN_EXECUTOR_H_
#define DECODED_ENGINE_VULKAN_VULKAN_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include <vulkan/vulkan.h>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/vulkan/vulkan_device.h"

namespace decoded::vulkan {

class Executor final : public decoded::Executor {
 public:
  static absl::StatusOr<std::unique_ptr<Executor>> Create(std::shared_ptr<Device> device, int host_threads,
                                                          const std::atomic<int>* lent_threads);
  ~Executor() override;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  std::string_view backend_name() const override { return "vulkan"; }
  int threads() const override { return host_->threads(); }
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t)> fn) override { host_->ParallelFor(n, fn); }

  Device& device() const { return *device_; }
  // Submits `cb` and waits until the device has run it.
  absl::Status SubmitAndWait(VkCommandBuffer cb);

 private:
  Executor() = default;
  std::shared_ptr<Device> device_;
  std::unique_ptr<decoded::Executor> host_;
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  uint64_t value_ = 0;  // the last value submitted
};

}  // namespace decoded::vulkan

#endif  // DECODED_ENGINE_VULKAN_VULKAN_EXECUTOR_H_
