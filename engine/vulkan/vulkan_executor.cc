#include "engine/vulkan/vulkan_executor.h"

#include "engine/runtime.h"

namespace decoded::vulkan {

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(std::shared_ptr<Device> device, int host_threads,
                                                           const std::atomic<int>* lent_threads) {
  std::unique_ptr<Executor> e(new Executor());
  e->device_ = std::move(device);
  e->host_ = CreateCpuExecutor(host_threads < 1 ? 1 : host_threads, lent_threads);
  VkSemaphoreTypeCreateInfo ti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  ti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  ti.initialValue = 0;
  VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  si.pNext = &ti;
  if (auto s = e->device_->Check(vkCreateSemaphore(e->device_->device(), &si, nullptr, &e->timeline_),
                                 "vkCreateSemaphore");
      !s.ok()) {
    return s;
  }
  return e;
}

Executor::~Executor() {
  if (timeline_ != VK_NULL_HANDLE) {
    // A failed wait leaves nothing to do here: the device is lost and the
    // semaphore goes with it.
    (void)device_->Wait(timeline_, value_);
    vkDestroySemaphore(device_->device(), timeline_, nullptr);
  }
}

absl::Status Executor::SubmitAndWait(VkCommandBuffer cb) {
  if (auto s = device_->Submit(cb, timeline_, value_ + 1); !s.ok()) return s;
  ++value_;
  return device_->Wait(timeline_, value_);
}

}  // namespace decoded::vulkan
